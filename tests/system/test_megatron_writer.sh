#!/usr/bin/env bash
# Megatron-LM's indexed datasets as Megatron itself writes them: megatron-core's own writer
# (megatron/core/datasets/indexed_dataset.py, IndexedDatasetBuilder, from the megatron-core wheel that
# scripts/deps.sh test puts in .deps/wheels) writes uint16 and int32 datasets of random documents; the
# engine must train on them to the losses of the same token stream as a packed-binary shard, and their
# .idx must equal byte for byte the layout docs/data.md describes (which test_data_formats.sh writes).
# The writer's module is loaded from the wheel with stand-ins for what its writing path never calls
# (torch, which it names only in type hints, and megatron.core's logging and object-store helpers), so
# the test needs neither torch nor a GPU.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

whl=$(ls .deps/wheels/megatron_core-*.whl 2>/dev/null | tail -n 1)
check "megatron-core's wheel is in .deps/wheels (scripts/deps.sh test fetches it)" '[ -n "$whl" ]'
if [ -n "$whl" ]; then
  PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} python3 - "$whl" "$tmp" <<'PY' >"$tmp/writer.log" 2>&1
import os, random, struct, sys, types, zipfile
import numpy
whl, d = sys.argv[1], sys.argv[2]
# stand-ins for the imports of indexed_dataset.py that its writer does not use
torch = types.ModuleType("torch"); torch.Tensor = object
torch.utils = types.SimpleNamespace(data=types.SimpleNamespace(Dataset=object))
sys.modules["torch"] = torch
for name in ("megatron", "megatron.core", "megatron.core.datasets"):
    m = types.ModuleType(name); m.__path__ = []; sys.modules[name] = m
osu = types.ModuleType("megatron.core.datasets.object_storage_utils")
class _Stub:  # the object-store helpers: any name it imports (local paths never reach them)
    def __init__(self, *a, **k): pass
osu.__getattr__ = lambda name: _Stub
sys.modules[osu.__name__] = osu
msc = types.ModuleType("megatron.core.msc_utils")
class MultiStorageClientFeature:
    @staticmethod
    def is_enabled(): return False
msc.MultiStorageClientFeature = MultiStorageClientFeature
sys.modules[msc.__name__] = msc
utils = types.ModuleType("megatron.core.utils"); utils.log_single_rank = lambda *a, **k: None
sys.modules[utils.__name__] = utils
src = zipfile.ZipFile(whl).read("megatron/core/datasets/indexed_dataset.py").decode()
mod = types.ModuleType("megatron.core.datasets.indexed_dataset")
exec(compile(src, "indexed_dataset.py", "exec"), mod.__dict__)

class Item:  # what add_item reads of a tensor: .numpy()
    def __init__(self, a): self.a = a
    def numpy(self): return self.a

random.seed(11)
docs = [[random.randrange(2, 512) for _ in range(random.randrange(20, 200))] + [1] for _ in range(120)]
for sub, dtype in (("u16", numpy.uint16), ("i32", numpy.int32)):
    os.makedirs(os.path.join(d, sub))
    prefix = os.path.join(d, sub, "corpus_text_document")
    b = mod.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for t in docs:
        b.add_item(Item(numpy.array(t, dtype=numpy.int64)))
        b.end_document()
    b.finalize(prefix + ".idx")
# the same stream as one raw uint32 shard of the paper's packed-binary format
os.makedirs(os.path.join(d, "packed"))
flat = [t for doc in docs for t in doc]
open(os.path.join(d, "packed", "shard_000.bin"), "wb").write(struct.pack("<%dI" % len(flat), *flat))
import json
json.dump({"format": "lbt_packed_tokens_manifest_v1", "dtype": "uint32",
           "shards": [{"path": "shard_000.bin", "token_count": len(flat), "doc_count": len(docs)}]},
          open(os.path.join(d, "packed", "manifest.json"), "w"))
# the documented layout (docs/data.md), for the byte comparison
lens = [len(t) for t in docs]
for sub, code, width in (("u16", 8, 2), ("i32", 4, 4)):
    ptrs, off = [], 0
    for n in lens: ptrs.append(off); off += n * width
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    idx += struct.pack("<QQ", len(lens), len(lens) + 1)
    idx += struct.pack("<%di" % len(lens), *lens) + struct.pack("<%dq" % len(ptrs), *ptrs)
    idx += struct.pack("<%dq" % (len(lens) + 1), *range(len(lens) + 1))
    open(os.path.join(d, sub, "documented.idx"), "wb").write(idx)
print("written", len(docs), "documents,", len(flat), "tokens")
PY
  rw=$?
  check "megatron-core's IndexedDatasetBuilder wrote the datasets" '[ $rw -eq 0 ] && grep -q "^written 120 documents" "$tmp/writer.log"'
  [ $rw -eq 0 ] || cat "$tmp/writer.log"
  check "its uint16 .idx is the documented layout, byte for byte" 'cmp -s "$tmp/u16/corpus_text_document.idx" "$tmp/u16/documented.idx"'
  check "its int32 .idx likewise" 'cmp -s "$tmp/i32/corpus_text_document.idx" "$tmp/i32/documented.idx"'
  T=(configs/tiny.yaml --set parallel.backend=cpu --set schedule.total_steps=20 --set schedule.warmup_steps=5 --set logging.interval=1)
  losses() { grep -o '"loss": [0-9.e+-]*' "$1"; }
  for s in u16 i32 packed; do
    spec=$tmp/$s/corpus_text_document; [ $s = packed ] && spec=$tmp/packed
    ./train "${T[@]}" --set data.train="$spec" --set logging.file="$tmp/$s.jsonl" >"$tmp/$s.out" 2>&1 || tail -n 5 "$tmp/$s.out"
  done
  check "the engine trains on Megatron's uint16 dataset (20 steps)" '[ "$(losses "$tmp/u16.jsonl" | wc -l)" -eq 20 ]'
  check "Megatron's int32 dataset trains to the same losses" 'diff <(losses "$tmp/u16.jsonl") <(losses "$tmp/i32.jsonl")'
  check "the same stream as a packed-binary shard trains to the same losses" \
    'diff <(losses "$tmp/u16.jsonl") <(losses "$tmp/packed.jsonl")'
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

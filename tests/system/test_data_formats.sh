#!/usr/bin/env bash
# Training data in other projects' formats, written here from their documented layouts (not by this
# engine): Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx, "MMIDIDX", as
# megatron/core/datasets/indexed_dataset.py's _IndexWriter lays it out), uint16 and int32, and the
# paper's packed-binary dataset (raw uint32 shards and a manifest.json, "lbt_packed_tokens_manifest_v1",
# as its low_bits_training/datasets/packed_binary.py reads it). The same tokens in every form must train
# to the same losses; a glob over a Megatron folder lists .bin and .idx and counts the dataset once; a
# bad index, a truncated .bin, a uint16 dataset for a large vocabulary, a token outside the vocabulary, a
# manifest whose counts or files are wrong are refused, naming the file.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp" <<'PY'
import struct, sys, random
d = sys.argv[1]
random.seed(7)
# documents of random lengths over a tiny vocabulary (the tiny preset: 512), EOD = 1 after each
docs = [[random.randrange(2, 512) for _ in range(random.randrange(20, 200))] + [1] for _ in range(120)]
def write(prefix, code, fmt, width, docs, index_bytes=None, bin_cut=0, bad_ptr=False):
    with open(prefix + ".bin", "wb") as f:
        data = b"".join(struct.pack("<%d%s" % (len(t), fmt), *t) for t in docs)
        f.write(data[:len(data) - bin_cut] if bin_cut else data)
    lens = [len(t) for t in docs]
    ptrs, off = [], 0
    for n in lens:
        ptrs.append(off); off += n * width
    if bad_ptr: ptrs[3] += width
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code)
    idx += struct.pack("<Q", len(lens)) + struct.pack("<Q", len(lens) + 1)
    idx += struct.pack("<%di" % len(lens), *lens) + struct.pack("<%dq" % len(ptrs), *ptrs)
    idx += struct.pack("<%dq" % (len(lens) + 1), *range(len(lens) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(index_bytes(idx) if index_bytes else idx)
import os
for sub in ("u16", "i32", "bad"): os.makedirs(os.path.join(d, sub), exist_ok=True)
write(d + "/u16/corpus_text_document", 8, "H", 2, docs)
write(d + "/i32/corpus_text_document", 4, "i", 4, docs)
write(d + "/bad/magic", 8, "H", 2, docs, index_bytes=lambda b: b"XXIDIDX\x00\x00" + b[9:])
write(d + "/bad/version", 8, "H", 2, docs, index_bytes=lambda b: b[:9] + struct.pack("<Q", 2) + b[17:])
write(d + "/bad/short", 8, "H", 2, docs, index_bytes=lambda b: b[:-8])
write(d + "/bad/truncated", 8, "H", 2, docs, bin_cut=6)
write(d + "/bad/pointers", 8, "H", 2, docs, bad_ptr=True)
write(d + "/bad/float", 7, "f", 4, docs)
big = [t[:] for t in docs]; big[50][3] = 600
write(d + "/bad/oov", 4, "i", 4, big)
# packed binary: the same stream as one raw uint32 shard (so the same windows), then split in three
import json
flat = [t for doc in docs for t in doc]
def packed(sub, parts, dtype="uint32", fmt="I", count_fix=0, missing=False, fmt_name="lbt_packed_tokens_manifest_v1"):
    os.makedirs(os.path.join(d, sub), exist_ok=True)
    shards, n = [], len(flat)
    for k in range(parts):
        part = flat[k * n // parts:(k + 1) * n // parts]
        name = "shard_%03d.bin" % k
        if not (missing and k == 1):
            with open(os.path.join(d, sub, name), "wb") as f: f.write(struct.pack("<%d%s" % (len(part), fmt), *part))
        shards.append({"path": name, "token_count": len(part) + (count_fix if k == 0 else 0), "doc_count": 0})
    with open(os.path.join(d, sub, "manifest.json"), "w") as f:
        json.dump({"format": fmt_name, "dtype": dtype, "shards": shards}, f)
packed("packed1", 1)
packed("packed3", 3)
packed("bad_count", 2, count_fix=5)
packed("bad_missing", 2, missing=True)
packed("bad_dtype", 1, dtype="float32", fmt="f")
PY

T=(configs/tiny.yaml --set parallel.backend=cpu --set schedule.total_steps=30 --set schedule.warmup_steps=5 --set logging.interval=1)
losses() { grep -o '"loss": [0-9.e+-]*' "$1"; }
./train "${T[@]}" --set data.train="$tmp/u16/corpus_text_document" --set logging.file="$tmp/u16.jsonl" >"$tmp/u16.out" 2>&1; r1=$?
./train "${T[@]}" --set data.train="$tmp/i32/corpus_text_document.bin" --set logging.file="$tmp/i32.jsonl" >"$tmp/i32.out" 2>&1; r2=$?
./train "${T[@]}" --set data.train="$tmp/u16/*" --set logging.file="$tmp/glob.jsonl" >"$tmp/glob.out" 2>&1; r3=$?
check "a Megatron uint16 dataset (named by its prefix) trains" '[ $r1 -eq 0 ] && [ "$(losses "$tmp/u16.jsonl" | wc -l)" -eq 30 ]'
check "the int32 dataset of the same tokens (named by its .bin) trains to the same losses" \
  '[ $r2 -eq 0 ] && diff <(losses "$tmp/u16.jsonl") <(losses "$tmp/i32.jsonl")'
check "a glob listing .bin and .idx counts the dataset once (same losses)" \
  '[ $r3 -eq 0 ] && diff <(losses "$tmp/u16.jsonl") <(losses "$tmp/glob.jsonl")'
./train "${T[@]}" --set data.train="$tmp/packed1" --set logging.file="$tmp/packed1.jsonl" >"$tmp/p1.out" 2>&1; r4=$?
./train "${T[@]}" --set data.train="$tmp/packed3/manifest.json" --set logging.file="$tmp/packed3.jsonl" >"$tmp/p3.out" 2>&1; r5=$?
check "a packed-binary dataset (its folder) of the same stream trains to the Megatron dataset's losses" \
  '[ $r4 -eq 0 ] && diff <(losses "$tmp/u16.jsonl") <(losses "$tmp/packed1.jsonl")'
check "a packed-binary manifest of three shards trains" '[ $r5 -eq 0 ] && [ "$(losses "$tmp/packed3.jsonl" | wc -l)" -eq 30 ]'
out=$(./train "${T[@]}" --set data.train="$tmp/bad_count" 2>&1); rc=$?
check "a shard whose size is not its manifest's token_count is refused, naming it" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "bad_count/shard_000.bin: .* bytes, but .* tokens of 4 bytes were expected"'
out=$(./train "${T[@]}" --set data.train="$tmp/bad_missing" 2>&1); rc=$?
check "a shard the manifest lists but the folder lacks is refused, naming it" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "bad_missing/shard_001.bin: cannot open it"'
out=$(./train "${T[@]}" --set data.train="$tmp/bad_dtype" 2>&1); rc=$?
check "a float dtype in a manifest is refused, naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "bad_dtype/manifest.json: dtype .float32."'
refused() { out=$(./train "${T[@]}" "$@" 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "$tmp/bad/"; }
check "a bad magic is refused, naming the file" 'refused --set data.train="$tmp/bad/magic" && echo "$out" | grep -q "no MMIDIDX header"'
check "another version is refused" 'refused --set data.train="$tmp/bad/version" && echo "$out" | grep -q "version 2"'
check "a short index is refused with its sizes" 'refused --set data.train="$tmp/bad/short" && echo "$out" | grep -q "expected"'
check "a truncated .bin is refused" 'refused --set data.train="$tmp/bad/truncated" && echo "$out" | grep -q "truncated or another file"'
check "inconsistent offsets are refused" 'refused --set data.train="$tmp/bad/pointers" && echo "$out" | grep -q "sequence 3 has length"'
check "a float dtype is refused" 'refused --set data.train="$tmp/bad/float" && echo "$out" | grep -q "dtype code 7"'
out=$(./train "${T[@]}" --set data.train="$tmp/u16/corpus_text_document" --set model.vocab_size=128256 2>&1); rc=$?
check "uint16 tokens for a 128256-token model are refused as another tokenizer's, naming the file" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "corpus_text_document.bin: uint16 tokens"'
out=$(./train "${T[@]}" --set data.train="$tmp/bad/oov" --set eval.interval=0 2>&1); rc=$?
check "a token outside the vocabulary stops the run, naming the file and the position" \
  '[ $rc -ne 0 ] && echo "$out" | grep -q "oov.bin: token 600 at position"'
# ./train tokenize over gzip JSON lines (Dolma's .json.gz, and .jsonl.gz; a file of two gzip members, as
# concatenated .gz files are): the shards are byte for byte those of the same text as plain .jsonl; a
# truncated or corrupt gzip file is refused, naming it.
first_file() { for f in "$@"; do [ -n "$f" ] && [ -e "$f" ] && { echo "$f"; return; }; done; }
tok=$(first_file "${TOKENIZER_MODEL:-}" ../shared/data/tokenizer/tokenizer.model .deps/tokenizer.model)
if [ -n "$tok" ]; then
  python3 - "$tmp" README.md docs/*.md <<'PY'
import gzip, json, sys
d, files = sys.argv[1], sys.argv[2:]
lines = [json.dumps({"id": i, "text": open(p, encoding="utf-8").read()}) + "\n" for i, p in enumerate(files)]
open(d + "/c.jsonl", "w").write("".join(lines))
half = len(lines) // 2
with open(d + "/c.json.gz", "wb") as f:  # two members
    f.write(gzip.compress("".join(lines[:half]).encode())); f.write(gzip.compress("".join(lines[half:]).encode()))
open(d + "/c.jsonl.gz", "wb").write(gzip.compress("".join(lines).encode()))
data = open(d + "/c.jsonl.gz", "rb").read()
open(d + "/trunc.jsonl.gz", "wb").write(data[: len(data) // 2])
open(d + "/corrupt.jsonl.gz", "wb").write(data[:20] + bytes(b ^ 0x5A for b in data[20:60]) + data[60:])
PY
  for f in c.jsonl c.json.gz c.jsonl.gz; do
    ./train tokenize --tokenizer "$tok" --input "$tmp/$f" --output "$tmp/tok_${f//./_}" --zstd 0 --quiet >/dev/null 2>&1
  done
  check "tokenize: .json.gz (two gzip members) gives the shards of the same .jsonl, byte for byte" \
    'cmp -s "$tmp/tok_c_jsonl_train_000000.bin" "$tmp/tok_c_json_gz_train_000000.bin"'
  check "tokenize: .jsonl.gz likewise" 'cmp -s "$tmp/tok_c_jsonl_train_000000.bin" "$tmp/tok_c_jsonl_gz_train_000000.bin"'
  out=$(./train tokenize --tokenizer "$tok" --input "$tmp/trunc.jsonl.gz" --output "$tmp/t" --quiet 2>&1); rc=$?
  check "a truncated gzip input is refused, naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "trunc.jsonl.gz: truncated gzip stream"'
  out=$(./train tokenize --tokenizer "$tok" --input "$tmp/corrupt.jsonl.gz" --output "$tmp/t" --quiet 2>&1); rc=$?
  check "a corrupt gzip input is refused, naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "corrupt.jsonl.gz: corrupt gzip data"'
  # --part I/N: seven inputs in three parts; the parts' shards, in name order, hold the tokens of one
  # process's (train and validation), whatever the shard boundaries
  mkdir -p "$tmp/parts"
  docs=(README.md docs/*.md) pins=()
  for k in $(seq 0 6); do cp "${docs[$k]}" "$tmp/parts/in$k.txt" && pins+=(--input "$tmp/parts/in$k.txt"); done
  P=(--tokenizer "$tok" "${pins[@]}" --val-fraction 0.3 --shard-tokens 4000 --zstd 0 --quiet)
  ./train tokenize "${P[@]}" --output "$tmp/parts/one" >/dev/null 2>&1; r0=$?
  rp=0; for k in 0 1 2; do ./train tokenize "${P[@]}" --output "$tmp/parts/split" --part "$k/3" >/dev/null 2>&1 || rp=1; done
  same=$(python3 - "$tmp/parts" <<'PY'
import glob, sys
d = sys.argv[1]
def stream(pattern):
    out = b""
    for p in sorted(glob.glob(d + "/" + pattern)):
        raw = open(p, "rb").read()
        assert int.from_bytes(raw[16:20], "little") in (2, 4)
        out += raw[64:]
    return out
ok = all(stream("one_%s_*.bin" % s) == stream("split_%s_p*.bin" % s) and len(stream("one_%s_*.bin" % s)) > 0 for s in ("train", "val"))
print("ok" if ok and len(glob.glob(d + "/split_train_p00[012]_*.bin")) >= 3 else "differ")
PY
)
  check "tokenize --part 0/3, 1/3, 2/3: the parts' shards hold one process's train and val tokens" '[ $r0 -eq 0 ] && [ $rp -eq 0 ] && [ "$same" = ok ]'
  # progress with an ETA: a corpus of many blocks (the novels, 76 MB, where ../shared has them); the
  # same shards on 1 and 3 threads (novels are cut into pieces that threads encode apart)
  corpus=$(first_file "${CORPUS:-}" ../shared/data/corpus/novels.jsonl.zst)
  if [ -n "$corpus" ]; then
    NV=(./train tokenize --tokenizer "$tok" --input "$corpus" --zstd 0 --val-fraction 0.05 --shard-tokens 5M)
    out=$(TOKENIZE_REPORT_S=0 "${NV[@]}" --threads 3 --output "$tmp/parts/progress" 2>&1 >/dev/null)
    check "tokenize's progress lines give the share of the input read and an ETA" \
      'echo "$out" | grep -Eq "tokenize: [0-9]+ docs, .* [0-9.]+% of [0-9.]+ MB of input, eta [0-9]+h[0-9]{2}m[0-9]{2}s"'
    "${NV[@]}" --threads 1 --quiet --output "$tmp/parts/one_thread" >/dev/null 2>&1
    same=1 n=0
    for f in "$tmp"/parts/one_thread_*.bin; do
      cmp -s "$f" "$tmp/parts/progress${f#"$tmp"/parts/one_thread}" || same=0; n=$((n + 1))
    done
    check "tokenize writes the same shards on 1 and 3 threads ($n shards)" \
      '[ $same = 1 ] && [ $n -ge 5 ] && [ "$(ls "$tmp"/parts/progress_*.bin | wc -l)" = $n ]'
    rm -f "$tmp"/parts/progress_* "$tmp"/parts/one_thread_*
  fi
  out=$(./train tokenize --tokenizer "$tok" "${pins[@]}" --val-docs 2 --output "$tmp/parts/x" --part 1/3 2>&1); rc=$?
  check "--part with --val-docs is refused, saying why" '[ $rc -ne 0 ] && echo "$out" | grep -q "use --val-fraction"'
  out=$(./train tokenize --tokenizer "$tok" --input "$tmp/c.jsonl" --output "$tmp/parts/x" --part 1/3 2>&1); rc=$?
  check "--part with fewer inputs than parts is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "only 1 input file"'
else
  echo "note: no Llama-3 tokenizer.model (TOKENIZER_MODEL, ../shared/data/tokenizer, .deps): gzip inputs not checked"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

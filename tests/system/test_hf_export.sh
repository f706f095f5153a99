#!/usr/bin/env bash
# scripts/hf/export_hf.py and scripts/hf/ckpt_io.py without torch (python3 + numpy): the Python hash64
# port against C-computed values and against checkpoints the engine wrote; RunMeta parsing; the
# exported safetensors against the engine's own tensor table and parameters (from --compare-dump);
# bf16 rounding; corrupted and truncated checkpoints refused, naming what is wrong. Then the way
# back: scripts/hf/import_hf.py turns the export into a checkpoint.init_from file, ./train starts from
# it with exactly the original parameters (fp32) or their bf16 roundings, and bad files, other
# models and unsupported HF configs are refused, naming what is wrong.
# (scripts/hf/hf_compare.py does the torch/transformers side: from_pretrained and logits.)
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
# numpy: python3's own, or the copy `make test` puts in .deps/py when python3 has none.
[ -d .deps/py ] && export PYTHONPATH="$PWD/.deps/py${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import numpy" 2>/dev/null; then
  echo "FAIL: python3 with numpy is needed (make test installs it; or python3 -m pip install numpy)"
  echo "0 passed, 1 failed"; exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py() { PYTHONPATH="scripts/hf${PYTHONPATH:+:$PYTHONPATH}" python3 -c "$1" "${@:2}"; }  # a Python check: exit status 0 means it holds

# A tiny run with Llama-3.1 RoPE scaling on, 2 steps, checkpointed; then the engine dumps that
# checkpoint's parameters and tensor table (resume runs before --compare-dump).
sets=(--set schedule.total_steps=2 --set schedule.warmup_steps=1 --set parallel.backend=cpu --set parallel.threads=2
      --set model.rope_scaling=true --set model.rope_original_max_pos=16 --set checkpoint.dir="$tmp/ck")
./train configs/tiny.yaml "${sets[@]}" >"$tmp/train.out" 2>&1
ck="$tmp/ck/ckpt_00000002.bin"
check "tiny run writes a checkpoint" '[ -f "$ck" ]'
./train configs/tiny.yaml "${sets[@]}" --resume --compare-dump "$tmp/dump" >"$tmp/dump.out" 2>&1
check "--resume --compare-dump writes the checkpoint's params" '[ -f "$tmp/dump/params.bin" ]'

# hash64 of bytes (37 i + 11) mod 256, i < len, as common/common.c computes it (printed by a C program).
check "hash64 port matches C on 0..300-byte inputs (tails of words and bytes)" 'py "
import ckpt_io
b = bytes((i * 37 + 11) & 255 for i in range(300))
want = {(0, 0): 10416879180377615705, (7, 0): 12854708836909091468, (8, 12345): 906035607803661024,
        (33, 0): 2919463142563478548, (63, 12345): 165435698905952498, (300, 0): 9464989866152250410,
        (300, 12345): 12488690102717102732}
assert all(ckpt_io.hash64(b[:n], s) == h for (n, s), h in want.items())
"'
check "vectorized hash64_many equals hash64 piece by piece" 'py "
import ckpt_io, numpy as np
rows = np.random.default_rng(1).integers(0, 256, size=(5, 1001), dtype=np.uint8)
assert list(ckpt_io.hash64_many(rows, np.arange(5) + 7)) == [ckpt_io.hash64(r.tobytes(), i + 7) for i, r in enumerate(rows)]
"'
check "header and every section checksum of an engine checkpoint verify" 'py "
import ckpt_io, sys
c = ckpt_io.Checkpoint(sys.argv[1])
assert c.step == 2 and list(c.sections) == [\"meta\", \"params\", \"adam_m\", \"adam_v\", \"loader\", \"recipe\", \"route\"]
for name in c.sections: c.section(name)
" "$ck"'
check "RunMeta parses to the run's config" 'py "
import ckpt_io, sys
m = ckpt_io.parse_run_meta(ckpt_io.Checkpoint(sys.argv[1]).section(\"meta\"))
want = dict(version=1, vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, max_seq_len=64,
            rope_theta=10000.0, rope_scaling=1, rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
            rope_original_max_pos=16, recipe=\"bf16\", micro_batch=8, global_batch=16, seq_len=64, world=1, seed=42,
            n_params=164160, tokens_seen=2 * 16 * 64)
assert all(m[k] == v for k, v in want.items()), {k: m[k] for k in want if m[k] != v}
assert abs(m[\"norm_eps\"] - 1e-5) < 1e-12
" "$ck"'

out=$(python3 scripts/hf/export_hf.py "$ck" "$tmp/hf32" --dtype fp32 2>&1)
check "export fp32 succeeds and says verified" 'echo "$out" | grep -q "verified"'
python3 scripts/hf/export_hf.py "$ck" "$tmp/hf16" >/dev/null 2>&1
check "config.json is a LlamaForCausalLM config with llama3 rope scaling" 'py "
import json, sys
c = json.load(open(sys.argv[1]))
want = dict(architectures=[\"LlamaForCausalLM\"], vocab_size=512, hidden_size=64, intermediate_size=192,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-05, rope_theta=10000.0,
            max_position_embeddings=64, tie_word_embeddings=False, torch_dtype=\"bfloat16\",
            rope_scaling=dict(rope_type=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=16))
assert all(c[k] == v for k, v in want.items()), {k: c[k] for k in want if c[k] != v}
" "$tmp/hf16/config.json"'

# Reads a safetensors file with numpy alone, and checks every tensor against the engine's dump:
# model.json's table (name, offset, shape) and params.bin, mapped to HF names here independently.
read_st='
import json, struct, numpy as np
def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); head.pop("__metadata__")
    ends = sorted(v["data_offsets"] for v in head.values())
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and 8 + n + ends[-1][1] == len(raw)
    dt = {"F32": "<f4", "BF16": "<u2"}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]], dt[v["dtype"]]).reshape(v["shape"])
            for k, v in head.items()}
def engine_tensors(d):
    m = json.load(open(d + "/model.json")); p = np.fromfile(d + "/params.bin", "<f4")
    hf = {"tok_embedding": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "head": "lm_head.weight",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "wq": "self_attn.q_proj",
          "wk": "self_attn.k_proj", "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj",
          "w_up": "mlp.up_proj", "w_down": "mlp.down_proj"}
    out = {}
    for t in m["tensors"]:
        a = p[t["offset"]: t["offset"] + t["numel"]].reshape(t["shape"])
        if t["name"] in ("tok_embedding", "final_norm", "head"): out[hf[t["name"]]] = a
        else:
            for l in range(m["n_layers"]):
                out["model.layers.%d.%s" % (l, hf[t["name"]]) + ("" if "norm" in t["name"] else ".weight")] = a[l]
    return {k.replace("layernorm", "layernorm.weight") if k.endswith("layernorm") else k: v for k, v in out.items()}
'
check "fp32 safetensors: every tensor, by HF name, equals the engine's parameters bit for bit" 'py "$read_st
import sys
st, eng = read_st(sys.argv[1]), engine_tensors(sys.argv[2])
assert sorted(st) == sorted(eng) and len(st) == 3 + 9 * 2, sorted(st)
assert all(st[k].shape == eng[k].shape and np.array_equal(st[k].view(\"<u4\"), eng[k].view(\"<u4\")) for k in st)
" "$tmp/hf32/model.safetensors" "$tmp/dump"'
check "bf16 safetensors: every weight is its fp32 value rounded to the nearest bf16" 'py "$read_st
import sys
st, eng = read_st(sys.argv[1]), engine_tensors(sys.argv[2])
for k, x in eng.items():
    b = st[k].astype(np.uint32)
    y, up, down = [(v << 16).view(\"<f4\").astype(np.float64) for v in (b, b + 1, b - 1)]
    x = x.astype(np.float64)  # nearest: no neighbour bf16 value is closer to x
    assert np.all(np.abs(x - y) <= np.abs(x - up)) and np.all(np.abs(x - y) <= np.abs(x - down)), k
" "$tmp/hf16/model.safetensors" "$tmp/dump"'
check "fp32->bf16: ties to even, inf, -0 and NaN" 'py "
import ckpt_io, numpy as np
x = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), np.inf, -0.0, 3.0], np.float32)
assert list(ckpt_io.fp32_to_bf16_bits(x)) == [0x3F80, 0x3F82, 0xBF80, 0x7F80, 0x8000, 0x4040]
assert (ckpt_io.fp32_to_bf16_bits(np.array([np.nan], np.float32))[0] & 0x7FFF) > 0x7F80
"'

# Damage: a flipped bit in the parameters, in the header, a truncated file.
cp "$ck" "$tmp/bad.bin"
printf '\x01' | dd of="$tmp/bad.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null  # inside "params" (768..657408)
out=$(python3 scripts/hf/export_hf.py "$tmp/bad.bin" "$tmp/x" 2>&1); rc=$?
check "a damaged params section is refused, naming the section" '[ $rc -ne 0 ] && echo "$out" | grep -q "section .params. checksum mismatch"'
out=$(python3 scripts/hf/export_hf.py "$tmp/bad.bin" "$tmp/x" --no-verify 2>&1); rc=$?
check "--no-verify exports it anyway" '[ $rc -eq 0 ] && echo "$out" | grep -q "NOT verified"'
cp "$ck" "$tmp/bad.bin"
printf '\x07' | dd of="$tmp/bad.bin" bs=1 seek=16 conv=notrunc 2>/dev/null  # the step field
out=$(python3 scripts/hf/export_hf.py "$tmp/bad.bin" "$tmp/x" 2>&1); rc=$?
check "a damaged header is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "header checksum mismatch"'
head -c 4000 "$ck" >"$tmp/short.bin"
out=$(python3 scripts/hf/export_hf.py "$tmp/short.bin" "$tmp/x" 2>&1); rc=$?
check "a truncated checkpoint is refused, with both sizes" '[ $rc -ne 0 ] && echo "$out" | grep -q "truncated: 4000 bytes on disk, its header says"'

# ---- import: HF directory -> checkpoint.init_from file -> ./train ---------------------------------
dump_params() {  # $1: init_from file, $2: dump dir, then extra ./train options; prints ./train's output
  ./train configs/tiny.yaml "${sets[@]}" --set checkpoint.init_from="$1" --compare-dump "$2" "${@:3}" 2>&1
}
imp=$(python3 scripts/hf/import_hf.py "$tmp/hf32" "$tmp/imp32.bin" 2>&1)
check "import fp32 succeeds and prints the model keys" 'echo "$imp" | grep -q "^imported .*164160 parameters, F32 -> fp32" && echo "$imp" | grep -q "^  rope_original_max_pos: 16$"'
check "the imported file is a step-0 checkpoint: init_meta (the run's model config) and params, verified" 'py "
import ckpt_io, sys
c = ckpt_io.Checkpoint(sys.argv[1])
assert c.step == 0 and list(c.sections) == [\"init_meta\", \"params\"] and c.sections[\"params\"][1] == 4 * 164160
m, run = ckpt_io.parse_init_meta(c.section(\"init_meta\")), ckpt_io.parse_run_meta(ckpt_io.Checkpoint(sys.argv[2]).section(\"meta\"))
assert m[\"version\"] == 1 and all(m[k] == run[k] for k in ckpt_io.MODEL_KEYS), m
c.section(\"params\")
" "$tmp/imp32.bin" "$ck"'
# A config made of the printed model keys alone must be the model the file holds.
echo "$imp" | sed -n '/^model:$/,$p' >"$tmp/imported.yaml"
out=$(./train "$tmp/imported.yaml" "${sets[@]}" --set checkpoint.init_from="$tmp/imp32.bin" --compare-dump "$tmp/d32" 2>&1)
check "./train starts from the fp32 import (config from the printed keys), saying so" 'echo "$out" | grep -q "^initialized from $tmp/imp32.bin$"'
check "export fp32 -> import -> ./train: the parameters equal the checkpoint's bit for bit" 'cmp -s "$tmp/d32/params.bin" "$tmp/dump/params.bin"'

python3 scripts/hf/import_hf.py "$tmp/hf16" "$tmp/imp16.bin" >/dev/null 2>&1
dump_params "$tmp/imp16.bin" "$tmp/d16" >/dev/null
check "export bf16 -> import -> ./train: each parameter is the checkpoint's, rounded to the nearest bf16" 'py "
import ckpt_io, numpy as np, sys
got, orig = np.fromfile(sys.argv[1], \"<u4\"), np.fromfile(sys.argv[2], \"<f4\")
want = ckpt_io.fp32_to_bf16_bits(orig).astype(np.uint32) << np.uint32(16)
assert got.shape == want.shape and np.array_equal(got, want) and not np.array_equal(got, orig.view(\"<u4\"))
" "$tmp/d16/params.bin" "$tmp/dump/params.bin"'

# Sharded: the fp32 export split in two files with an index, as HF saves large models.
py "
import ckpt_io, json, os, sys
src, d = sys.argv[1], sys.argv[2]
os.makedirs(d)
st = ckpt_io.SafetensorsReader(src)
names = list(st.tensors)
parts = {\"model-00001-of-00002.safetensors\": names[:7], \"model-00002-of-00002.safetensors\": names[7:]}
for fn, part in parts.items():
    ckpt_io.write_safetensors(os.path.join(d, fn), [(n, next(st.fp32_blocks(n)).reshape(st.shape(n))) for n in part], \"fp32\")
json.dump({\"metadata\": {}, \"weight_map\": {n: fn for fn, part in parts.items() for n in part}}, open(d + \"/model.safetensors.index.json\", \"w\"))
os.system(\"cp %s/config.json %s/\" % (src, d))
" "$tmp/hf32" "$tmp/hfsh"
python3 scripts/hf/import_hf.py "$tmp/hfsh" "$tmp/impsh.bin" >/dev/null 2>&1
check "a sharded export (index.json + 2 files) imports to the same file byte for byte" 'cmp -s "$tmp/impsh.bin" "$tmp/imp32.bin"'
check "F16 and BF16 tensors widen to fp32 exactly" 'py "
import ckpt_io, json, struct, numpy as np, os, sys
d = sys.argv[1]; os.makedirs(d)
x = np.array([[1.5, -2.0009765625, 65504.0], [6.1e-05, 0.0, -0.0]], np.float16)
b = np.array([0x3F80, 0xC0A1, 0x0001, 0x7F80], np.uint16)
head = json.dumps({\"h\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [0, 12]},
                   \"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [12, 20]}}).encode()
open(d + \"/model.safetensors\", \"wb\").write(struct.pack(\"<Q\", len(head)) + head + x.tobytes() + b.tobytes())
st = ckpt_io.SafetensorsReader(d)
assert np.array_equal(np.concatenate(list(st.fp32_blocks(\"h\", block_bytes=12))), x.astype(np.float32).ravel())
assert list(np.concatenate(list(st.fp32_blocks(\"b\"))).view(\"<u4\")) == [0x3F800000, 0xC0A10000, 0x00010000, 0x7F800000]
" "$tmp/hf_f16"'
check "write_checkpoint: sections of many checksum chunks (4 KiB) verify in Python and load in ./train" 'py "
import ckpt_io, sys
c = ckpt_io.Checkpoint(sys.argv[1])
ckpt_io.write_checkpoint(sys.argv[2], [(n, [c.section(n)]) for n in c.sections], chunk_bytes=4096)
c2 = ckpt_io.Checkpoint(sys.argv[2])
assert c2.chunk_bytes == 4096 and c2.sections[\"params\"][1] // 4096 > 100 and bytes(c2.section(\"params\")) == bytes(c.section(\"params\"))
" "$tmp/imp32.bin" "$tmp/chunks.bin" && dump_params "$tmp/chunks.bin" "$tmp/dch" | grep -q "^initialized from" && cmp -s "$tmp/dch/params.bin" "$tmp/dump/params.bin"'

# The engine's side: resume wins, a training checkpoint works too, bad files and other models do not.
out=$(dump_params "$tmp/imp16.bin" "$tmp/dres" --resume)
check "a resume takes precedence over checkpoint.init_from" 'echo "$out" | grep -q "^resumed from" && ! echo "$out" | grep -q "initialized from" && cmp -s "$tmp/dres/params.bin" "$tmp/dump/params.bin"'
out=$(dump_params "$ck" "$tmp/dck")
check "a training checkpoint serves as checkpoint.init_from (its params, no resume)" 'echo "$out" | grep -q "^initialized from $ck$" && cmp -s "$tmp/dck/params.bin" "$tmp/dump/params.bin"'
cp "$tmp/imp32.bin" "$tmp/bad_imp.bin"
printf '\x01' | dd of="$tmp/bad_imp.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null  # inside "params"
out=$(dump_params "$tmp/bad_imp.bin" "$tmp/x"); rc=$?
check "a corrupted imported file is refused, naming it and the section" '[ $rc -ne 0 ] && echo "$out" | grep -q "checkpoint.init_from: checkpoint .$tmp/bad_imp.bin.: section .params. fails its checksum"'
out=$(dump_params "$tmp/imp32.bin" "$tmp/x" --set model.n_layers=3); rc=$?
check "a different model is refused, naming the key and both values" '[ $rc -ne 0 ] && echo "$out" | grep -q "init_from: .$tmp/imp32.bin. holds a different model: model.n_layers: the file has 2, this run has 3"'
out=$(dump_params "$tmp/imp32.bin" "$tmp/x" --set model.rope_scaling=false); rc=$?
check "RoPE scaling off vs on is a different model" '[ $rc -ne 0 ] && echo "$out" | grep -q "model.rope_scaling: the file has 1, this run has 0"'
out=$(dump_params "$tmp/nonexistent.bin" "$tmp/x"); rc=$?
check "a missing init_from file is an error naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "init_from: .*$tmp/nonexistent.bin"'
check "--help-config documents checkpoint.init_from" './train --help-config | grep -q "^checkpoint.init_from .*resume takes precedence"'

# What the engine cannot represent is refused by the importer, naming the field or tensor.
check "unsupported HF configs and mismatched tensors are refused, naming what is wrong" 'py "
import import_hf, json, shutil, sys
src, d = sys.argv[1], sys.argv[2]
shutil.copytree(src, d)
base = json.load(open(src + \"/config.json\"))
cases = [({\"tie_word_embeddings\": True}, \"tie_word_embeddings is true\"), ({\"attention_bias\": True}, \"attention_bias is true\"),
         ({\"mlp_bias\": True}, \"mlp_bias is true\"), ({\"hidden_act\": \"gelu\"}, \"hidden_act .gelu.\"),
         ({\"model_type\": \"mistral\"}, \"only a LlamaForCausalLM\"), ({\"head_dim\": 32}, \"head_dim 32\"),
         ({\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}, \"rope_scaling type .yarn.\"),
         ({\"num_hidden_layers\": 3}, \"missing, e.g. .model.layers.2.input_layernorm.weight.\"),
         ({\"intermediate_size\": 128}, \"gate_proj.weight. has shape .192, 64., config.json implies .128, 64.\")]
import re
for change, msg in cases:
    json.dump({**base, **change}, open(d + \"/config.json\", \"w\"))
    try:
        import_hf.import_hf(d, d + \"/out.bin\", log=lambda *a, **k: None)
        raise SystemExit(\"accepted: %s\" % change)
    except ValueError as e:
        assert re.search(msg, str(e)), (change, str(e))
" "$tmp/hf32" "$tmp/hfbad"'
rm -f "$tmp/hfbad/model.safetensors"
out=$(python3 scripts/hf/import_hf.py "$tmp/hfbad" "$tmp/x.bin" 2>&1); rc=$?
check "a directory without safetensors is refused by the CLI, naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "^import_hf: error: .$tmp/hfbad. has neither model.safetensors"'
echo "$pass passed, $fail failed"

#!/usr/bin/env bash
# scripts/export_hf.py and scripts/ckpt_io.py without torch (python3 + numpy): the Python hash64
# port against C-computed values and against checkpoints the engine wrote; RunMeta parsing; the
# exported safetensors against the engine's own tensor table and parameters (from --compare-dump);
# bf16 rounding; corrupted and truncated checkpoints refused, naming what is wrong.
# (scripts/hf_compare.py does the torch/transformers side: from_pretrained and logits.)
cd "$(dirname "$0")/.." || exit 1
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
if ! python3 -c "import numpy" 2>/dev/null; then
  echo "FAIL: python3 with numpy is needed (python3 -m pip install numpy)"
  echo "0 passed, 1 failed"; exit 1
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
py() { PYTHONPATH=scripts python3 -c "$1" "${@:2}"; }  # a Python check: exit status 0 means it holds

# A tiny run with Llama-3.1 RoPE scaling on, 2 steps, checkpointed; then the engine dumps that
# checkpoint's parameters and tensor table (resume runs before --compare-dump).
sets=(--set schedule.total_steps=2 --set schedule.warmup_steps=1 --set parallel.backend=cpu --set parallel.threads=2
      --set model.rope_scaling=true --set model.rope_original_max_pos=16 --set checkpoint.dir="$tmp/ck")
./train configs/tiny.yaml "${sets[@]}" >"$tmp/train.out" 2>&1
ck="$tmp/ck/ckpt_00000002.bin"
check "tiny run writes a checkpoint" '[ -f "$ck" ]'
./train configs/tiny.yaml "${sets[@]}" --resume --compare-dump "$tmp/dump" >"$tmp/dump.out" 2>&1
check "--resume --compare-dump writes the checkpoint's params" '[ -f "$tmp/dump/params.bin" ]'

# hash64 of bytes (37 i + 11) mod 256, i < len, as common.c computes it (printed by a C program).
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
assert c.step == 2 and list(c.sections) == [\"meta\", \"params\", \"adam_m\", \"adam_v\", \"loader\", \"recipe\"]
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

out=$(python3 scripts/export_hf.py "$ck" "$tmp/hf32" --dtype fp32 2>&1)
check "export fp32 succeeds and says verified" 'echo "$out" | grep -q "verified"'
python3 scripts/export_hf.py "$ck" "$tmp/hf16" >/dev/null 2>&1
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
out=$(python3 scripts/export_hf.py "$tmp/bad.bin" "$tmp/x" 2>&1); rc=$?
check "a damaged params section is refused, naming the section" '[ $rc -ne 0 ] && echo "$out" | grep -q "section .params. checksum mismatch"'
out=$(python3 scripts/export_hf.py "$tmp/bad.bin" "$tmp/x" --no-verify 2>&1); rc=$?
check "--no-verify exports it anyway" '[ $rc -eq 0 ] && echo "$out" | grep -q "NOT verified"'
cp "$ck" "$tmp/bad.bin"
printf '\x07' | dd of="$tmp/bad.bin" bs=1 seek=16 conv=notrunc 2>/dev/null  # the step field
out=$(python3 scripts/export_hf.py "$tmp/bad.bin" "$tmp/x" 2>&1); rc=$?
check "a damaged header is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "header checksum mismatch"'
head -c 4000 "$ck" >"$tmp/short.bin"
out=$(python3 scripts/export_hf.py "$tmp/short.bin" "$tmp/x" 2>&1); rc=$?
check "a truncated checkpoint is refused, with both sizes" '[ $rc -ne 0 ] && echo "$out" | grep -q "truncated: 4000 bytes on disk, its header says"'
echo "$pass passed, $fail failed"

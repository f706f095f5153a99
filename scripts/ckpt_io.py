"""ckpt_io.py: the Python side of the engine's file formats, shared by hf_compare.py and export_hf.py.

- hash64(): a numpy port of common.c's hash64, vectorized over many equal-length pieces, so that
  the 64 MiB chunks of a multi-GB checkpoint section are checked together;
- Checkpoint: reads and verifies a checkpoint file (docs/checkpoint_format.md);
- parse_run_meta(): the "meta" section (train.c's RunMeta, with a LlamaConfig inside);
- param_layout(): the flat parameter layout of model/llama.c (names, shapes, offsets, decay);
- hf_tensors(): maps that flat buffer onto Hugging Face LlamaForCausalLM names;
- hf_config(): the LlamaForCausalLM config.json for a model config;
- CompareDump: reads the directory `./train --compare-dump DIR` writes;
- write_safetensors(): streams tensors to a .safetensors file in fp32 or bf16.

Only numpy and the standard library are needed here (no torch), so an export runs anywhere.
"""
import json
import os
import struct

import numpy as np

# ---- hash64 (common.c) ----------------------------------------------------------------------------

_M64 = (1 << 64) - 1
H1, H2, H3 = np.uint64(0x9E3779B185EBCA87), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)


def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _lane(acc, w):
    return _rotl(acc + w * H2, 31) * H1


def hash64_many(pieces, seeds):
    """hash64(piece, len, seed) of every row of pieces (uint8 [n, L], e.g. a reshaped memmap).

    The four lanes of one piece depend on each other only through their own previous value, so one
    numpy step advances 4 lanes of all n pieces at once; the words are multiplied by H2 a block of
    steps at a time to keep the Python loop short. uint64 arrays wrap mod 2^64 as C does.
    """
    n, length = pieces.shape
    seeds = np.asarray(seeds, dtype=np.uint64).reshape(n)
    with np.errstate(over="ignore"):
        acc = np.stack([seeds + H1 + H2, seeds + H2, seeds.copy(), seeds - H1], axis=1)  # lanes a, b, c, d
        nblk = length // 32
        if nblk:
            words = pieces[:, : nblk * 32].view("<u8").reshape(n, nblk, 4)
            step = max(1, (1 << 21) // n)  # ~64 MiB of words per block
            for k0 in range(0, nblk, step):
                wh = words[:, k0 : k0 + step, :] * H2
                for k in range(wh.shape[1]):
                    acc += wh[:, k, :]
                    acc = _rotl(acc, 31)
                    acc *= H1
        h = _rotl(acc[:, 0], 1) + _rotl(acc[:, 1], 7) + _rotl(acc[:, 2], 12) + _rotl(acc[:, 3], 18) + np.uint64(length)
        i = nblk * 32
        while i + 8 <= length:  # at most 3 trailing words
            w = np.ascontiguousarray(pieces[:, i : i + 8]).view("<u8").reshape(n)
            h = _rotl(h ^ _lane(np.zeros_like(w), w), 27) * H1 + H3
            i += 8
        while i < length:  # at most 7 trailing bytes
            h = _rotl(h ^ (pieces[:, i].astype(np.uint64) * H3), 11) * H1
            i += 1
        h ^= h >> np.uint64(33)
        h *= H2
        h ^= h >> np.uint64(29)
        h *= H3
        h ^= h >> np.uint64(32)
    return h


def hash64(data, seed=0):
    """common.c's hash64 of a bytes-like object or a uint8 array."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    return int(hash64_many(buf.reshape(1, -1), [seed])[0])


# ---- checkpoint container (docs/checkpoint_format.md) -----------------------------------------

CKPT_MAGIC, CKPT_VERSION, HEADER_BYTES, ENTRY_BYTES = b"LLAMACKP", 1, 64, 96


class CheckpointError(Exception):
    pass


class Checkpoint:
    """A checkpoint file: header and table are read (and, with verify, checked) on open; a section
    is memory-mapped by section(), and its checksum checked there when verify is on."""

    def __init__(self, path, verify=True):
        self.path, self.verify = path, verify
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES or head[:8] != CKPT_MAGIC:
                raise CheckpointError(f"checkpoint '{path}': not a checkpoint (bad magic or shorter than 64 bytes)")
            version, n, self.step, file_bytes, self.chunk_bytes = struct.unpack_from("<IIqQQ", head, 8)
            stored = struct.unpack_from("<Q", head, 56)[0]
            if version != CKPT_VERSION:
                raise CheckpointError(f"checkpoint '{path}': format version {version}, this reader knows {CKPT_VERSION}")
            if n > 65536:
                raise CheckpointError(f"checkpoint '{path}': {n} sections (at most 65536)")
            table = f.read(ENTRY_BYTES * n)
        if len(table) != ENTRY_BYTES * n:
            raise CheckpointError(f"checkpoint '{path}' is truncated inside its section table")
        if verify:
            whole = bytearray(head + table)
            whole[56:64] = bytes(8)  # the checksum covers header and table with its own field zeroed
            got = hash64(bytes(whole), 0)
            if got != stored:
                raise CheckpointError(f"checkpoint '{path}': header checksum mismatch (stored {stored:#x}, computed {got:#x})")
        if file_bytes != size:
            raise CheckpointError(f"checkpoint '{path}' is truncated: {size} bytes on disk, its header says {file_bytes}")
        if self.chunk_bytes == 0 or self.chunk_bytes & (self.chunk_bytes - 1):
            raise CheckpointError(f"checkpoint '{path}': chunk size {self.chunk_bytes} is not a power of two")
        self.sections = {}  # name -> (offset, bytes, checksum), in table order
        for i in range(n):
            e = table[i * ENTRY_BYTES : (i + 1) * ENTRY_BYTES]
            name = e[:64].split(b"\0", 1)[0].decode()
            off, nbytes, csum = struct.unpack_from("<QQQ", e, 64)
            if off + nbytes > size:
                raise CheckpointError(f"checkpoint '{path}': section '{name}' ends at byte {off + nbytes}, past the end of the file ({size})")
            self.sections[name] = (off, nbytes, csum)

    def section(self, name):
        """The section's bytes as a read-only uint8 memmap (checksum-verified when verify is on)."""
        if name not in self.sections:
            have = ", ".join(f"'{s}'" for s in self.sections)
            raise CheckpointError(f"checkpoint '{self.path}' has no section '{name}' (it has: {have})")
        off, nbytes, csum = self.sections[name]
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=off, shape=(nbytes,)) if nbytes else np.zeros(0, np.uint8)
        if self.verify:
            got = section_checksum(data, self.chunk_bytes)
            if got != csum:
                raise CheckpointError(f"checkpoint '{self.path}': section '{name}' checksum mismatch (stored {csum:#x}, computed {got:#x})")
        return data


def section_checksum(data, chunk_bytes):
    """hash64 of the per-chunk hashes h[c] = hash64(chunk c, seed c), seeded with the length."""
    nbytes = data.shape[0]
    nfull, rest = divmod(nbytes, chunk_bytes)
    hs = []
    if nfull:  # all full chunks advance together
        hs.append(hash64_many(data[: nfull * chunk_bytes].reshape(nfull, chunk_bytes), np.arange(nfull, dtype=np.uint64)))
    if rest:
        hs.append(hash64_many(data[nfull * chunk_bytes :].reshape(1, rest), [nfull]))
    h = np.concatenate(hs).astype("<u8") if hs else np.zeros(0, "<u8")
    return hash64(h.view(np.uint8), nbytes)


# ---- RunMeta (train.c) ------------------------------------------------------------------------

# uint32 version; LlamaConfig {7 int, float norm_eps, float rope_theta, int rope_scaling, 3 float,
# int rope_original_max_pos}; char recipe[64]; 4 int32 (micro_batch, global_batch, seq_len, world);
# 4 bytes of padding (the uint64 after them is 8-aligned); uint64 seed, n_params; int64 tokens_seen.
_META_FMT = "<I 7i ffi fff i 64s 4i 4x QQq"
_META_FIELDS = ("version vocab_size dim n_layers n_heads n_kv_heads ffn_dim max_seq_len norm_eps rope_theta "
                "rope_scaling rope_factor rope_low_freq_factor rope_high_freq_factor rope_original_max_pos "
                "recipe micro_batch global_batch seq_len world seed n_params tokens_seen").split()
META_BYTES, META_VERSION = 168, 1
assert struct.calcsize(_META_FMT) == META_BYTES  # sizeof(RunMeta) on x86-64 / aarch64
MODEL_KEYS = _META_FIELDS[1:15]  # the LlamaConfig fields, named as in model.json


def parse_run_meta(buf, where="meta"):
    """RunMeta -> dict; model-config keys are named as in compare-dump's model.json."""
    if len(buf) != META_BYTES:
        raise CheckpointError(f"{where}: {len(buf)} bytes, train.c's RunMeta has {META_BYTES} (layout changed?)")
    meta = dict(zip(_META_FIELDS, struct.unpack(_META_FMT, bytes(buf))))
    if meta["version"] != META_VERSION:
        raise CheckpointError(f"{where}: RunMeta version {meta['version']}, this reader knows {META_VERSION}")
    meta["recipe"] = meta["recipe"].split(b"\0", 1)[0].decode()
    return meta


# ---- parameter layout (model/llama.c layout_params) --------------------------------------------


def param_layout(cfg):
    """[(name, shape, offset, numel, decay)] in the engine's order; offsets count floats."""
    V, D, L, F = cfg["vocab_size"], cfg["dim"], cfg["n_layers"], cfg["ffn_dim"]
    hd = D // cfg["n_heads"]
    Q, K = cfg["n_heads"] * hd, cfg["n_kv_heads"] * hd
    spec = [("tok_embedding", (V, D), 1), ("attn_norm", (L, D), 0), ("wq", (L, Q, D), 1), ("wk", (L, K, D), 1),
            ("wv", (L, K, D), 1), ("wo", (L, D, Q), 1), ("ffn_norm", (L, D), 0), ("w_gate", (L, F, D), 1),
            ("w_up", (L, F, D), 1), ("w_down", (L, D, F), 1), ("final_norm", (D,), 0), ("head", (V, D), 1)]
    out, off = [], 0
    for name, shape, decay in spec:
        numel = int(np.prod(shape))
        out.append((name, shape, off, numel, decay))
        off += numel
    return out


def param_count(cfg):
    name, shape, off, numel, decay = param_layout(cfg)[-1]
    return off + numel


# Engine tensor -> HF name ({l} = layer). Per-layer tensors are stacked [L, ...] in the engine.
HF_NAMES = {
    "tok_embedding": "model.embed_tokens.weight",
    "attn_norm": "model.layers.{l}.input_layernorm.weight",
    "wq": "model.layers.{l}.self_attn.q_proj.weight",
    "wk": "model.layers.{l}.self_attn.k_proj.weight",
    "wv": "model.layers.{l}.self_attn.v_proj.weight",
    "wo": "model.layers.{l}.self_attn.o_proj.weight",
    "ffn_norm": "model.layers.{l}.post_attention_layernorm.weight",
    "w_gate": "model.layers.{l}.mlp.gate_proj.weight",
    "w_up": "model.layers.{l}.mlp.up_proj.weight",
    "w_down": "model.layers.{l}.mlp.down_proj.weight",
    "final_norm": "model.norm.weight",
    "head": "lm_head.weight",
}
PER_LAYER = {"attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down"}


def hf_tensors(flat, cfg):
    """[(hf_name, engine_name, layer or None, decay, array view)] for a flat fp32 buffer in the
    engine layout (parameters or gradients); views, no copies. Sorted by layer, as HF lists them."""
    if flat.shape[0] != param_count(cfg):
        raise ValueError(f"parameter buffer has {flat.shape[0]} floats, the model config needs {param_count(cfg)}")
    L, out = cfg["n_layers"], []
    for name, shape, off, numel, decay in param_layout(cfg):
        t = flat[off : off + numel].reshape(shape)
        if name in PER_LAYER:
            out += [(HF_NAMES[name].format(l=l), name, l, decay, t[l]) for l in range(L)]
        else:
            out.append((HF_NAMES[name], name, None, decay, t))
    order = {"tok_embedding": -2, "final_norm": L, "head": L + 1}  # embeddings, layers 0..L-1, norm, head
    return sorted(out, key=lambda e: order.get(e[1], e[2]))


# ---- HF config ----------------------------------------------------------------------------------


def hf_config(cfg, torch_dtype="float32"):
    """config.json of a LlamaForCausalLM for a model config (model.json or RunMeta keys).

    rope_theta and rope_scaling are written the way Meta's Llama-3.1 config.json writes them;
    transformers 4.x reads them as is and 5.x folds them into rope_parameters."""
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["dim"],
        "intermediate_size": cfg["ffn_dim"],
        "num_hidden_layers": cfg["n_layers"],
        "num_attention_heads": cfg["n_heads"],
        "num_key_value_heads": cfg["n_kv_heads"],
        "head_dim": cfg["dim"] // cfg["n_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": cfg["max_seq_len"],
        "rms_norm_eps": _f32(cfg["norm_eps"]),
        "rope_theta": _f32(cfg["rope_theta"]),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        # Llama-3's <|begin_of_text|> / <|end_of_text|>, when the vocabulary is the Llama-3 one.
        "bos_token_id": 128000 if cfg["vocab_size"] > 128001 else None,
        "eos_token_id": 128001 if cfg["vocab_size"] > 128001 else None,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    }
    if cfg["rope_scaling"]:
        c["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": _f32(cfg["rope_factor"]),
            "low_freq_factor": _f32(cfg["rope_low_freq_factor"]),
            "high_freq_factor": _f32(cfg["rope_high_freq_factor"]),
            "original_max_position_embeddings": cfg["rope_original_max_pos"],
        }
    return c


def _f32(x):
    """The shortest decimal of an fp32 value (1e-05, not 9.99999975e-06): what a human config says."""
    x = float(np.float32(x))
    for digits in range(6, 10):
        s = float(f"{x:.{digits}g}")
        if float(np.float32(s)) == x:
            return s
    return x


# ---- compare dump (train.c compare_dump) -----------------------------------------------------


class CompareDump:
    """DIR/model.json, params.bin, batch.bin, logits.bin, grads.bin and summary.json."""

    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "model.json")) as f:
            self.model = json.load(f)
        with open(os.path.join(d, "summary.json")) as f:
            self.summary = json.load(f)
        m = self.model
        self.B, self.T, self.V = m["B"], m["T"], m["vocab_size"]
        n, N = param_count(m), self.B * self.T
        # The dump's tensor table must be the layout param_layout() computes (one copy of that logic).
        table = [(t["name"], tuple(t["shape"]), t["offset"], t["numel"], t["decay"]) for t in m["tensors"]]
        if table != param_layout(m):
            raise ValueError(f"{d}/model.json: the tensor table differs from ckpt_io.param_layout (model/llama.c changed?)")
        self.params = self._floats("params.bin", n)
        self.grads = self._floats("grads.bin", n)
        self.logits = self._floats("logits.bin", N * self.V).reshape(self.B, self.T, self.V)
        batch = np.fromfile(os.path.join(d, "batch.bin"), dtype="<i4")
        if batch.shape[0] != 2 * N:
            raise ValueError(f"{d}/batch.bin: {batch.shape[0]} int32, expected {2 * N} (inputs then targets, B*T each)")
        self.inputs, self.targets = batch[:N].reshape(self.B, self.T), batch[N:].reshape(self.B, self.T)

    def _floats(self, name, count):
        path = os.path.join(self.dir, name)
        a = np.fromfile(path, dtype="<f4")
        if a.shape[0] != count:
            raise ValueError(f"{path}: {a.shape[0]} floats, model.json implies {count}")
        return a


# ---- safetensors --------------------------------------------------------------------------------


def fp32_to_bf16_bits(x):
    """Round-to-nearest-even fp32 -> bf16 as uint16 bit patterns (what torch's .to(bfloat16) does);
    NaN stays a quiet NaN."""
    u = np.ascontiguousarray(x, dtype="<f4").view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return r


def write_safetensors(path, tensors, dtype="bf16", metadata=None):
    """Writes [(name, fp32 array)] to path in the safetensors layout: u64 header length, a JSON
    header (name -> dtype, shape, data_offsets), then the raw little-endian tensors back to back.
    Streams one tensor at a time, so an 8B model needs no more memory than its largest tensor."""
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be bf16 or fp32, got {dtype}")
    esize, tag = (2, "BF16") if dtype == "bf16" else (4, "F32")
    header, off = {"__metadata__": {"format": "pt", **(metadata or {})}}, 0
    for name, a in tensors:
        nbytes = a.size * esize
        header[name] = {"dtype": tag, "shape": list(a.shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, a in tensors:
            data = fp32_to_bf16_bits(a) if dtype == "bf16" else np.ascontiguousarray(a, dtype="<f4")
            f.write(data.tobytes())
    os.replace(tmp, path)

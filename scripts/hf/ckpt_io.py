"""ckpt_io.py: the Python side of the engine's file formats, shared by hf_compare.py, export_hf.py
and import_hf.py.

- hash64(): a numpy port of common/common.c's hash64, vectorized over many equal-length pieces, so that
  the 64 MiB chunks of a multi-GB checkpoint section are checked together;
- Checkpoint: reads and verifies a checkpoint file (docs/checkpoint_format.md); write_checkpoint()
  writes one, streaming its sections;
- parse_run_meta(): the "meta" section (train.c's RunMeta, with a LlamaConfig inside);
  pack_init_meta() / parse_init_meta(): the "init_meta" section of an imported model (train.c's InitMeta);
- param_layout(): the flat parameter layout of model/llama.c (names, shapes, offsets, decay);
- hf_tensors(): maps that flat buffer onto Hugging Face LlamaForCausalLM names;
- hf_config(): the LlamaForCausalLM config.json for a model config; model_config_from_hf() the
  inverse, refusing what the engine cannot represent;
- CompareDump: reads the directory `./train --compare-dump DIR` writes;
- write_safetensors(): streams tensors to a .safetensors file in fp32 or bf16; SafetensorsReader
  memory-maps one file or a sharded set and converts BF16/F16/F32 tensors to fp32.

Only numpy and the standard library are needed here (no torch), so an export runs anywhere.
"""
import json
import os
import struct

import numpy as np

# ---- hash64 (common/common.c) ----------------------------------------------------------------------------

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
    """common/common.c's hash64 of a bytes-like object or a uint8 array."""
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


CHUNK_BYTES = 1 << 26  # the checksum chunk the engine writes (64 MiB)


def _align64(x):
    return (x + 63) & ~63


def _as_bytes(piece):
    """A bytes-like object or a numpy array as a flat uint8 array (no copy when contiguous)."""
    if isinstance(piece, np.ndarray):
        return np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
    return np.frombuffer(piece, dtype=np.uint8)


def write_checkpoint(path, sections, step=0, chunk_bytes=CHUNK_BYTES):
    """Writes a checkpoint file holding sections [(name, pieces)] in that order (byte layout:
    docs/checkpoint_format.md). pieces is an iterable of bytes-like objects or numpy arrays whose
    bytes, concatenated, are the section, so a multi-GB section streams through one tensor at a
    time. The data goes to path.tmp behind a zeroed header and table; each section's checksum is
    then computed from that file, memory-mapped, with section_checksum (the reader's own code, all
    64 MiB chunks advancing together); the header and table are filled in last, and the file is
    fsynced and renamed to path, so path never holds a partial file. Returns {name: bytes}."""
    names = [name for name, _ in sections]
    for name in names:
        if not 1 <= len(name.encode()) <= 63:
            raise ValueError(f"checkpoint section name '{name}' must be 1 to 63 bytes")
    if len(set(names)) != len(names):
        raise ValueError(f"checkpoint section names repeat: {names}")
    n, table_end = len(sections), HEADER_BYTES + ENTRY_BYTES * len(sections)
    entries, tmp = [], path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(bytes(table_end))  # header and table: filled in once the checksums are known
            for name, pieces in sections:
                off = _align64(f.tell())
                f.write(bytes(off - f.tell()))
                for piece in pieces:
                    f.write(_as_bytes(piece))
                entries.append((name, off, f.tell() - off))
            file_bytes = f.tell()
            f.flush()
            head = bytearray(table_end)
            struct.pack_into("<8sIIqQQ", head, 0, CKPT_MAGIC, CKPT_VERSION, n, step, file_bytes, chunk_bytes)
            for i, (name, off, nbytes) in enumerate(entries):
                data = np.memmap(tmp, dtype=np.uint8, mode="r", offset=off, shape=(nbytes,)) if nbytes else np.zeros(0, np.uint8)
                e = HEADER_BYTES + ENTRY_BYTES * i
                head[e : e + 64] = name.encode().ljust(64, b"\0")
                struct.pack_into("<QQQ", head, e + 64, off, nbytes, section_checksum(data, chunk_bytes))
                del data
            struct.pack_into("<Q", head, 56, hash64(bytes(head), 0))  # computed with its own field zero
            f.seek(0)
            f.write(head)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return {name: nbytes for name, _, nbytes in entries}


# ---- RunMeta (train.c) ------------------------------------------------------------------------

# uint32 version; LlamaConfig {7 int, float norm_eps, float rope_theta, int rope_scaling, 3 float,
# int rope_original_max_pos}; char recipe[64]; 4 int32 (micro_batch, global_batch, seq_len, world);
# 4 bytes of padding (the uint64 after them is 8-aligned); uint64 seed, n_params; int64 tokens_seen.
_MODEL_FMT = "7i ffi fff i"  # LlamaConfig (model/llama_config.h), 56 bytes
_META_FMT = "<I " + _MODEL_FMT + " 64s 4i 4x QQq"
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


# InitMeta (train.c): what an imported model's "init_meta" section holds, uint32 version then the
# LlamaConfig, 60 bytes, all fields 4-byte little-endian. checkpoint.init_from compares it with the
# run's model config before it loads "params".
_INIT_META_FMT = "<I " + _MODEL_FMT
INIT_META_BYTES, INIT_META_VERSION = 60, 1
assert struct.calcsize(_INIT_META_FMT) == INIT_META_BYTES


def pack_init_meta(cfg):
    """A model config (MODEL_KEYS) -> the init_meta section's bytes."""
    return struct.pack(_INIT_META_FMT, INIT_META_VERSION, *(cfg[k] for k in MODEL_KEYS))


def parse_init_meta(buf, where="init_meta"):
    """init_meta bytes -> {"version", *MODEL_KEYS}."""
    if len(buf) != INIT_META_BYTES:
        raise CheckpointError(f"{where}: {len(buf)} bytes, train.c's InitMeta has {INIT_META_BYTES}")
    meta = dict(zip(["version"] + MODEL_KEYS, struct.unpack(_INIT_META_FMT, bytes(buf))))
    if meta["version"] != INIT_META_VERSION:
        raise CheckpointError(f"{where}: InitMeta version {meta['version']}, this reader knows {INIT_META_VERSION}")
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


# What the engine assumes when rope scaling is off: the unused scaling keys keep the presets' values.
_ROPE_OFF = {"rope_factor": 8.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0, "rope_original_max_pos": 8192}


def model_config_from_hf(c, where="config.json"):
    """The engine's model config (MODEL_KEYS) of a LlamaForCausalLM config.json, the inverse of
    hf_config(). Raises ValueError naming the field when the model is something the engine cannot
    represent: another architecture, tied embeddings, biases, an activation other than SiLU, a head
    size other than hidden_size / heads, RoPE scaling other than none or "llama3". Reads both the
    transformers 4.x keys (rope_theta, rope_scaling) and 5.x's rope_parameters."""

    def need(ok, msg):
        if not ok:
            raise ValueError(f"{where}: {msg}")

    archs = c.get("architectures") or []
    need(c.get("model_type") == "llama" and (not archs or "LlamaForCausalLM" in archs),
         f"model_type {c.get('model_type')!r}, architectures {archs}: only a LlamaForCausalLM (model_type 'llama') can be imported")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        need(isinstance(c.get(key), int) and c[key] > 0, f"{key} must be a positive integer, got {c.get(key)!r}")
    need(not c.get("tie_word_embeddings", False),
         "tie_word_embeddings is true: the engine has a separate output head (lm_head), only untied embeddings are supported")
    for key in ("attention_bias", "mlp_bias"):
        need(not c.get(key, False), f"{key} is true: the engine's projections have no biases")
    act = c.get("hidden_act", "silu")
    need(act == "silu", f"hidden_act {act!r}: the engine's MLP is SwiGLU with SiLU")
    D, H = c["hidden_size"], c["num_attention_heads"]
    KV = c.get("num_key_value_heads") or H
    need(D % H == 0, f"hidden_size {D} is not divisible by num_attention_heads {H}")
    need(H % KV == 0, f"num_attention_heads {H} is not divisible by num_key_value_heads {KV}")
    hd = c.get("head_dim") or D // H
    need(hd == D // H, f"head_dim {hd}: the engine's head size is hidden_size / num_attention_heads = {D // H}")

    rope_params = c.get("rope_parameters") or {}  # transformers 5.x
    theta = c.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    scaling = c.get("rope_scaling")
    if scaling is None and rope_params.get("rope_type", "default") != "default":
        scaling = rope_params
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    need(kind in ("default", "llama3"), f"rope_scaling type {kind!r}: the engine implements none or 'llama3'")
    cfg = {
        "vocab_size": c["vocab_size"], "dim": D, "n_layers": c["num_hidden_layers"], "n_heads": H, "n_kv_heads": KV,
        "ffn_dim": c["intermediate_size"], "max_seq_len": c.get("max_position_embeddings", 2048),
        "norm_eps": _f32(c.get("rms_norm_eps", 1e-6)), "rope_theta": _f32(theta), "rope_scaling": int(kind == "llama3"),
        **_ROPE_OFF,
    }
    if kind == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            need(key in scaling, f"rope_scaling of type 'llama3' has no {key!r}")
        cfg.update(rope_factor=_f32(scaling["factor"]), rope_low_freq_factor=_f32(scaling["low_freq_factor"]),
                   rope_high_freq_factor=_f32(scaling["high_freq_factor"]),
                   rope_original_max_pos=int(scaling["original_max_position_embeddings"]))
    return cfg


def model_yaml(cfg):
    """The `model:` section of an engine config for a model config (every key, so no preset matters)."""
    keys = MODEL_KEYS if cfg["rope_scaling"] else MODEL_KEYS[:10]
    vals = {k: ("true" if cfg[k] else "false") if k == "rope_scaling" else cfg[k] for k in keys}
    return "model:\n" + "".join(f"  {k}: {_f32(v) if isinstance(v, float) else v}\n" for k, v in vals.items())


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


class SafetensorsReader:
    """The tensors of a Hugging Face model directory: model.safetensors, or the shards that
    model.safetensors.index.json lists. Every header is read and checked on open (dtype, shape,
    offsets inside the file); fp32_blocks() memory-maps one tensor and converts it to fp32."""

    DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}

    def __init__(self, d):
        single, index = os.path.join(d, "model.safetensors"), os.path.join(d, "model.safetensors.index.json")
        weight_map = None
        if os.path.exists(single):
            files = ["model.safetensors"]
        elif os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: no 'weight_map'")
            files = sorted(set(weight_map.values()))
        else:
            raise CheckpointError(f"'{d}' has neither model.safetensors nor model.safetensors.index.json")
        self.tensors = {}  # name -> (path, absolute byte offset, dtype tag, shape)
        for fn in files:
            self._read_header(os.path.join(d, fn))
        if weight_map is not None:
            for name, fn in weight_map.items():
                if name not in self.tensors or os.path.basename(self.tensors[name][0]) != fn:
                    raise CheckpointError(f"{index}: '{name}' is mapped to {fn}, which does not hold it")

    def _read_header(self, path):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else None
            if n is None or n > min(size - 8, 1 << 28):
                raise CheckpointError(f"'{path}' is not a safetensors file (header length {n}, file {size} bytes)")
            try:
                head = json.loads(f.read(n))
            except ValueError as e:
                raise CheckpointError(f"'{path}': the safetensors header is not JSON ({e})") from None
        head.pop("__metadata__", None)
        for name, t in head.items():
            tag, shape, (begin, end) = t.get("dtype"), t.get("shape"), t.get("data_offsets", (0, -1))
            if tag not in self.DTYPES:
                raise CheckpointError(f"'{path}': tensor '{name}' has dtype {tag}; BF16, F16 or F32 can be imported")
            if end - begin != int(np.prod(shape)) * self.DTYPES[tag][1] or 8 + n + end > size:
                raise CheckpointError(f"'{path}': tensor '{name}' ({tag} {shape}) has data_offsets {[begin, end]} that "
                                      f"do not fit its shape or the file ({size} bytes)")
            if name in self.tensors:
                raise CheckpointError(f"'{path}': tensor '{name}' is also in '{self.tensors[name][0]}'")
            self.tensors[name] = (path, 8 + n + begin, tag, tuple(shape))

    def shape(self, name):
        return self.tensors[name][3]

    def fp32_blocks(self, name, block_bytes=1 << 26):
        """The tensor as fp32, flattened, in blocks of about block_bytes (whole rows): BF16 widens
        exactly (its bits are the top half of an fp32), F16 converts exactly, F32 is copied."""
        path, off, tag, shape = self.tensors[name]
        numel = int(np.prod(shape))
        if numel == 0:
            return
        src = np.memmap(path, dtype=self.DTYPES[tag][0], mode="r", offset=off, shape=(numel,))
        row = int(np.prod(shape[1:])) if len(shape) > 1 else numel
        step = max(1, block_bytes // (4 * row)) * row
        for i in range(0, numel, step):
            x = src[i : i + step]
            if tag == "BF16":
                yield (x.astype(np.uint32) << np.uint32(16)).view("<f4")
            else:
                yield x.astype("<f4")

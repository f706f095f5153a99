#!/usr/bin/env python3
"""Tokenizer throughput: `./train tokenize` against tiktoken (built from the same tokenizer.model and
pattern, no download) on the same corpus, and whether the ids agree.

    python3 scripts/dev/bench_tokenizer.py [--tokenizer DIR] [--corpus FILE.jsonl[.zst]] [--threads N]

Needs python3 with tiktoken and numpy (`python3 -m pip install tiktoken numpy`; the GPU machine's image
has both). A .zst corpus is read with the zstandard module when it is there, else with the system's
libzstd through ctypes. scripts/dev/bench_tokenize_scaling.py reuses these functions for its table.
"""
import argparse, ctypes, ctypes.util, io, json, os, re, subprocess, sys, tempfile, time


def read_texts(path):
    """The "text" of each line of a .jsonl or .jsonl.zst file."""
    raw = open(path, "rb").read()
    if path.endswith(".zst"):
        raw = zstd_decompress(raw)
    return [json.loads(l)["text"] for l in io.StringIO(raw.decode("utf-8")) if l.strip()]


def zstd_decompress(data):
    try:
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    except ImportError:
        pass
    lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_isError.restype = ctypes.c_uint
    size = lib.ZSTD_getFrameContentSize(data, ctypes.c_size_t(len(data)))
    if size >= 2**63:
        sys.exit("error: the .zst frame does not record its size; install zstandard (pip install zstandard)")
    out = ctypes.create_string_buffer(size)
    got = lib.ZSTD_decompress(out, ctypes.c_size_t(size), data, ctypes.c_size_t(len(data)))
    if lib.ZSTD_isError(got):
        sys.exit("error: zstd decompression failed")
    return out.raw[:got]


def tiktoken_encoding(tok_dir):
    """tiktoken's Encoding for Llama-3 from tokenizer.model and pat_str.txt (no download)."""
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        sys.exit("error: tiktoken is needed (python3 -m pip install tiktoken)")
    ranks = load_tiktoken_bpe(f"{tok_dir}/tokenizer.model")
    return tiktoken.Encoding(name="llama3", pat_str=open(f"{tok_dir}/pat_str.txt").read().strip(),
                             mergeable_ranks=ranks, special_tokens={})


def run_ours(train, tok_dir, corpus, threads, prefix, zstd=0, extra=()):
    """Runs ./train tokenize; returns (its own seconds, from the tokenizer loaded to the last shard
    written, and the process's wall seconds)."""
    t0 = time.perf_counter()
    out = subprocess.run([train, "tokenize", "--tokenizer", f"{tok_dir}/tokenizer.model", "--input", corpus,
                          "--output", prefix, "--zstd", str(zstd), "--threads", str(threads), *extra],
                         check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    m = re.search(r"MB of text in ([0-9.]+) s", out)
    return float(m.group(1)) if m else wall, wall


def read_tokens(prefix, split="train"):
    """The token stream of PREFIX_<split>_*.bin (raw shards), as a numpy array."""
    import glob
    import numpy as np
    parts = []
    for path in sorted(glob.glob(f"{prefix}_{split}_*.bin")):
        raw = open(path, "rb").read()
        if int.from_bytes(raw[20:24], "little") != 0:
            sys.exit(f"error: {path} is compressed; run with --zstd 0")
        width = int.from_bytes(raw[16:20], "little")
        parts.append(np.frombuffer(raw[64:], dtype=np.uint32 if width == 4 else np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32)


def framed(ref):
    """tiktoken's ids of each document framed BOS ... EOS, as the shards hold them."""
    import numpy as np
    return np.concatenate([np.concatenate([[128000], r, [128001]]) for r in ref]).astype(np.uint32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="../shared/data/tokenizer")
    ap.add_argument("--corpus", default="../shared/data/corpus/novels.jsonl.zst")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--train", default="./train")
    a = ap.parse_args()
    import numpy as np

    docs = read_texts(a.corpus)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        ours_s, wall_s = run_ours(a.train, a.tokenizer, a.corpus, a.threads, f"{tmp}/nv")
        ours = read_tokens(f"{tmp}/nv")
    enc = tiktoken_encoding(a.tokenizer)
    t0 = time.perf_counter()
    ref = enc.encode_ordinary_batch(docs, num_threads=a.threads)
    tik_s = time.perf_counter() - t0
    flat = framed(ref)
    print(f"{len(docs)} documents, {mb:.1f} MB, {len(flat):,} tokens, {a.threads} threads")
    print(f"./train tokenize (read, decompress, tokenize, write): {ours_s:.2f} s, {mb / ours_s:.1f} MB/s "
          f"({wall_s:.2f} s with start-up and the tokenizer's loading)")
    print(f"tiktoken encode_ordinary_batch (text already decoded): {tik_s:.2f} s, {mb / tik_s:.1f} MB/s")
    print(f"ids identical to tiktoken: {np.array_equal(ours, flat)}")


if __name__ == "__main__":
    main()

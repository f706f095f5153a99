#!/usr/bin/env python3
"""Tokenizer throughput: `./train tokenize` against tiktoken (built from the same tokenizer.model and
pattern, no download) on the same corpus, and whether the ids agree.

    python3 scripts/dev/bench_tokenizer.py [--tokenizer DIR] [--corpus FILE.jsonl.zst] [--threads N]
"""
import argparse, io, json, os, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("--tokenizer", default="../shared/data/tokenizer")
ap.add_argument("--corpus", default="../shared/data/corpus/novels.jsonl.zst")
ap.add_argument("--threads", type=int, default=os.cpu_count())
a = ap.parse_args()
try:
    import numpy as np, tiktoken, zstandard
    from tiktoken.load import load_tiktoken_bpe
except ImportError as e:
    sys.exit(f"error: {e.name} is needed (pip install tiktoken zstandard numpy)")

with open(a.corpus, "rb") as f:
    docs = [json.loads(l)["text"] for l in io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), "utf-8") if l.strip()]
mb = sum(len(d.encode()) for d in docs) / 1e6

with tempfile.TemporaryDirectory() as tmp:
    t0 = time.perf_counter()
    subprocess.run(["./train", "tokenize", "--tokenizer", f"{a.tokenizer}/tokenizer.model", "--input", a.corpus,
                    "--output", f"{tmp}/nv", "--zstd", "0", "--threads", str(a.threads), "--quiet"], check=True)
    ours_s = time.perf_counter() - t0
    raw = open(f"{tmp}/nv_train_000000.bin", "rb").read()
    width = int.from_bytes(raw[16:20], "little")
    ours = np.frombuffer(raw[64:], dtype=np.uint32 if width == 4 else np.uint16)

ranks = load_tiktoken_bpe(f"{a.tokenizer}/tokenizer.model")
enc = tiktoken.Encoding(name="llama3", pat_str=open(f"{a.tokenizer}/pat_str.txt").read().strip(),
                        mergeable_ranks=ranks, special_tokens={})
t0 = time.perf_counter()
ref = enc.encode_ordinary_batch(docs, num_threads=a.threads)
tik_s = time.perf_counter() - t0
flat = np.concatenate([np.concatenate([[128000], r, [128001]]) for r in ref]).astype(ours.dtype)
print(f"{len(docs)} documents, {mb:.1f} MB, {len(flat):,} tokens, {a.threads} threads")
print(f"./train tokenize (read, decompress, tokenize, write): {ours_s:.2f} s, {mb / ours_s:.1f} MB/s")
print(f"tiktoken encode_ordinary_batch (text already decoded): {tik_s:.2f} s, {mb / tik_s:.1f} MB/s")
print(f"ids identical to tiktoken: {np.array_equal(ours, flat)}")

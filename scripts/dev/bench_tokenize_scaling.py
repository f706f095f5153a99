#!/usr/bin/env python3
"""How `./train tokenize` scales with threads, against tiktoken's encode_ordinary_batch with the same
num_threads on the same documents, and whether the ids are tiktoken's.

    python3 scripts/dev/bench_tokenize_scaling.py [--tokenizer DIR] [--corpus novels.jsonl.zst]
        [--threads 1,2,4,8,16] [--repeat 3] [--zstd 0] [--stages] [--stages-threads N]

The documents are web-like: every third novel of the corpus (../shared/data/corpus/novels.jsonl.zst)
cut into 4,000-character pieces, 6,262 documents, 25.0 MB, written as JSON lines into a scratch folder
(on /dev/shm when it exists, so that disk speed and fsync stay out of the figures). Thread counts
above the machine's cores are left out. Each figure is the best of --repeat runs. ./train's time is
its own (the summary line's: from the tokenizer loaded to the last shard written, which leaves out
the ~25 ms of loading the tokenizer, as tiktoken's Encoding is built before it is timed); the
process's wall time is shown too. --zstd 0 (raw shards) by default: tiktoken compresses nothing, and
one shard's zstd stream is serial (docs/data.md). Self-contained: python3 with tiktoken and numpy
(`python3 -m pip install tiktoken numpy`; the GPU machine's image has both), no network. On the GPU
machine carry the tokenizer folder (tokenizer.model, pat_str.txt) and the corpus in the repo, e.g.
under .deps/, and pass --tokenizer and --corpus. --stages: then one run on one thread (--stages-threads N: on N) with
TOKENIZE_STAGES=1, printing where its time went per kind of task (docs/data.md's stage shares), for
the output with --zstd 0 and with --zstd 3.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_tokenizer as bt  # noqa: E402


def web_like(novels, every=3, size=4000):
    return [n[i:i + size] for n in novels[::every] for i in range(0, len(n), size)]


def physical_cores():
    """What the CPUs are: distinct (package, core) pairs of /proc/cpuinfo, so that 16 CPUs of 8 cores with
    two hardware threads each show as such."""
    try:
        pairs, pkg = set(), None
        for line in open("/proc/cpuinfo"):
            key, _, val = line.partition(":")
            if key.strip() == "physical id":
                pkg = val.strip()
            elif key.strip() == "core id":
                pairs.add((pkg, val.strip()))
        return f"{len(pairs)} physical" if pairs else "physical cores unknown"
    except OSError:
        return "physical cores unknown"


class Clocks:
    """The cores' clock while ./train runs: /proc/cpuinfo's "cpu MHz" every 20 ms, the mean of the t
    fastest CPUs per sample, so that a machine that runs 16 threads at a lower clock than one shows it
    (where the file's figures are static, as on some VMs, the column says nothing)."""

    def __init__(self, top):
        self.top, self.samples, self.stop = top, [], threading.Event()

    def _run(self):
        while not self.stop.wait(0.02):
            try:
                mhz = sorted((float(l.split(":")[1]) for l in open("/proc/cpuinfo") if l.startswith("cpu MHz")),
                             reverse=True)
            except (OSError, ValueError):
                return
            if mhz:
                self.samples.append(sum(mhz[:self.top]) / len(mhz[:self.top]))

    def __enter__(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def mean(self):
        return f"{sum(self.samples) / len(self.samples):.0f}" if self.samples else "?"


def best(fn, repeat):
    return min(fn() for _ in range(repeat))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="../shared/data/tokenizer")
    ap.add_argument("--corpus", default="../shared/data/corpus/novels.jsonl.zst")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--zstd", type=int, default=0)
    ap.add_argument("--train", default="./train")
    ap.add_argument("--stages", action="store_true")
    ap.add_argument("--stages-threads", type=int, default=1, help="threads of the --stages runs (1)")
    a = ap.parse_args()
    import numpy as np

    cores = os.cpu_count()
    threads = [t for t in map(int, a.threads.split(",")) if t <= cores]
    docs = web_like(bt.read_texts(a.corpus))
    mb = sum(len(d.encode()) for d in docs) / 1e6
    enc = bt.tiktoken_encoding(a.tokenizer)
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="bench_tokenize_", dir=scratch)
    try:
        corpus = f"{tmp}/web.jsonl"
        with open(corpus, "w") as f:
            for i, d in enumerate(docs):
                f.write(json.dumps({"id": i, "text": d}) + "\n")
        want = bt.framed(enc.encode_ordinary_batch(docs, num_threads=max(threads)))
        print(f"{len(docs)} documents, {mb:.1f} MB of text, {len(want):,} tokens; {cores} cores ({physical_cores()}); "
              f"best of {a.repeat}; ./train tokenize --zstd {a.zstd}, output in {scratch or 'the temp folder'}")
        print()
        print("| threads | ./train MB/s | speedup | ./train MB/s incl. start-up | tiktoken MB/s | tiktoken speedup "
              "| ./train / tiktoken | ids identical | MHz during ./train |")
        print("|---|---|---|---|---|---|---|---|---|")
        base = tik_base = None
        for t in threads:
            runs = []
            with Clocks(t) as clocks:
                for _ in range(a.repeat):
                    shutil.rmtree(f"{tmp}/out", ignore_errors=True)
                    os.makedirs(f"{tmp}/out")
                    runs.append(bt.run_ours(a.train, a.tokenizer, corpus, t, f"{tmp}/out/w", zstd=a.zstd))
            ours_s, wall_s = min(r[0] for r in runs), min(r[1] for r in runs)
            same = np.array_equal(bt.read_tokens(f"{tmp}/out/w"), want) if a.zstd == 0 else None

            def tik():
                t0 = time.perf_counter()
                enc.encode_ordinary_batch(docs, num_threads=t)
                return time.perf_counter() - t0

            tik_s = best(tik, a.repeat)
            ours, tik_mb = mb / ours_s, mb / tik_s
            base, tik_base = base or ours, tik_base or tik_mb
            ids = "yes" if same else "no" if same is not None else "not checked (zstd)"
            print(f"| {t} | {ours:.1f} | {ours / base:.2f}x | {mb / wall_s:.1f} | {tik_mb:.1f} "
                  f"| {tik_mb / tik_base:.2f}x | {ours / tik_mb:.2f}x | {ids} | {clocks.mean()} |")
            sys.stdout.flush()
        for z in (0, 3) if a.stages else ():
            shutil.rmtree(f"{tmp}/out", ignore_errors=True)
            os.makedirs(f"{tmp}/out")
            p = subprocess.run([a.train, "tokenize", "--tokenizer", f"{a.tokenizer}/tokenizer.model", "--input", corpus,
                                "--output", f"{tmp}/out/w", "--zstd", str(z), "--threads", str(a.stages_threads), "--quiet"],
                               env=dict(os.environ, TOKENIZE_STAGES="1"), check=True, capture_output=True, text=True)
            print(f"\n{a.stages_threads} thread(s), --zstd {z}, TOKENIZE_STAGES=1:")
            print("\n".join(l for l in p.stderr.splitlines() if l.startswith("tokenize stage")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

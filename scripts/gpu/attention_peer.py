#!/usr/bin/env python3
"""Causal attention through cuDNN as PyTorch runs it, at the engine's shape, for issue 30's comparison
with `./train CONFIG --bench-attention` (run/bench_attention.c) in the same device call.

    python3 scripts/gpu/attention_peer.py [--batch 1] [--seq 8192] [--heads 32] [--kv-heads 8] [--head-dim 128]
        [--steps 10] [--backend cudnn|flash|efficient]

torch.nn.functional.scaled_dot_product_attention with is_causal=True on BF16 q, k, v laid out as a
model's projections leave them ([B, T, heads, hd] viewed as [B, heads, T, hd]), restricted to one SDPA
backend (cudnn: PyTorch's cuDNN attention). GQA as enable_gqa=True where the backend takes it, else k and
v repeated to every query head once, before timing (the same FLOPs, more K/V reads; the copies and the
dK/dV sum over heads untimed; the line says which). Each figure is
the median of --steps individually synced calls after two warm-ups, timed with CUDA events: the forward
alone, and the backward alone (torch.autograd.grad of the output against q, k, v with a fixed dout,
after an untimed forward). FLOPs as FlashAttention and run/bench_attention.c count them: 4 hd per
(query, key) pair and head forward, 2.5 times that backward, over the causal triangle. Prints the cuDNN
version PyTorch loaded, then `PEER attention ...` lines. PyTorch's deterministic setting is left as is
(its cuDNN attention runs its default algorithm); compare with the engine's parallel.deterministic false
for like with like, and with the default for what determinism costs.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def timed(fn, steps):
    """Median ms of `steps` synced calls of fn after two warm-ups."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="cudnn")
    a = ap.parse_args()
    B, T, H, KV, hd = a.batch, a.seq, a.heads, a.kv_heads, a.head_dim
    torch.manual_seed(0)
    dev = torch.device("cuda")
    # as the projections leave them: [B, T, heads, hd], viewed as [B, heads, T, hd]
    q = torch.randn(B, T, H, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    k = torch.randn(B, T, KV, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    v = torch.randn(B, T, KV, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    dout = torch.randn(B, T, H, hd, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    print(f"attention_peer: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}, B={B} T={T} H={H} KV={KV} hd={hd}, SDPA backend {a.backend}, "
          f"deterministic algorithms {torch.are_deterministic_algorithms_enabled()}")

    gqa = "enable_gqa"
    kv = {"k": k, "v": v}  # what attend() passes: k and v, or their copies repeated to every query head

    def attend():
        if gqa == "enable_gqa":
            return F.scaled_dot_product_attention(q, kv["k"], kv["v"], is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, kv["k"], kv["v"], is_causal=True)

    with sdpa_kernel([BACKENDS[a.backend]]):
        try:
            attend()
        except RuntimeError as e:  # the backend does not take GQA: repeat k and v, once, before any timing
            print(f"attention_peer: enable_gqa refused by {a.backend} ({str(e).splitlines()[0][:120]}); "
                  f"k and v repeated to {H} heads before timing (the copies and the dK/dV sum over heads, "
                  f"which the engine's GQA attention includes, are not timed)")
            gqa = "repeated"
            rep = H // KV
            kv = {n: t.detach().repeat_interleave(rep, 1).requires_grad_() for n, t in (("k", k), ("v", v))}
        fwd_ms = timed(lambda: attend(), a.steps)
        state = {}

        def backward():
            torch.autograd.grad(state["out"], (q, kv["k"], kv["v"]), dout)

        def fresh_forward():
            state["out"] = attend()

        # the backward alone: an untimed forward before each timed backward
        ts = []
        for s in range(a.steps + 2):
            fresh_forward()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            backward()
            e1.record()
            torch.cuda.synchronize()
            if s >= 2:
                ts.append(e0.elapsed_time(e1))
        bwd_ms = statistics.median(ts)

    pairs = B * T * (T + 1) / 2
    f = 4.0 * pairs * H * hd
    print(f"| attention | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s |\n|---|---|---|---|---|---|")
    print(f"| PyTorch SDPA {a.backend} ({gqa}) | {fwd_ms:.3f} | {bwd_ms:.3f} | {f / fwd_ms * 1e-9:.0f} | "
          f"{2.5 * f / bwd_ms * 1e-9:.0f} | {3.5 * f / (fwd_ms + bwd_ms) * 1e-9:.0f} |")
    print(f"PEER attention torch-sdpa-{a.backend} cuDNN {torch.backends.cudnn.version()} causal  fwd {fwd_ms:.3f} ms "
          f"({f / fwd_ms * 1e-9:.0f} TFLOP/s)  bwd {bwd_ms:.3f} ms ({2.5 * f / bwd_ms * 1e-9:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()

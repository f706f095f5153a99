"""The PyTorch peers of the throughput benchmark, each measured both ways the engine's --bench is:
with the optimizer every micro-batch, and amortized over gradient accumulation (forward + backward
per micro-batch, one optimizer step per ACCUM of them: the paper's 512-sequence batch).

    python3 scripts/gpu/torch_peers.py --precision bf16|float8 [--recipe tensorwise|rowwise]
                                       [--seq 8192] [--layers 2,4] [--reps 6] [--accum 512]

HF transformers LlamaForCausalLM with Llama-3 8B shapes, BF16 autocast over FP32 master weights,
fused AdamW, per-block torch.compile (as torchtitan does); float8 converts every linear but the
output head with torchao's float8 training (Float8LinearConfig.from_recipe_name(RECIPE); the FP8
recipe a PyTorch user picks on Hopper; the GPU machine has no torchao: carry its wheel, see
scripts/gpu/peer_wheels.sh). The full 8B model with FP32 Adam does not fit one GPU, so it times two
depths and extrapolates linearly to 32 layers, as ../shared/peers/torch_llama_peer.py (the
project's reference peer, copied unchanged to scripts/gpu/torch_llama_peer.py) and
../shared/peers/torch_fp8_peer.py do; this script is those two with the amortized figure added.

Prints, per precision, the per-layer times and two lines in the engine's BENCH form:
    PEER pytorch-bf16 optimizer every step:      N tok/s/GPU  MFU  x%
    PEER pytorch-bf16 optimizer amortized /512 : N tok/s/GPU  MFU  x%
MFU by the paper's formula: 6 (N - N_emb) + 12 L H d_head T FLOPs per token, 989 TFLOP/s peak.
--tiny (with --device cpu --no-compile) runs a small model for a smoke test of the script itself.
"""
import argparse
import time

import torch
import torch._dynamo
from transformers import LlamaConfig, LlamaForCausalLM

torch._dynamo.config.allow_unspec_int_on_nn_module = True
torch._dynamo.config.recompile_limit = 64

ap = argparse.ArgumentParser()
ap.add_argument("--precision", choices=["bf16", "float8"], default="bf16")
ap.add_argument("--recipe", default="tensorwise", help="float8: torchao Float8LinearConfig recipe name")
ap.add_argument("--seq", type=int, default=8192)
ap.add_argument("--layers", default="2,4", help="two increasing depths")
ap.add_argument("--reps", type=int, default=6)
ap.add_argument("--accum", type=int, default=512, help="micro-batches per optimizer step, amortized")
ap.add_argument("--device", default="cuda")
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--tiny", action="store_true", help="a small model (smoke test)")
ap.add_argument("--attention-profile", action="store_true",
                help="instead of the timings: the SDPA ops' device time inside the step at the first depth")
ap.add_argument("--sdpa", choices=["default", "cudnn"], default="default",
                help="cudnn: PyTorch's cuDNN attention alone (the other SDPA backends off)")
args = ap.parse_args()
if args.sdpa == "cudnn":
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(True)
la, lb = (int(v) for v in args.layers.split(","))
if not 0 < la < lb:
    raise SystemExit(f"--layers {args.layers}: expected two increasing depths like 2,4")
T = args.seq
N, N_EMB, PEAK = 8_030_261_248, 525_336_576, 989e12
FLOPS_PER_TOKEN = 6 * (N - N_EMB) + 12 * 32 * 32 * 128 * T
dev = torch.device(args.device)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps):
    for _ in range(2):  # warm-up (compilation, autotuning, allocator)
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps


def build(n_layers):
    """The model at n_layers, its optimizer and input, and one accumulation micro-batch and one step."""
    if args.tiny:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(T, 128),
                          tie_word_embeddings=False, use_cache=False)
    else:
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=n_layers,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=max(T, 8192),
                          rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev)
    if args.precision == "float8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(args.recipe),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    if not args.no_compile:
        for i, block in enumerate(model.model.layers):
            model.model.layers[i] = torch.compile(block)
    x = torch.randint(0, cfg.vocab_size, (1, T), device=dev)

    def fwd_bwd():  # one accumulation micro-batch: the gradients add up in .grad
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()

    def step():  # the optimizer every micro-batch
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, fwd_bwd, step


def free_cache():
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def depth_times(n_layers):
    """Seconds per micro-batch at n_layers: the whole step, forward + backward alone, the optimizer alone."""
    model, opt, fwd_bwd, step = build(n_layers)
    t_step = timed(step, args.reps)
    fwd_bwd()  # gradients to step on
    t_fb = timed(fwd_bwd, args.reps)
    t_opt = timed(opt.step, args.reps)  # the gradients stay: every call does the full update
    del model, opt, fwd_bwd, step
    free_cache()
    return t_step, t_fb, t_opt


def attention_in_step(n_layers, steps=2):
    """The SDPA ops' device time inside the training step (torch.profiler over `steps` steps after warm-up):
    per call of the forward and of the backward, and which ATen ops (so which backend) ran. For issue 30's
    comparison of attention inside a step, the engine's profile table beside PyTorch's own."""
    from torch.profiler import ProfilerActivity, profile
    model, opt, fwd_bwd, step = build(n_layers)
    for _ in range(3):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    del model, opt, fwd_bwd, step
    free_cache()
    rows = {}
    for e in prof.key_averages():
        k = e.key
        # the backends' ops (cudnn, flash, efficient) and the wrappers that call them
        if k.startswith("aten::_") and "attention" in k and ("cudnn" in k or "flash" in k or "efficient" in k):
            t = getattr(e, "device_time_total", None)
            if t is None:
                t = e.cuda_time_total
            rows[k] = (e.count, t / 1e3)  # ms over all calls
    # aten::_scaled_dot_product_*_attention* wraps the backend op (aten::_cudnn_attention_forward, ...): the
    # same kernels, so the wrapper's row goes where the backend's own is there
    inner = [k for k in rows if not k.startswith("aten::_scaled_dot_product")]
    return {k: rows[k] for k in inner} if inner else rows


if args.attention_profile:
    heads, hd = (4, 16) if args.tiny else (32, 128)
    pairs = T * (T + 1) / 2  # the causal triangle, as attention_peer.py and run/bench_attention.c count
    fwd_flop = 4 * hd * pairs * heads
    rows = attention_in_step(la)
    print(f"attention in the step ({'pytorch-bf16' if args.precision == 'bf16' else args.precision}, "
          f"{la} layers, SDPA {args.sdpa}):")
    for k, (n, ms) in sorted(rows.items()):
        bwd = "backward" in k
        tf = (2.5 if bwd else 1.0) * fwd_flop * n / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
        print(f"PEER attention in step {k}: {n} calls, {ms / n:.3f} ms per call, {tf:.0f} TFLOP/s")
    if not rows:
        print("PEER attention in step: no SDPA backend op in the profile")
    raise SystemExit(0)

name = "pytorch-bf16" if args.precision == "bf16" else f"pytorch-float8-{args.recipe}"
where = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"
print(f"torch {torch.__version__} on {where}, seq {T}, {name}{'' if args.no_compile else ' compiled'}")
ta, tb = depth_times(la), depth_times(lb)
t32 = []
for i, what in enumerate(["step", "fwd+bwd", "optimizer"]):
    per_layer = (tb[i] - ta[i]) / (lb - la)
    t32.append(ta[i] + (32 - la) * per_layer)
    print(f"{name}: {what}: per-layer {per_layer * 1e3:.2f} ms, 32 layers {t32[i] * 1e3:.1f} ms")
every = T / t32[0]
amort = T / (t32[1] + t32[2] / args.accum)
print(f"PEER {name} optimizer every step:      {every:8.0f} tok/s/GPU  MFU {100 * every * FLOPS_PER_TOKEN / PEAK:5.1f}%")
print(f"PEER {name} optimizer amortized /{args.accum:<4d}: {amort:8.0f} tok/s/GPU  "
      f"MFU {100 * amort * FLOPS_PER_TOKEN / PEAK:5.1f}%")

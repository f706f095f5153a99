"""(A copy of ../shared/peers/torch_llama_peer.py, the project's reference peer, unchanged but for this note; kept
here so that scripts/gpu/gpu_check.sh can run it on the GPU machine, where ../shared is not present.)

PyTorch peer for the throughput benchmark: HF transformers LlamaForCausalLM with Llama-3 8B shapes.

One GPU, no communication, BF16 autocast over FP32 master weights, fused AdamW stepped every
micro-batch, per-block torch.compile (as torchtitan does). The full 8B model with FP32 Adam does
not fit one GPU, so it times 2 and 4 layers and extrapolates linearly to 32.

    python3 torch_llama_peer.py [--seq 8192] [--eager] [--layers 2,4] [--reps 6]

Prints one line per mode: per-layer ms, extrapolated 32-layer step ms, tokens/s/GPU, and MFU by
the paper's formula (6*(N - N_emb) + 12*L*H*d_head*S FLOPs per token, 989 TFLOP/s peak).
"""
import argparse, time, torch
import torch._dynamo
from transformers import LlamaConfig, LlamaForCausalLM

torch._dynamo.config.allow_unspec_int_on_nn_module = True
torch._dynamo.config.recompile_limit = 64

ap = argparse.ArgumentParser()
ap.add_argument("--seq", type=int, default=8192)
ap.add_argument("--layers", default="2,4")
ap.add_argument("--reps", type=int, default=6)
ap.add_argument("--eager", action="store_true", help="also time without torch.compile")
args = ap.parse_args()
T = args.seq
N, N_EMB, PEAK = 8_030_261_248, 525_336_576, 989e12
FLOPS_PER_TOKEN = 6 * (N - N_EMB) + 12 * 32 * 32 * 128 * T


def step_time(n_layers, compiled):
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=n_layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=max(T, 8192), rope_theta=500000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if compiled:
        for i, block in enumerate(model.model.layers):
            model.model.layers[i] = torch.compile(block)
    x = torch.randint(0, 128256, (1, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.reps):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.reps
    del model, opt
    torch.cuda.empty_cache()
    return dt


print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}, seq {T}")
la, lb = (int(v) for v in args.layers.split(","))
for compiled in ([False, True] if args.eager else [True]):
    ta, tb = step_time(la, compiled), step_time(lb, compiled)
    per_layer = (tb - ta) / (lb - la)
    t32 = ta + (32 - la) * per_layer
    tps = T / t32
    print(f"pytorch-bf16 {'compiled' if compiled else 'eager'}: per-layer {per_layer*1e3:.2f} ms, "
          f"32-layer step {t32*1e3:.0f} ms, {tps:,.0f} tok/s/GPU, MFU {tps*FLOPS_PER_TOKEN/PEAK:.1%}")

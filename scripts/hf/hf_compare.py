#!/usr/bin/env python3
"""hf_compare.py: checks the engine against Hugging Face transformers' LlamaForCausalLM, a Llama
implementation nobody here wrote, and checks the checkpoint -> HF export.

    python3 scripts/hf/hf_compare.py [--backend cpu|cuda] [--device cpu|cuda] [--train ./train] [--keep DIR]

1. `./train --compare-dump` on a small model that exercises every feature (GQA, Llama-3.1 RoPE
   scaling with all three frequency bands in play, untied head, several layers) writes its initial
   parameters, one batch, the logits, loss and gradients, and 10 AdamW steps on that batch.
2. The same parameters go into LlamaForCausalLM (fp32, eager attention), which computes the same
   things: logits, loss, every parameter's gradient, and 10 torch.optim.AdamW steps (decay and
   no-decay groups, clip_grad_norm_, the engine's per-step learning rates).
3. Export: a 3-step run saves a checkpoint; scripts/hf/export_hf.py converts it; from_pretrained loads
   it; its logits must match the engine's on the checkpoint's parameters (`--resume --compare-dump`).

The reference is always HF in fp32. HF under torch.autocast(bfloat16) is measured against that
reference too and printed beside the engine's error: it is what "correct BF16" costs, the yardstick
for the CUDA backend (see Tolerances below). Prints tables, then "hf_compare: PASS" (exit 0) or
"hf_compare: FAIL ..." (exit 1).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402
import export_hf  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The comparison run: configs/tiny.yaml with these overrides. head_dim 32 and rope_theta 500000 give
# wavelengths 6.3 (< 32/4: kept), 14.3 (between: interpolated) and >= 32.4 (> 32/1: divided by 8)
# against rope_original_max_pos 32, so every band of the Llama-3.1 scaling is used at seq 128.
# 8 query heads share 2 KV heads (GQA 4:1). grad_clip 0.5 sits inside the range of the gradient
# norms of the 10 steps, so some steps clip and some do not; the warmup of 3 then cosine decay
# gives 10 distinct learning rates.
COMPARE_SETS = [
    "seed=1234",
    "model.vocab_size=1024", "model.dim=256", "model.n_layers=2", "model.n_heads=8", "model.n_kv_heads=2",
    "model.ffn_dim=688", "model.max_seq_len=128", "model.norm_eps=1e-5", "model.rope_theta=500000",
    "model.rope_scaling=true", "model.rope_factor=8", "model.rope_low_freq_factor=1",
    "model.rope_high_freq_factor=4", "model.rope_original_max_pos=32",
    "batch.micro_batch=2", "batch.global_batch=2", "batch.seq_len=128",
    "data.train=synthetic", "data.val=", "eval.interval=0",
    "optim.lr=1e-3", "optim.beta1=0.9", "optim.beta2=0.95", "optim.eps=1e-8", "optim.weight_decay=0.1",
    "optim.grad_clip=4", "schedule.type=cosine", "schedule.warmup_steps=3", "schedule.total_steps=10",
    "schedule.min_lr_ratio=0.1",
]
EXPORT_STEPS = 3  # the export check trains this many steps, then exports the checkpoint

# ---- Tolerances -------------------------------------------------------------------------------
# metric: (cpu limit, cuda cap, cuda floor).
#
# CPU backend (fp32 everywhere) vs HF fp32: both compute the same fp32 math and differ only in
# summation order (our blocked GEMMs and chunked cross-entropy vs MKL/oneDNN) and in RoPE angles
# (ours t*inv_freq in double, HF's rounded to fp32: below 1e-5 rad at positions < 128). Each
# rounding is ~6e-8 relative; over dot products of 256-688 terms and two layers they add up to
# ~1e-6: measured 8e-7 relative on the logits, 0.7-1.6e-6 on every gradient, 1e-6..5e-6 on the
# 10 losses (Adam normalizes updates, so a 1e-6 gradient error stays a 1e-6 update error) and
# 1.5e-5 at most on the global gradient norm. The limits leave 10-60x margin; a wrong transpose,
# scale or RoPE pairing gives errors of order 0.1-1 (swapping gate_proj and up_proj: 0.3 on the
# logits and every gradient, though only 2.4e-3 on the loss, which is why everything is compared).
#
# CUDA backend (BF16 weights and activations, fp32 master weights, gradients and optimizer): its
# error is dominated by bf16 rounding (2^-9 relative per operand), which no summation order can
# reproduce, so no fixed tight bound exists. The yardstick is HF itself under autocast(bf16) vs HF
# fp32 on the same batch: the engine must be within FACTOR x that error (+ a small floor for
# quantities where bf16 happens to be nearly exact). Factor 3: the engine rounds in other places
# (e.g. it keeps more activations in bf16 than autocast, uses a flash-attention kernel with a bf16
# probability matrix and a bf16 output head), which legitimately changes the error by a small
# factor, whereas a real bug (wrong scale, dropped term, race) shows up as an error of order 1 and
# far beyond 3x. The absolute caps bound the damage even if HF-bf16 itself were unexpectedly bad.
# The loss floors are larger: a mean over 256 tokens lets HF-bf16's per-token errors cancel by
# chance (2e-5 measured at step 0, against 7e-3 relative on the logits), while a bf16 output head
# can shift every token's loss the same way by ~1e-3.
FACTOR = 3.0
TOL = {
    "logits_rel": (1e-5, 5e-2, 1e-3),     # relative L2 of the [B, T, V] logits
    "logits_max": (1e-4, 0.25, 1e-2),     # max abs difference of a logit
    "loss_abs": (1e-5, 2e-2, 5e-3),       # |loss - reference|
    "grad_rel": (1e-4, 5e-2, 1e-3),       # relative L2 per parameter tensor (per layer)
    "step_loss_abs": (2e-5, 2e-2, 5e-3),  # max over the 10 AdamW steps of |loss - reference|
    "grad_norm_rel": (1e-4, 5e-2, 1e-3),  # max over the 10 steps of the relative global-norm error
}


def limit(metric, backend, hf_bf16):
    """The bound our error must meet for this metric: tight on the CPU, relative to bf16 on CUDA."""
    cpu, cap, floor = TOL[metric]
    return cpu if backend == "cpu" else min(cap, FACTOR * hf_bf16 + floor)


def rel_l2(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


class Checks:
    """Collects named pass/fail results; failures are listed in the final line."""

    def __init__(self):
        self.failed = []
        self.count = 0

    def add(self, name, ok):
        self.count += 1
        if not ok:
            self.failed.append(name)
        return "ok" if ok else "FAIL"

    def finish(self, tool):
        """The closing line: PASS, or FAIL naming the failed checks (exit status 1)."""
        if self.failed:
            print(f"{tool}: FAIL ({len(self.failed)} of {self.count} checks: {'; '.join(self.failed)})")
            sys.exit(1)
        print(f"{tool}: PASS ({self.count} checks)")


# ---- running the engine ---------------------------------------------------------------------


def run_train(args, extra, what):
    cmd = [args.train, os.path.join(REPO, "configs", "tiny.yaml")]
    for s in COMPARE_SETS + [f"parallel.backend={args.backend}"]:
        cmd += ["--set", s]
    cmd += extra
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
        sys.exit(f"hf_compare: FAIL ({what}: ./train exited {p.returncode})")
    return p.stdout


# ---- the HF side ------------------------------------------------------------------------------


def build_hf(cfg, params, device):
    """LlamaForCausalLM in fp32 with eager attention, from the same config.json export writes."""
    config = LlamaConfig.from_dict(ckpt_io.hf_config(cfg))
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    state = {name: torch.from_numpy(np.array(t)) for name, _, _, _, t in ckpt_io.hf_tensors(params, cfg)}
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=torch.float32)


def forward(model, inputs, targets, ignore_index, bf16):
    """(logits fp32 [B, T, V], mean cross-entropy over targets != ignore_index), as the engine defines
    them: explicit targets (no shift), mean over counted targets, computed in fp32 from the logits."""
    dev = next(model.parameters()).device
    ids = torch.as_tensor(inputs, dtype=torch.long, device=dev)
    tgt = torch.as_tensor(targets, dtype=torch.long, device=dev)
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids, use_cache=False).logits
    logits = logits.float()
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1), ignore_index=ignore_index)
    return logits, loss


def logits_loss_grads(model, dump, bf16):
    model.zero_grad(set_to_none=True)
    logits, loss = forward(model, dump.inputs, dump.targets, dump.model["ignore_index"], bf16)
    loss.backward()
    grads = {n: p.grad.detach().cpu().numpy().copy() for n, p in model.named_parameters()}
    return logits.detach().cpu().numpy(), loss.item(), grads


def adamw_steps(model, dump, bf16):
    """10 steps of torch.optim.AdamW on the dump's batch, as train.c's compare_dump runs them.
    Returns the losses before each update and the pre-clip global gradient norms."""
    m, s = dump.model, dump.summary
    decay = {name: d for name, _, _, d, _ in ckpt_io.hf_tensors(dump.params, m)}
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if decay[n]], "weight_decay": m["weight_decay"]},
              {"params": [p for n, p in named if not decay[n]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=s["lrs"][0], betas=(m["beta1"], m["beta2"]), eps=m["eps"], foreach=False)
    losses, norms = [], []
    for lr in s["lrs"]:
        opt.zero_grad(set_to_none=True)
        _, loss = forward(model, dump.inputs, dump.targets, m["ignore_index"], bf16)
        loss.backward()
        clip = m["grad_clip"] if m["grad_clip"] > 0 else float("inf")
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        losses.append(loss.item())
    return losses, norms


# ---- the comparisons --------------------------------------------------------------------------


def compare_forward(dump, model, args, checks, title):
    """Logits and loss of the engine and of HF-bf16, both against HF fp32. Returns the rows."""
    ref_logits, ref_loss, _ = logits_loss_grads(model, dump, bf16=False)
    b16_logits, b16_loss, _ = logits_loss_grads(model, dump, bf16=True)
    ours_loss = dump.summary["loss"]
    rows = [
        ("logits rel L2", "logits_rel", rel_l2(dump.logits, ref_logits), rel_l2(b16_logits, ref_logits)),
        ("logits max abs", "logits_max", float(np.abs(dump.logits - ref_logits).max()),
         float(np.abs(b16_logits - ref_logits).max())),
        ("loss abs", "loss_abs", abs(ours_loss - ref_loss), abs(b16_loss - ref_loss)),
    ]
    print(f"\n{title}: HF fp32 loss {ref_loss:.6f}, engine {ours_loss:.6f}, HF bf16-autocast {b16_loss:.6f}")
    print(f"  {'metric':<16} {'engine':>10} {'HF-bf16':>10} {'limit':>10}")
    out = []
    for label, metric, ours, b16 in rows:
        lim = limit(metric, args.backend, b16)
        status = checks.add(f"{title}: {label}", ours <= lim)
        print(f"  {label:<16} {ours:10.2e} {b16:10.2e} {lim:10.2e}  {status}")
        out.append((label, ours, b16, lim, status))
    return out


def compare_grads(dump, model, args, checks):
    _, _, ref = logits_loss_grads(model, dump, bf16=False)
    _, _, b16 = logits_loss_grads(model, dump, bf16=True)
    print("\nGradients of the mean loss, per tensor (relative L2 error vs HF fp32)")
    print(f"  {'HF tensor':<46} {'shape':<12} {'engine':>10} {'HF-bf16':>10} {'limit':>10}")
    worst = (0.0, "", 0.0)
    for name, _, _, _, g in ckpt_io.hf_tensors(dump.grads, dump.model):
        ours, e16 = rel_l2(g, ref[name]), rel_l2(b16[name], ref[name])
        lim = limit("grad_rel", args.backend, e16)
        status = checks.add(f"grad {name}", ours <= lim)
        shape = "x".join(map(str, g.shape))
        print(f"  {name:<46} {shape:<12} {ours:10.2e} {e16:10.2e} {lim:10.2e}  {status}")
        if ours >= worst[0]:
            worst = (ours, name, e16)
    return worst


def compare_training(dump, model_fn, args, checks):
    s = dump.summary
    ref_losses, ref_norms = adamw_steps(model_fn(), dump, bf16=False)
    b16_losses, b16_norms = adamw_steps(model_fn(), dump, bf16=True)
    clip = dump.model["grad_clip"]
    print(f"\n10 AdamW steps on the same batch (loss before each update; grad norm before clipping at {clip:g})")
    print(f"  {'step':>4} {'lr':>10} {'HF fp32':>10} {'engine':>10} {'diff':>9} {'HF-bf16':>10} {'diff':>9}"
          f" {'norm HF':>9} {'norm ours':>9}")
    for i in range(len(ref_losses)):
        print(f"  {i:4d} {s['lrs'][i]:10.3e} {ref_losses[i]:10.6f} {s['step_losses'][i]:10.6f} "
              f"{s['step_losses'][i] - ref_losses[i]:9.1e} {b16_losses[i]:10.6f} {b16_losses[i] - ref_losses[i]:9.1e}"
              f" {ref_norms[i]:9.5f} {s['grad_norms'][i]:9.5f}")
    rows = []
    for label, metric, ours, b16 in [
        ("step loss max abs", "step_loss_abs", max(abs(a - b) for a, b in zip(s["step_losses"], ref_losses)),
         max(abs(a - b) for a, b in zip(b16_losses, ref_losses))),
        ("grad norm max rel", "grad_norm_rel", max(abs(a - b) / b for a, b in zip(s["grad_norms"], ref_norms)),
         max(abs(a - b) / b for a, b in zip(b16_norms, ref_norms))),
    ]:
        lim = limit(metric, args.backend, b16)
        status = checks.add(f"training: {label}", ours <= lim)
        print(f"  {label}: engine {ours:.2e}, HF-bf16 {b16:.2e}, limit {lim:.2e}  {status}")
        rows.append((label, ours, b16, lim, status))
    clipped = sum(n > clip for n in ref_norms) if clip > 0 else 0
    print(f"  clipping active in {clipped} of {len(ref_norms)} steps; loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
    return rows


def check_export(args, work, device, checks):
    """Train EXPORT_STEPS steps with checkpoints, dump the checkpoint through the engine (--resume
    --compare-dump), export it, load it with from_pretrained and compare."""
    ck_dir, dump_dir = os.path.join(work, "ckpt"), os.path.join(work, "export_dump")
    shutil.rmtree(ck_dir, ignore_errors=True)
    ck_sets = ["--set", f"checkpoint.dir={ck_dir}", "--set", f"schedule.total_steps={EXPORT_STEPS}",
               "--set", "schedule.warmup_steps=1"]
    run_train(args, ck_sets, "training for the export check")
    ckpt = os.path.join(ck_dir, f"ckpt_{EXPORT_STEPS:08d}.bin")
    run_train(args, ck_sets + ["--resume", "--compare-dump", dump_dir], "compare dump of the checkpoint")
    dump = ckpt_io.CompareDump(dump_dir)
    print(f"\nExport of {os.path.relpath(ckpt, work)} (step {EXPORT_STEPS}) with scripts/hf/export_hf.py")

    # The engine dumped the checkpoint's parameters (resume runs before compare_dump).
    ck_params = ckpt_io.Checkpoint(ckpt).section("params").view("<f4")
    status = checks.add("export: dump holds the checkpoint's params", np.array_equal(ck_params, dump.params))
    print(f"  checkpoint params == engine dump after --resume (bit-exact): {status}")

    out32, out16 = os.path.join(work, "hf_fp32"), os.path.join(work, "hf_bf16")
    export_hf.export(ckpt, out32, "fp32", log=lambda s: print("  " + s))
    export_hf.export(ckpt, out16, "bf16", log=lambda s: print("  " + s))

    model = LlamaForCausalLM.from_pretrained(out32, attn_implementation="eager").to(device)
    want = {n: torch.from_numpy(np.array(t)) for n, _, _, _, t in ckpt_io.hf_tensors(dump.params, dump.model)}
    got = dict(model.named_parameters())
    same = got.keys() == want.keys() and all(torch.equal(got[n].detach().cpu(), want[n]) for n in want)
    status = checks.add("export: fp32 weights bit-exact", same and model.dtype == torch.float32)
    print(f"  fp32 export, from_pretrained: every weight bit-exact: {status}")
    rope = getattr(model.config, "rope_parameters", None) or model.config.rope_scaling
    print(f"  from_pretrained rope: {json.dumps(rope, sort_keys=True)}")
    rows = compare_forward(dump, model, args, checks, "Exported model (from_pretrained) vs engine")

    m16 = LlamaForCausalLM.from_pretrained(out16, attn_implementation="eager")
    got = dict(m16.named_parameters())
    same = got.keys() == want.keys() and all(torch.equal(got[n].detach().to(torch.bfloat16), want[n].to(torch.bfloat16))
                                             for n in want)
    status = checks.add("export: bf16 weights == torch fp32->bf16", same)
    print(f"  bf16 export, from_pretrained: every weight equals torch's fp32->bf16 rounding: {status}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="engine backend (parallel.backend)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="torch device for HF")
    ap.add_argument("--train", default=os.path.join(REPO, "train"), help="the engine binary")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep the dumps, checkpoint and exports")
    args = ap.parse_args()
    args.train = os.path.abspath(args.train)  # ./train runs in the repo root
    if not os.access(args.train, os.X_OK):
        sys.exit(f"hf_compare: FAIL (no engine binary at {args.train}: run make, or pass --train PATH)")
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    torch.set_float32_matmul_precision("highest")  # the fp32 reference must not use TF32 on the GPU
    device = torch.device(args.device)
    work = args.keep or tempfile.mkdtemp(prefix="hf_compare_")
    os.makedirs(work, exist_ok=True)
    checks = Checks()
    try:
        print(f"hf_compare: engine backend {args.backend}, HF on {args.device} "
              f"(torch {torch.__version__}, transformers {transformers.__version__})")
        dump_dir = os.path.join(work, "dump")
        run_train(args, ["--compare-dump", dump_dir], "compare dump")
        dump = ckpt_io.CompareDump(dump_dir)
        m = dump.model
        print(f"model: vocab {m['vocab_size']}, dim {m['dim']}, {m['n_layers']} layers, {m['n_heads']} heads "
              f"({m['n_kv_heads']} KV), ffn {m['ffn_dim']}, rope theta {m['rope_theta']:g} with llama3 scaling "
              f"(factor {m['rope_factor']:g}, original {m['rope_original_max_pos']}), batch {dump.B} x {dump.T}; "
              f"engine backend '{m['backend']}'")

        model_fn = lambda: build_hf(m, dump.params, device)  # noqa: E731
        model = model_fn()
        fwd = compare_forward(dump, model, args, checks, "Forward")
        worst_grad = compare_grads(dump, model, args, checks)
        train_rows = compare_training(dump, model_fn, args, checks)
        export_rows = check_export(args, work, device, checks)

        # The compact table for docs.
        print(f"\nSummary (engine backend {args.backend} vs HF fp32 on {args.device}; HF-bf16 = HF under autocast bf16)")
        print("| check | engine | HF-bf16 | limit | |")
        print("|---|---|---|---|---|")
        for label, ours, b16, lim, status in fwd + train_rows:
            print(f"| {label} | {ours:.2e} | {b16:.2e} | {lim:.2e} | {status} |")
        ours, name, e16 = worst_grad
        lim = limit("grad_rel", args.backend, e16)
        print(f"| worst grad rel L2 ({name}) | {ours:.2e} | {e16:.2e} | {lim:.2e} | {'ok' if ours <= lim else 'FAIL'} |")
        label, ours, b16, lim, status = export_rows[0]
        print(f"| export: {label} | {ours:.2e} | {b16:.2e} | {lim:.2e} | {status} |")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    checks.finish("hf_compare")


if __name__ == "__main__":
    main()

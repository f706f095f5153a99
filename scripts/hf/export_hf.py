#!/usr/bin/env python3
"""export_hf.py: converts one of the engine's checkpoints into a Hugging Face LlamaForCausalLM
directory (config.json + model.safetensors) that transformers' from_pretrained loads as is.

    python3 scripts/hf/export_hf.py runs/x/ckpt_00001000.bin OUTDIR [--dtype bf16|fp32] [--no-verify]

The model config comes from the checkpoint's "meta" section and the weights from "params" (fp32
master weights, written as bf16 by default, rounded to nearest even). The header and the sections
read are checked against their checksums first; --no-verify skips that (about a minute per 30 GB).
Needs only numpy.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402


def export(ckpt_path, out_dir, dtype="bf16", verify=True, log=print):
    """Writes out_dir/config.json and out_dir/model.safetensors; returns the RunMeta dict."""
    t0 = time.time()
    ck = ckpt_io.Checkpoint(ckpt_path, verify=verify)
    meta = ckpt_io.parse_run_meta(ck.section("meta"), where=f"checkpoint '{ckpt_path}': section 'meta'")
    n = ckpt_io.param_count(meta)
    if meta["n_params"] != n:
        raise ckpt_io.CheckpointError(f"checkpoint '{ckpt_path}': meta says {meta['n_params']} parameters, its model config has {n}")
    params = ck.section("params")
    if params.shape[0] != 4 * n:
        raise ckpt_io.CheckpointError(f"checkpoint '{ckpt_path}': section 'params' has {params.shape[0]} bytes, expected {4 * n}")
    params = params.view("<f4")

    os.makedirs(out_dir, exist_ok=True)
    torch_dtype = "bfloat16" if dtype == "bf16" else "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(ckpt_io.hf_config(meta, torch_dtype), f, indent=2)
        f.write("\n")
    tensors = [(hf_name, t) for hf_name, _, _, _, t in ckpt_io.hf_tensors(params, meta)]
    info = {"source": os.path.basename(ckpt_path), "step": str(ck.step), "tokens_seen": str(meta["tokens_seen"]),
            "recipe": meta["recipe"]}
    ckpt_io.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype, metadata=info)
    log(f"exported {ckpt_path} (step {ck.step}, {n} parameters, {'verified' if verify else 'NOT verified'}) "
        f"to {out_dir} as {dtype} in {time.time() - t0:.1f}s")
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="a ckpt_<step>.bin file")
    ap.add_argument("out_dir", help="output directory (created)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="weight dtype in model.safetensors")
    ap.add_argument("--no-verify", action="store_true", help="skip the header and section checksums")
    a = ap.parse_args()
    try:
        export(a.checkpoint, a.out_dir, a.dtype, verify=not a.no_verify)
    except (ckpt_io.CheckpointError, OSError, ValueError) as e:
        sys.exit(f"export_hf: error: {e}")


if __name__ == "__main__":
    main()

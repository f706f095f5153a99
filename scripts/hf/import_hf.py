#!/usr/bin/env python3
"""import_hf.py: converts a Hugging Face LlamaForCausalLM directory (config.json + model.safetensors,
or sharded model-0000x-of-0000y.safetensors with model.safetensors.index.json) into a file that
`./train` starts from with `checkpoint.init_from: OUT.bin`.

    python3 scripts/hf/import_hf.py HF_DIR OUT.bin

OUT.bin is a checkpoint container (docs/checkpoint_format.md, step 0) with two sections:
"init_meta" (the model config, train.c's InitMeta: uint32 version 1, then the 14 LlamaConfig fields,
60 bytes little-endian) and "params" (fp32, the engine's flat parameter layout). BF16, F16 and F32
weights convert to fp32 exactly. Tensors stream through one at a time, so an 8B model needs memory
for one 64 MiB block, not for the model. The YAML `model:` keys of the imported model are printed
last, ready to paste into a config. Needs only numpy.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ckpt_io  # noqa: E402

# Buffers some exporters save beside the weights; the engine computes them.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def hf_layout(cfg):
    """[(hf_name, shape)] in the engine's flat parameter order: export's name mapping, inverted."""
    out = []
    for name, shape, _, _, _ in ckpt_io.param_layout(cfg):
        if name in ckpt_io.PER_LAYER:
            out += [(ckpt_io.HF_NAMES[name].format(l=l), shape[1:]) for l in range(shape[0])]
        else:
            out.append((ckpt_io.HF_NAMES[name], shape))
    return out


def check_tensors(st, layout, where):
    """Every tensor the engine needs is present with its shape, and nothing else is there."""
    want = dict(layout)
    missing = [n for n in want if n not in st.tensors]
    if missing:
        hint = " (tied embeddings are not supported)" if missing == ["lm_head.weight"] else ""
        raise ValueError(f"{where}: {len(missing)} tensor(s) missing, e.g. '{missing[0]}'{hint}")
    extra = [n for n in st.tensors if n not in want and not n.endswith(IGNORED_SUFFIXES)]
    if extra:
        raise ValueError(f"{where}: {len(extra)} tensor(s) the engine's Llama has no place for, e.g. '{extra[0]}'")
    for name, shape in layout:
        if st.shape(name) != tuple(shape):
            raise ValueError(f"{where}: tensor '{name}' has shape {list(st.shape(name))}, config.json implies {list(shape)}")


def import_hf(hf_dir, out_path, log=print):
    """Writes out_path from hf_dir; returns the engine model config."""
    t0 = time.time()
    config_path = os.path.join(hf_dir, "config.json")
    with open(config_path) as f:
        cfg = ckpt_io.model_config_from_hf(json.load(f), where=config_path)
    st = ckpt_io.SafetensorsReader(hf_dir)
    layout = hf_layout(cfg)
    check_tensors(st, layout, hf_dir)
    dtypes = sorted({st.tensors[name][2] for name, _ in layout})

    def params():
        for name, _ in layout:
            yield from st.fp32_blocks(name)

    sizes = ckpt_io.write_checkpoint(out_path, [("init_meta", [ckpt_io.pack_init_meta(cfg)]), ("params", params())])
    n = ckpt_io.param_count(cfg)
    assert sizes["params"] == 4 * n, (sizes, n)  # the layout and the shape checks above agree
    log(f"imported {hf_dir} ({n} parameters, {'/'.join(dtypes)} -> fp32) to {out_path} in {time.time() - t0:.1f}s")
    log(f"use it with --set checkpoint.init_from={out_path} and these model keys:")
    log(ckpt_io.model_yaml(cfg), end="")
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", help="a Hugging Face model directory (config.json + safetensors)")
    ap.add_argument("out", help="the file to write (for checkpoint.init_from)")
    a = ap.parse_args()
    try:
        import_hf(a.hf_dir, a.out)
    except (ckpt_io.CheckpointError, OSError, ValueError) as e:
        sys.exit(f"import_hf: error: {e}")


if __name__ == "__main__":
    main()

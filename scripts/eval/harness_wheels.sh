#!/usr/bin/env bash
# lm-evaluation-harness for a machine without internet (the GPU machine), in three steps:
#   bash scripts/eval/harness_wheels.sh probe            # there: the Python, and which of the
#                                                        # harness's dependencies it lacks
#   bash scripts/eval/harness_wheels.sh fetch PYVER PKG... # here: wheels of PKG... (the probe's list)
#                                                        # for CPython PYVER (e.g. 3.12) into .deps/harness_wheels
#   bash scripts/eval/harness_wheels.sh install          # there: installs them into .deps/harness_py
#                                                        # (then PYTHONPATH=.deps/harness_py)
# Carry .deps/harness_wheels (the device tool's `carry`, at most 64 MiB with the rest: fetch prints
# the size; pyarrow alone is about 55 MB, so a machine without datasets needs two calls, the second
# with the rest of the wheels, while the first call's .deps/harness_py is still there).
set -u
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
# lm_eval 0.4.13's run-time needs for the multiple-choice tasks with the hf model, with their
# import names; torch and transformers are the machine's own.
DEPS="lm_eval:lm_eval datasets:datasets pyarrow:pyarrow pandas:pandas dill:dill evaluate:evaluate jinja2:jinja2
more_itertools:more_itertools pytablewriter:pytablewriter rouge_score:rouge_score sacrebleu:sacrebleu
sqlitedict:sqlitedict word2number:word2number tiktoken:tiktoken xxhash:xxhash multiprocess:multiprocess
fsspec:fsspec huggingface_hub:huggingface_hub lxml:lxml portalocker:portalocker tabulate:tabulate
colorama:colorama nltk:nltk absl-py:absl jsonlines:jsonlines zstandard:zstandard"
case "${1:-}" in
  probe)
    $PY -c 'import sys; print("python", "%d.%d" % sys.version_info[:2])'
    missing=()
    for d in $DEPS; do
      PYTHONPATH=.deps/harness_py${PYTHONPATH:+:$PYTHONPATH} $PY -c "import ${d#*:}" 2>/dev/null || missing+=("${d%%:*}")
    done
    echo "missing: ${missing[*]:-none}" ;;
  fetch)
    pyver=${2:?PYVER (e.g. 3.12)}; shift 2
    [ $# -gt 0 ] || { echo "fetch: name the packages (the probe's missing list)"; exit 2; }
    out=.deps/harness_wheels; mkdir -p "$out"
    # sdist-only pure-Python packages become wheels here first
    for p in sqlitedict word2number rouge_score; do
      [[ " $* " == *" $p "* ]] && $PY -m pip wheel -q --no-deps -w "$out" "$p"
    done
    for p in "$@"; do
      $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --find-links "$out" -d "$out" "$p" || echo "fetch: $p: no wheel"
    done
    du -sh "$out" ;;
  install)
    $PY -m pip install -q --no-index --no-deps --target .deps/harness_py .deps/harness_wheels/*.whl &&
      echo "installed into .deps/harness_py: $(ls .deps/harness_wheels | wc -l) wheels" ;;
  *) echo "usage: scripts/eval/harness_wheels.sh probe | fetch PYVER PKG... | install"; exit 2 ;;
esac

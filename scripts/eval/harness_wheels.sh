#!/usr/bin/env bash
# lm-evaluation-harness for a machine without internet (the GPU machine), as one archive:
#   bash scripts/eval/harness_wheels.sh probe            # there: the Python, and which of the
#                                                        # harness's dependencies (DEPS) it lacks
#   bash scripts/eval/harness_wheels.sh pack PYVER PKG... # here: PKG... (the probe's list; default: DEPS
#                                                        # but SKIP) and what they need that the machine
#                                                        # lacks, for CPython PYVER (e.g. 3.12), installed
#                                                        # and pruned into .deps/harness_pack_PYVER.tar.xz
#   bash scripts/eval/harness_wheels.sh unpack [PYVER]   # there: into .deps/harness_py (replacing it),
#                                                        # then checks the imports
# then PYTHONPATH=.deps/harness_py. Carry the archive (the device tool's `carry`, at most 64 MiB with
# the rest). The machine is taken to have torch, transformers and the DEPS not named, so `pack PYVER
# <the probe's list>` brings only what it lacks (3.9 MB for the H200's Python 3.12); with nothing
# named the pack serves a Python with only torch and transformers, pyarrow included (tens of MB). The
# versions are resolved with the machine's transformers (TRANSFORMERS, as in docs/results/*hf_compare*),
# so the huggingface_hub the pack brings (datasets needs a recent one) suits both. xz, not zstd: the
# GPU machine has no zstd binary.
set -u
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
TORCH=${TORCH:-2.11.0} TRANSFORMERS=${TRANSFORMERS:-5.17.0} LM_EVAL=0.4.13
# lm_eval 0.4.13's run-time needs for the multiple-choice tasks with the hf model (which imports
# accelerate), with their import names; torch and transformers are the machine's own.
DEPS="lm_eval:lm_eval datasets:datasets pyarrow:pyarrow pandas:pandas dill:dill evaluate:evaluate jinja2:jinja2
more_itertools:more_itertools pytablewriter:pytablewriter rouge_score:rouge_score sacrebleu:sacrebleu
sqlitedict:sqlitedict word2number:word2number tiktoken:tiktoken xxhash:xxhash multiprocess:multiprocess
fsspec:fsspec huggingface_hub:huggingface_hub lxml:lxml portalocker:portalocker tabulate:tabulate
colorama:colorama nltk:nltk absl-py:absl jsonlines:jsonlines zstandard:zstandard accelerate:accelerate"
# left out unless named: scikit-learn (and so scipy, 50 MB), which lm_eval requires for metrics the
# multiple-choice tasks never import, and likewise evaluate, rouge_score, nltk and absl-py (in DEPS
# for the probe: lm_eval requires them); fsspec's HTTP file system (aiohttp: no use without internet);
# pytablewriter's setuptools
SKIP="scikit-learn scipy joblib threadpoolctl narwhals evaluate rouge_score nltk absl-py aiohttp aiohappyeyeballs
aiosignal frozenlist multidict propcache yarl setuptools"
TAGS="--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
--platform manylinux2014_x86_64"
sdists() {  # sdist-only pure-Python packages become wheels in $1 first
  local out=$1; shift
  for p in sqlitedict word2number rouge_score; do
    if [[ " $* " == *" $p "* ]]; then $PY -m pip wheel -q --no-deps -w "$out" "$p" || return 1; fi
  done
}
case "${1:-}" in
  probe)
    $PY -c 'import sys; print("python", "%d.%d" % sys.version_info[:2])'
    missing=()
    for d in $DEPS; do
      PYTHONPATH=.deps/harness_py${PYTHONPATH:+:$PYTHONPATH} $PY -c "import ${d#*:}" 2>/dev/null || missing+=("${d%%:*}")
    done
    echo "missing: ${missing[*]:-none}" ;;
  pack)
    pyver=${2:?PYVER (e.g. 3.12)}; shift 2
    [ $# -gt 0 ] || set -- $(for d in $DEPS; do [[ " $(echo $SKIP) " == *" ${d%%:*} "* ]] || echo "${d%%:*}"; done)
    # pip evaluates the dependencies' markers (python_version < "3.11": tomli, exceptiongroup) for the
    # Python it runs on, whatever --python-version says: CPython PYVER runs it where there is one
    pip=$PY
    for p in "$PY" "python$pyver" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$pyver.*/bin/python$pyver; do
      [ "$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$pyver" ] && { pip=$p; break; }
    done
    echo "pack $pyver: pip on $pip ($($pip --version 2>&1))"
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    w=$tmp/wheels site=$tmp/site out=$PWD/.deps/harness_pack_$pyver.tar.xz
    mkdir -p "$w" .deps && sdists "$w" sqlitedict word2number rouge_score || exit 1  # lm_eval requires them
    # torch is in the resolution as a wheel of no files with the real one's dependencies (the real one
    # would have pip fetch its CUDA wheels, gigabytes): what needs torch (accelerate) takes the machine's
    $PY - "$w" "$TORCH+machine" <<'PYEOF' || exit 1
import sys, zipfile
w, v = sys.argv[1:]
di = f"torch-{v}.dist-info"
deps = ["filelock", "typing-extensions>=4.10.0", "setuptools; python_version >= '3.12'", "sympy>=1.13.3",
        "networkx>=2.5.1", "jinja2", "fsspec>=0.8.5"]
with zipfile.ZipFile(f"{w}/torch-{v}-py3-none-any.whl", "w") as z:
    z.writestr(f"{di}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {v}\n" +
               "".join(f"Requires-Dist: {d}\n" for d in deps))
    z.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(f"{di}/RECORD", "")
PYEOF
    # the machine has torch, transformers and the DEPS not named (the probe found them, when PKG... is
    # its list), with what they need
    norm() { echo "$@" | tr 'A-Z_.' 'a-z--'; }
    not=" $(norm "$@") $(norm $SKIP) " have=()
    for d in $DEPS; do n=$(norm "${d%%:*}"); [[ "$not" == *" $n "* ]] || have+=("$n"); done
    # the versions pip would install for CPython $pyver, with the machine's transformers (metadata only)
    $pip -m pip install -q --dry-run --ignore-installed --target "$tmp/none" $TAGS --python-version "$pyver" \
      --find-links "$w" --report "$tmp/all.json" "$@" "${have[@]}" "lm_eval==$LM_EVAL" "torch==$TORCH+machine" \
      "transformers==$TRANSFORMERS" || exit 1
    # the pack: the packages named and what they need, short of what the machine has and of SKIP, at the
    # versions resolved; huggingface_hub, fsspec and jinja2 are named (datasets needs newer ones than
    # the machine may have), and the pack comes first on the path
    $PY - "$tmp/all.json" "$pyver" "$*" "${have[*]}" "$(echo $SKIP)" >"$tmp/pins.txt" <<'PYEOF' || exit 1
import json, sys
from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name as canon
report, pyver, named, have, skip = sys.argv[1], sys.argv[2], *(a.split() for a in sys.argv[3:])
env = dict(default_environment(), python_version=pyver, python_full_version=pyver + ".0")
meta = {canon(i["metadata"]["name"]): i["metadata"] for i in json.load(open(report))["install"]}

def closure(roots, stop=lambda n: False):  # {name: extras} of the roots and their dependencies
    extras, todo = {}, [Requirement(r) for r in roots]
    while todo:
        r = todo.pop()
        n = canon(r.name)
        if n not in meta or stop(n) or (n in extras and r.extras <= extras[n]):
            continue
        extras[n] = extras.get(n, set()) | r.extras
        for d in map(Requirement, meta[n].get("requires_dist") or []):
            if d.marker is None or any(d.marker.evaluate(dict(env, extra=e)) for e in extras[n] | {""}):
                todo.append(d)
    return extras

base = closure(["torch", "transformers"] + have)
named, skip = {canon(n) for n in named}, {canon(n) for n in skip}
for n in sorted(closure(named, lambda n: n not in named and (n in base or n in skip))):
    print(n + "==" + meta[n]["version"])
PYEOF
    echo "pack $pyver:" $(cat "$tmp/pins.txt")
    $pip -m pip install -q --no-deps --no-compile --target "$site" $TAGS --python-version "$pyver" \
      --find-links "$w" $(cat "$tmp/pins.txt") || exit 1
    # prune: what no import reads (tests, sources, headers, scripts, pip's file lists, the task
    # READMEs), lxml.objectify, zstandard's CFFI backend (no cffi), the compiled copies of modules that
    # have their .py beside them (lxml's), and the shared libraries' symbol tables and debug information
    # (zstandard's are 4 MB of its 4.5 compressed)
    rm -rf "$site/bin" "$site"/pyarrow/{include,src,tests} "$site"/lxml/{includes,objectify.*} \
      "$site"/zstandard/_cffi.*
    find "$site" -depth -type d \( -name __pycache__ -o -name tests \) -exec rm -rf {} +
    find "$site" -type f \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' -o -name '*.h' -o -name '*.c' \
      -o -name '*.cc' -o -name '*.cpp' -o -path '*.dist-info/RECORD' -o -path '*/lm_eval/tasks/*.md' \
      -o -path '*/lm_eval/tasks/*.jpg' -o -path '*/lm_eval/tasks/*.png' \) -delete
    find "$site" -name '*.cpython-*.so' | while read -r f; do [ -f "${f%%.cpython-*}.py" ] && rm "$f"; done
    # pyarrow (only when the machine lacks it): Flight, S3, the other file systems, ORC and the C++ tests
    # are imported only when asked for, or tried and gone without (pyarrow.fs, pyarrow.dataset)
    pa=$site/pyarrow
    for m in flight s3fs azurefs gcsfs hdfs orc dataset_orc pyarrow_cpp_tests; do rm -f "$pa/_$m".*; done
    rm -f "$pa"/libarrow_flight.* "$pa"/libarrow_python_flight.* "$pa"/libarrow_s3.*
    find "$site" -type f -name '*.so*' -exec strip --strip-unneeded {} +
    tar -C "$site" -cf - . | xz -q -${XZ_LEVEL:-9e} -T0 >"$out" || exit 1
    echo "pack $pyver: $(du -sh "$site" | cut -f1) installed -> $out," \
      "$(stat -c %s "$out" | awk '{printf "%.1f MB (%.1f MiB)", $1 / 1e6, $1 / 2^20}')" ;;
  unpack)
    pyver=${2:-$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
    f=.deps/harness_pack_$pyver.tar.xz
    [ -f "$f" ] || { echo "unpack: no $f (pack $pyver on a machine with internet)"; exit 1; }
    rm -rf .deps/harness_py && mkdir -p .deps/harness_py &&
      { tar -C .deps/harness_py -xJf "$f" 2>/dev/null ||
        $PY -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$f" .deps/harness_py; } || exit 1
    if err=$(PYTHONPATH=.deps/harness_py${PYTHONPATH:+:$PYTHONPATH} $PY -c \
      "import lm_eval, datasets, pyarrow, pyarrow.parquet, lm_eval.models.huggingface" 2>&1); then
      echo "unpack: ok (.deps/harness_py; then PYTHONPATH=.deps/harness_py)"
    else
      echo "unpack: import failed:"; echo "$err" | tail -5; exit 1
    fi ;;
  *) echo "usage: scripts/eval/harness_wheels.sh probe | pack PYVER [PKG...] | unpack [PYVER]"; exit 2 ;;
esac

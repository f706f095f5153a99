#!/usr/bin/env bash
# torchao for the float8 PyTorch peer on a machine without internet (the GPU machine has torch 2.11
# and no torchao):
#   bash scripts/gpu/peer_wheels.sh fetch [PYVER]   # here: the torchao wheel into .deps/ (3.4 MB);
#                                                   # carry .deps/torchao-*.whl with the device tool
#   bash scripts/gpu/peer_wheels.sh unpack          # there: into .deps/torchao_py (replacing it), then
#                                                   # checks that torchao.float8 imports
# then PYTHONPATH=.deps/torchao_py. A wheel is a zip: unpacking it with Python's zipfile is all an
# install of this one package needs (no dependencies beyond torch; its compiled extension is for ops
# the float8 training path does not use, and a mismatch with the machine's torch only warns).
set -u
cd "$(dirname "$0")/../.." || exit 1
PY=${PYTHON:-python3}
TORCHAO=${TORCHAO:-0.18.0}  # the version ../shared/peers/torch_fp8_peer.py was measured with beside torch 2.11
case "${1:-}" in
  fetch)
    pyver=${2:-3.12}
    mkdir -p .deps
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .deps "torchao==$TORCHAO" || exit 1
    ls -la .deps/torchao-"$TORCHAO"-*.whl
    ;;
  unpack)
    whl=$(ls .deps/torchao-*.whl 2>/dev/null | tail -n 1)
    [ -n "$whl" ] || { echo "peer_wheels: no .deps/torchao-*.whl (run fetch where there is internet)" >&2; exit 1; }
    rm -rf .deps/torchao_py
    $PY -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$whl" .deps/torchao_py || exit 1
    PYTHONPATH=.deps/torchao_py${PYTHONPATH:+:$PYTHONPATH} $PY -c \
      "import torchao.float8, torchao; print('peer_wheels: torchao', torchao.__version__, 'ok (PYTHONPATH=.deps/torchao_py)')" \
      2>&1 | tail -n 1
    ;;
  *)
    echo "usage: bash scripts/gpu/peer_wheels.sh fetch [PYVER] | unpack" >&2
    exit 2
    ;;
esac

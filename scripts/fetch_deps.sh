#!/usr/bin/env bash
# Fetches what a GPU machine without internet lacks, into the git-ignored .deps/ (carried there):
#   .deps/root       libyaml, libzstd, libpcre2 headers + static libraries (Debian packages, unpacked)
#   .deps/cudnn_fe   cuDNN's header-only C++ frontend (PyPI wheel nvidia-cudnn-frontend)
# Build with them:  make DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include
# --cudnn-fe-only: just the frontend headers (what CI needs to compile the CUDA sources).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps/debs .deps/whl
if [ "${1:-}" != "--cudnn-fe-only" ]; then
  (cd .deps/debs && apt-get download libyaml-dev libyaml-0-2 libpcre2-dev libpcre2-8-0 libzstd-dev libzstd1)
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .deps/whl "nvidia-cudnn-frontend==1.32.0"
rm -rf .deps/cudnn_fe && mkdir -p .deps/cudnn_fe
unzip -q -o .deps/whl/nvidia_cudnn_frontend-*.whl 'include/*' -d .deps/cudnn_fe
rm -rf .deps/debs .deps/whl
echo "fetched into .deps/: $(du -sh .deps | cut -f1)"

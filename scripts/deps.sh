#!/usr/bin/env bash
# What the build and the tests need from outside the repository, found or got the first time it is
# needed. The Makefile runs it on every invocation (quick when everything is there):
#   deps.sh build   the C libraries' headers (libyaml, libzstd, libpcre2, zlib), g++, for the CUDA
#                   backend cuDNN and its header-only C++ frontend, and for parquet inputs to
#                   `./train tokenize` Apache Arrow's C++ libraries (from the pyarrow wheel, into
#                   .deps/arrow); writes what it found to build/deps.mk, which the Makefile includes
#   deps.sh test    what `make test` needs beyond the build: numpy (tests/system/test_hf_export.sh),
#                   tensorboard's event reader and wandb (tests/system/test_logging.sh), pyarrow
#                   (tests/system/test_tokenize_parquet.sh), megatron-core's wheel into .deps/wheels
#                   (tests/system/test_megatron_writer.sh), clang with libFuzzer
#                   (tests/system/test_fuzz.sh), clang-format where it can
#   deps.sh fetch   for a machine without internet (the GPU machine): unpacks the C libraries into
#                   .deps/root and the frontend into .deps/cudnn_fe here; carry .deps/ there
# For each missing piece, in order: on the system already; in .deps/ already; installed with
# apt-get (as root or with passwordless sudo) or pip; unpacked into .deps/ without root. When none
# works it stops, naming what is missing and the command that installs it. A CUDA backend or a parquet
# reader that cannot be built is not an error: the build goes on without it and says why. PARQUET=0:
# no parquet reader, nothing fetched for it (its libraries take 63 MB: the GPU machine does without).
# Environment (the Makefile passes it): CC, CXX, NVCC, CUDA_HOME, CUDNN_FE, DEPS (a prefix holding
# usr/include and usr/lib/<triplet>, set by hand: then the C libraries are taken from there).
# AUTO_DEPS=0: find only, install nothing. DEPS_LOCAL_ROOT: the unpack prefix (.deps/root).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}  # the build folder (the Makefile's BUILD): deps.mk and the log go there
mkdir -p "$BUILD"
LOG=$BUILD/deps.log
LOCAL_ROOT=${DEPS_LOCAL_ROOT:-.deps/root}  # where the C libraries are unpacked without root
CC=${CC:-cc} CXX=${CXX:-g++}
CUDNN_FE_VERSION=1.32.0
ARROW_VERSION=21.0.0  # the pyarrow wheel: libarrow.so.2100 and libparquet.so.2100 with their headers
MEGATRON_CORE_VERSION=0.16.1  # its dataset writer runs in tests/system/test_megatron_writer.sh
ARROW_HOME=.deps/arrow
say() { echo "deps: $*" >&2; }

# -dev package: header, static library
C_LIBS=("libyaml-dev yaml.h libyaml.a" "libzstd-dev zstd.h libzstd.a" "libpcre2-dev pcre2.h libpcre2-8.a" "zlib1g-dev zlib.h libz.a")
triplet=$("$CC" -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)

has_header() {  # header [cc flags...]: does the C compiler find it?
  local h=$1; shift
  printf '#include <%s>\n' "$h" | "$CC" -DPCRE2_CODE_UNIT_WIDTH=8 "$@" -x c -E - >/dev/null 2>&1
}
# The C libraries missing from prefix $1 ("" = the system), as package names.
missing_c_libs() {
  local root=$1 e pkg h a
  for e in "${C_LIBS[@]}"; do
    read -r pkg h a <<<"$e"
    if [ -z "$root" ]; then has_header "$h" || echo "$pkg"
    elif [ ! -f "$root/usr/include/$h" ] || [ ! -f "$root/usr/lib/$triplet/$a" ]; then echo "$pkg"; fi
  done
}

# apt-get install as root or with passwordless sudo; fails when neither is possible.
apt_install() {
  [ "${AUTO_DEPS:-1}" = 0 ] && return 1
  command -v apt-get >/dev/null || return 1
  local sudo=()
  if [ "$(id -u)" != 0 ]; then sudo -n true 2>/dev/null || return 1; sudo=(sudo -n); fi
  say "installing $* with apt-get (log: $LOG)"
  { "${sudo[@]}" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@"; } >>"$LOG" 2>&1
}
# Downloads Debian packages and unpacks them into prefix $1 (no root needed).
apt_unpack() {
  local root=$1; shift
  [ "${AUTO_DEPS:-1}" = 0 ] && return 1
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || return 1
  say "unpacking $* into $root (log: $LOG)"
  rm -rf .deps/debs && mkdir -p .deps/debs "$root" &&
    (cd .deps/debs && apt-get download "$@") >>"$LOG" 2>&1 &&
    for f in .deps/debs/*.deb; do dpkg -x "$f" "$root" || return 1; done
  local rc=$?; rm -rf .deps/debs; return $rc
}
# Unpacks cuDNN's header-only frontend (PyPI wheel nvidia-cudnn-frontend) into .deps/cudnn_fe/include.
fetch_cudnn_fe() {
  [ "${AUTO_DEPS:-1}" = 0 ] && return 1
  command -v python3 >/dev/null || return 1
  say "fetching the cuDNN frontend headers (nvidia-cudnn-frontend==$CUDNN_FE_VERSION) with pip (log: $LOG)"
  rm -rf .deps/whl && mkdir -p .deps/whl &&
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .deps/whl \
      "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" >>"$LOG" 2>&1 &&
    python3 - .deps/whl .deps/cudnn_fe <<'EOF' >>"$LOG" 2>&1
import glob, shutil, sys, zipfile
whl, dest = glob.glob(sys.argv[1] + "/nvidia_cudnn_frontend-*.whl")[0], sys.argv[2]
shutil.rmtree(dest, ignore_errors=True)
with zipfile.ZipFile(whl) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
EOF
  local rc=$?; rm -rf .deps/whl; [ $rc = 0 ] && [ -f .deps/cudnn_fe/include/cudnn_frontend.h ]
}

# Unpacks Apache Arrow's C++ libraries and headers from the PyPI wheel pyarrow into $ARROW_HOME (lib/:
# libarrow and libparquet, with unversioned links; include/: arrow/ and parquet/). Always CPython
# 3.12's manylinux_2_28 wheel, whatever python3 is: the C++ libraries are the same in every wheel of a
# version, and one pinned file gives every machine the same ones.
fetch_arrow() {
  [ "${AUTO_DEPS:-1}" = 0 ] && return 1
  command -v python3 >/dev/null || return 1
  say "fetching Apache Arrow's C++ parquet reader (the pyarrow==$ARROW_VERSION wheel, 43 MB) with pip (log: $LOG)"
  rm -rf .deps/whl_arrow && mkdir -p .deps/whl_arrow &&
    python3 -m pip download -q --no-deps --only-binary=:all: --retries 1 --timeout 20 --python-version 3.12 \
      --implementation cp --platform "manylinux_2_28_$(uname -m)" -d .deps/whl_arrow "pyarrow==$ARROW_VERSION" \
      >>"$LOG" 2>&1 &&
    python3 - .deps/whl_arrow "$ARROW_HOME" <<'EOF' >>"$LOG" 2>&1
import glob, os, shutil, sys, zipfile
whl, dest = glob.glob(sys.argv[1] + "/pyarrow-*.whl")[0], sys.argv[2]
shutil.rmtree(dest, ignore_errors=True)
with zipfile.ZipFile(whl) as z:
    libs = [n for n in z.namelist() if n.split("/")[-1].split(".so.")[0] in ("libarrow", "libparquet")]
    heads = [n for n in z.namelist() if n.startswith(("pyarrow/include/arrow/", "pyarrow/include/parquet/"))
             and not n.startswith("pyarrow/include/arrow/python/") and not n.endswith("/")]
    for n in libs + heads:
        out = os.path.join(dest, "lib", n.split("/")[-1]) if n in libs else os.path.join(dest, n.split("/", 1)[1])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as src, open(out, "wb") as f:
            shutil.copyfileobj(src, f)
    for n in libs:  # libarrow.so -> libarrow.so.2100, for -larrow
        name = n.split("/")[-1]
        os.symlink(name, os.path.join(dest, "lib", name.split(".so.")[0] + ".so"))
EOF
  local rc=$?; rm -rf .deps/whl_arrow; [ $rc = 0 ] && [ -f "$ARROW_HOME/include/parquet/api/reader.h" ]
}

# $BUILD/deps.mk: DEPS_ROOT (prefix of unpacked C libraries, empty for the system's), CUDA_BUILD
# (1 or 0) and CUDA_WHY (why not).
# The directory of the newest cuDNN 9 on this machine (issue 30.1: attention runs at the version loaded
# at run time): CUDA_HOME's, the system's (ldconfig) and the nvidia-cudnn wheel of the python3 on PATH
# (PyTorch's: the H200 machine has 9.14 in the system paths and 9.19 there). The engine links with that
# directory first in its run path; cuDNN 9 keeps its API within the major version, so the headers the
# build finds serve every 9.x. CUDNN_LIBDIR=dir chooses one; CUDNN_LIBDIR=system keeps the linker's.
newest_cudnn() {
  [ -n "${CUDNN_LIBDIR:-}" ] && { [ "$CUDNN_LIBDIR" != system ] && echo "$CUDNN_LIBDIR"; return 0; }
  local dirs=() d v best= bestv=0 probe=$BUILD/.cudnn_version
  dirs+=("${CUDA_HOME:-/usr/local/cuda}/lib64" "${CUDA_HOME:-/usr/local/cuda}/lib")
  while read -r d; do dirs+=("${d%/*}"); done < <(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 /{print $NF}')
  d=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], "lib"))' 2>/dev/null) &&
    dirs+=("$d")
  # cudnnGetVersion of each library, loaded alone (no GPU needed)
  printf '%s\n' '#include <dlfcn.h>' '#include <stdio.h>' 'int main(int c, char **v) {' \
    '  void *h = dlopen(v[1], RTLD_NOW | RTLD_LOCAL); if (!h) return 1;' \
    '  size_t (*f)(void) = (size_t (*)(void))dlsym(h, "cudnnGetVersion"); if (!f) return 1;' \
    '  printf("%zu\n", f()); return 0; }' | "$CC" -x c - -o "$probe" -ldl 2>/dev/null || return 0
  for d in "${dirs[@]}"; do
    [ -e "$d/libcudnn.so.9" ] || continue
    v=$("$probe" "$d/libcudnn.so.9" 2>/dev/null) || continue
    [ "$v" -gt "$bestv" ] && bestv=$v best=$(cd "$d" && pwd -P)
  done
  rm -f "$probe"
  [ -n "$best" ] && echo "$best"
}

deps_build() {
  local root=${DEPS:-} miss
  if [ -n "$root" ]; then
    miss=$(missing_c_libs "$root")
    [ -n "$miss" ] && { say "error: DEPS=$root lacks" $miss "(run: bash scripts/deps.sh fetch)"; return 1; }
  else
    miss=$(missing_c_libs "")
    if [ -n "$miss" ] && [ -z "$(missing_c_libs "$LOCAL_ROOT")" ]; then root=$LOCAL_ROOT; miss=; fi
    if [ -n "$miss" ]; then
      # shellcheck disable=SC2086
      if apt_install $miss && [ -z "$(missing_c_libs "")" ]; then miss=
      elif apt_unpack "$LOCAL_ROOT" libyaml-dev libzstd-dev libpcre2-dev zlib1g-dev &&
           [ -z "$(missing_c_libs "$LOCAL_ROOT")" ]; then root=$LOCAL_ROOT; miss=
      fi
    fi
    if [ -n "$miss" ]; then
      if [ "${AUTO_DEPS:-1}" = 0 ]; then say "error: missing" $miss "(headers for the C libraries; AUTO_DEPS=0 installs nothing)."
      else say "error: missing" $miss "(headers for the C libraries), and they could not be installed" \
               "(that needs root or passwordless sudo, and a reachable apt repository; see $LOG)."; fi
      say "install them with:  sudo apt-get install" $miss
      say "or, without root:   bash scripts/deps.sh fetch   (on a machine with internet; then copy .deps/ here)"
      return 1
    fi
  fi
  if ! command -v "$CXX" >/dev/null && ! { apt_install g++ && command -v "$CXX" >/dev/null; }; then
    say "error: no C++ compiler ($CXX; the host tests and the CUDA backend need one). Install it with:  sudo apt-get install g++"
    return 1
  fi
  local cuda=0 why=
  if [ -z "${NVCC:-}" ]; then why="no nvcc found (put the CUDA toolkit's bin/ on PATH or set NVCC=)"
  else
    local inc=(-I"${CUDA_HOME:-/usr/local/cuda}/include") lib=(-L"${CUDA_HOME:-/usr/local/cuda}/lib64")
    if ! printf '#include <cudnn.h>\n#include <cublasLt.h>\n' | "$CXX" "${inc[@]}" -x c++ -E - >/dev/null 2>&1; then
      why="cudnn.h or cublasLt.h not found under ${CUDA_HOME:-/usr/local/cuda}/include or the system paths (install cuDNN 9 for your CUDA)"
    elif ! echo 'int main(){return 0;}' | "$CXX" -x c++ - "${lib[@]}" -lcudnn -lcublasLt -o "$BUILD/.deps_probe" >/dev/null 2>&1; then
      why="libcudnn or libcublasLt not found to link (install cuDNN 9 for your CUDA)"
    elif [ ! -f "${CUDNN_FE:-.deps/cudnn_fe/include}/cudnn_frontend.h" ] &&
         ! { [ "${CUDNN_FE:-.deps/cudnn_fe/include}" = .deps/cudnn_fe/include ] && fetch_cudnn_fe; }; then
      why="cuDNN frontend headers not in ${CUDNN_FE:-.deps/cudnn_fe/include} and pip could not download them (offline?): run  bash scripts/deps.sh fetch  where there is internet, or set CUDNN_FE=path/include"
    else cuda=1; fi
    rm -f "$BUILD/.deps_probe"
  fi
  local cudnn_dir=
  [ $cuda = 1 ] && cudnn_dir=$(newest_cudnn)
  # Parquet inputs: the libraries unpacked, or fetched now. A failed fetch is not retried on every make
  # (pip would wait on the network each time): rm $BUILD/parquet_fetch_failed to try again.
  local parquet=0 pwhy=
  if [ "${PARQUET:-1}" = 0 ]; then pwhy="PARQUET=0"
  elif [ -f "$ARROW_HOME/include/parquet/api/reader.h" ] && [ -e "$ARROW_HOME/lib/libparquet.so" ]; then parquet=1
  elif [ "${AUTO_DEPS:-1}" = 0 ]; then pwhy="Apache Arrow's C++ libraries are not in $ARROW_HOME (AUTO_DEPS=0 fetches nothing)"
  else
    pwhy="Apache Arrow's C++ libraries are not in $ARROW_HOME and pip could not download pyarrow==$ARROW_VERSION"
    pwhy+=" (offline? see $LOG; rm $BUILD/parquet_fetch_failed to try again)"
    if [ ! -f "$BUILD/parquet_fetch_failed" ] && fetch_arrow; then parquet=1 pwhy=
    else touch "$BUILD/parquet_fetch_failed"; fi
  fi
  # Rewritten only when it changes: every object depends on it, so a change rebuilds them all.
  printf 'DEPS_ROOT := %s\nCUDA_BUILD := %s\nCUDA_WHY := %s\nPARQUET_BUILD := %s\nPARQUET_WHY := %s\nARROW_HOME := %s\nCUDNN_LIBDIR := %s\n' \
    "$root" "$cuda" "$why" "$parquet" "$pwhy" "$ARROW_HOME" "$cudnn_dir" >"$BUILD/deps.mk.new"
  if cmp -s "$BUILD/deps.mk.new" "$BUILD/deps.mk"; then rm -f "$BUILD/deps.mk.new"; else mv "$BUILD/deps.mk.new" "$BUILD/deps.mk"; fi
}

# megatron-core's wheel into .deps/wheels (any platform's: the test reads its Python source).
fetch_megatron_core() {
  ls .deps/wheels/megatron_core-"$MEGATRON_CORE_VERSION"-*.whl >/dev/null 2>&1 && return 0
  [ "${AUTO_DEPS:-1}" = 0 ] && return 1
  say "downloading megatron-core==$MEGATRON_CORE_VERSION's wheel into .deps/wheels (log: $LOG)"
  mkdir -p .deps/wheels &&
    python3 -m pip download -q --no-deps --only-binary=:all: -d .deps/wheels "megatron-core==$MEGATRON_CORE_VERSION" \
      >>"$LOG" 2>&1
}

deps_test() {
  local ok=1
  if ! command -v python3 >/dev/null; then
    say "error: the tests need python3. Install it with:  sudo apt-get install python3 python3-pip"; return 1
  fi
  # Python packages, into .deps/py unless python3 has them. pip_py MODULE TEST PACKAGE...: installs the
  # packages when MODULE cannot be imported.
  py_has() { PYTHONPATH=.deps/py${PYTHONPATH:+:$PYTHONPATH} python3 -c "import $1" 2>/dev/null; }
  pip_py() {
    local mod=$1 test=$2; shift 2
    py_has "$mod" && return 0
    say "installing $* into .deps/py with pip (log: $LOG)"
    if [ "${AUTO_DEPS:-1}" = 0 ] || ! python3 -m pip install -q --target .deps/py "$@" >>"$LOG" 2>&1 || ! py_has "$mod"; then
      say "error: $mod is missing ($test) and pip could not install it (see $LOG)."
      say "install it with:  python3 -m pip install ${*/--no-deps/}"; return 1
    fi
  }
  # numpy: the engine's Python tools read checkpoints with it.
  pip_py numpy tests/system/test_hf_export.sh numpy || ok=0
  # wandb (100 MB with its dependencies, ~12 s on a fresh machine) follows the JSONL log into an
  # offline run; tensorboard's event reader reads the engine's event files. tensorboard comes without
  # its server's dependencies (grpcio, werkzeug, pillow: 150 MB more): the reader needs protobuf,
  # absl-py and packaging (wandb brings the first and the last).
  pip_py wandb tests/system/test_logging.sh wandb || ok=0
  local tb=(--no-deps tensorboard absl-py)
  py_has google.protobuf || tb+=(protobuf)
  py_has packaging || tb+=(packaging)
  pip_py tensorboard.backend.event_processing.event_accumulator tests/system/test_logging.sh "${tb[@]}" || ok=0
  # pyarrow writes the parquet files of tests/system/test_tokenize_parquet.sh (it needs nothing else).
  pip_py pyarrow.parquet tests/system/test_tokenize_parquet.sh --no-deps "pyarrow==$ARROW_VERSION" || ok=0
  # megatron-core's wheel (2.5 MB), not installed: tests/system/test_megatron_writer.sh runs the dataset
  # writer module it holds (which needs neither torch nor a GPU for writing).
  fetch_megatron_core || { say "error: megatron-core's wheel is missing (tests/system/test_megatron_writer.sh) and pip" \
    "could not download it (see $LOG); download it with:  python3 -m pip download --no-deps -d .deps/wheels" \
    "megatron-core==$MEGATRON_CORE_VERSION"; ok=0; }
  # clang with libFuzzer and the sanitizers' runtime.
  local probe='int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }'
  fuzz_ok() { local c; c=${CLANG:-$(command -v clang || command -v clang-14)} && [ -n "$c" ] &&
    echo "$probe" | "$c" -x c -fsanitize=fuzzer,address,undefined - -o "$BUILD/.fuzz_probe" >/dev/null 2>&1; }
  if ! fuzz_ok && ! { apt_install clang libclang-rt-dev && fuzz_ok; }; then
    say "error: no clang with libFuzzer (tests/system/test_fuzz.sh), and it could not be installed."
    say "install it with:  sudo apt-get install clang libclang-rt-dev"; ok=0
  fi
  rm -f "$BUILD/.fuzz_probe"
  # clang-format (tests/system/test_style.sh compares the sources with clang-format 14; without it,
  # or with another version, only the column limit is checked): installed when it can be, not required.
  command -v clang-format >/dev/null || apt_install clang-format || true
  [ $ok = 1 ]
}

deps_fetch() {
  local pkgs=() e pkg h a
  for e in "${C_LIBS[@]}"; do read -r pkg h a <<<"$e"; pkgs+=("$pkg"); done
  AUTO_DEPS=1
  apt_unpack .deps/root "${pkgs[@]}" || { say "error: apt-get download failed (see $LOG)"; return 1; }
  fetch_cudnn_fe || { say "error: pip download of nvidia-cudnn-frontend failed (see $LOG)"; return 1; }
  fetch_megatron_core || { say "error: pip download of megatron-core failed (see $LOG)"; return 1; }
  say "fetched into .deps/: $(du -sh .deps | cut -f1); build with them: make DEPS=.deps/root (no parquet reader:" \
      "it needs .deps/arrow, 63 MB, which make fetches where pip works)"
}

# CUTLASS's headers for fp4/gemm_cutlass.cu (header-only; optional like the CUDA backend: without them
# that file builds a stub and the Makefile says so), into .deps/cutlass/include unless CUTLASS_HOME
# names another copy. From the PyPI wheel nvidia-cutlass, kept in .deps/ (6.4 MB against the headers'
# 27: what the GPU machine carries) and unpacked from there, also with AUTO_DEPS=0; downloaded with
# pip when it is not there. A failed download is not retried on every make: rm
# $BUILD/cutlass_fetch_failed to try again. "fetch": the wheel must be got.
CUTLASS_VERSION=4.2.0.0
CUTLASS_WHEEL=.deps/nvidia_cutlass-$CUTLASS_VERSION-py3-none-any.whl
deps_cutlass() {
  [ "${CUTLASS_HOME:-.deps/cutlass}" = .deps/cutlass ] || return 0
  if [ "${1:-}" != fetch ]; then
    grep -q '^CUDA_BUILD := 1' "$BUILD/deps.mk" 2>/dev/null || return 0
    [ ! -f .deps/cutlass/include/cutlass/cutlass.h ] || return 0
    [ -f "$CUTLASS_WHEEL" ] || { [ "${AUTO_DEPS:-1}" != 0 ] && [ ! -f "$BUILD/cutlass_fetch_failed" ]; } || return 0
  fi
  if [ ! -f "$CUTLASS_WHEEL" ]; then
    say "fetching CUTLASS's headers (nvidia-cutlass==$CUTLASS_VERSION, 6.4 MB) with pip (log: $LOG)"
    mkdir -p .deps && python3 -m pip download -q --no-deps --retries 1 --timeout 20 -d .deps \
      "nvidia-cutlass==$CUTLASS_VERSION" >>"$LOG" 2>&1 && [ -f "$CUTLASS_WHEEL" ] ||
      { touch "$BUILD/cutlass_fetch_failed"; say "no CUTLASS: pip could not download it (see $LOG)"; return 1; }
  fi
  say "unpacking CUTLASS's headers from $CUTLASS_WHEEL into .deps/cutlass/include"
  local fail="unpacking $CUTLASS_WHEEL failed (see $LOG)"
  python3 - "$CUTLASS_WHEEL" .deps/cutlass <<'EOF' >>"$LOG" 2>&1 || { say "$fail"; return 1; }
import os, shutil, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
pre, tmp = "cutlass_library/source/include/", dest + ".tmp"  # whole or not at all
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(pre) and not n.endswith("/"):
            out = os.path.join(tmp, "include", n[len(pre):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as src, open(out, "wb") as f:
                shutil.copyfileobj(src, f)
shutil.rmtree(dest, ignore_errors=True)
os.rename(tmp, dest)
EOF
}

case "${1:-}" in
  build) deps_build && { deps_cutlass || true; } ;;
  test)  deps_test ;;
  fetch) deps_fetch && deps_cutlass fetch ;;
  cudnn-dir) mkdir -p "$BUILD" && newest_cudnn ;;  # the folder of the newest cuDNN 9 here (scripts/gpu/prebuilt.sh)
  *) echo "usage: scripts/deps.sh build|test|fetch|cudnn-dir" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The README's two commands as a new user meets them: each case runs in a fresh Debian 12 root
# (debootstrap minbase plus gcc, make, python3, pip, git, ca-certificates; nothing else) holding a
# copy of this working tree, with ../shared bound read-only beside it. Prints, per case, what the
# build installed, each command's wall time and its last lines, then a table. Needs root,
# debootstrap and network; the root is built once and kept as $FRESH_TAR.
#   sudo bash scripts/check_fresh_machine.sh [cpu] [cuda] [fe-offline] [offline] [nonroot]
# cpu         no nvcc: the CPU backend; make test must end "N passed, 0 failed"
# cuda        the host's CUDA toolkit bound in: the CUDA backend too (cuDNN frontend fetched)
# fe-offline  nvcc and the -dev packages there, no network: ./train for the CPU, a line saying why
# offline     nothing installed, no network: make stops before compiling, naming what to install
# nonroot     a user without sudo, g++ there: the C libraries unpacked into .deps/root, numpy into
#             .deps/py; make test stops naming clang, which needs root
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
[ "$(id -u)" = 0 ] || { echo "needs root (chroot, mount)"; exit 1; }
FRESH_TAR=${FRESH_TAR:-/var/tmp/fp4train-fresh-bookworm.tar}
CUDA_DIR=${CUDA_DIR:-$(readlink -f /usr/local/cuda)}
work=$(mktemp -d /var/tmp/fresh.XXXXXX)
cases=${*:-cpu cuda fe-offline offline nonroot}
declare -a table

if [ ! -f "$FRESH_TAR" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  echo "building the fresh root (debootstrap, a few minutes)"
  debootstrap --variant=minbase --include=gcc,make,python3,python3-pip,ca-certificates,git \
    bookworm "$work/base" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
    { tail "$work/debootstrap.log"; exit 1; }
  tar -C "$work/base" -cf "$FRESH_TAR" . && rm -rf "$work/base"
fi

umount_all() { local m; for m in $(awk -v r="$1" '$2 ~ "^"r {print $2}' /proc/mounts | sort -r); do umount -l "$m"; done; }
cleanup() { umount_all "$work"; rm -rf "$work"; }
trap cleanup EXIT

# A fresh root at $R with the tree at /root/work/main (or /home/u/work/main for nonroot).
make_root() {
  R=$work/$1; home=$2
  mkdir -p "$R" && tar -C "$R" -xf "$FRESH_TAR"
  mount -t proc proc "$R/proc"; mount --bind /dev "$R/dev"; mount --bind /dev/pts "$R/dev/pts"
  cp /etc/resolv.conf "$R/etc/resolv.conf"
  # The host's own extra CA certificates (a proxy's), so that pip and apt reach what the host does.
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/" 2>/dev/null &&
    chroot "$R" update-ca-certificates >/dev/null 2>&1
  mkdir -p "$R$home/work/main" "$R$home/work/shared"
  mount --bind ../shared "$R$home/work/shared" && mount -o remount,bind,ro "$R$home/work/shared"
  git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$R$home/work/main"
}
with_cuda() {
  mkdir -p "$R$CUDA_DIR" && mount --bind "$CUDA_DIR" "$R$CUDA_DIR" && ln -sfn "$CUDA_DIR" "$R/usr/local/cuda"
}
# run CASE NAME USER NET COMMAND: one command in the root, timed; NET=0 runs it without a network.
run() {
  local c=$1 name=$2 user=$3 net=$4 cmd=$5 t0=$SECONDS rc
  local env=(env -i HOME="$home" PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
             LANG=C.UTF-8 TERM=dumb)
  local pre=(); [ "$net" = 0 ] && pre=(unshare -n)
  "${pre[@]}" chroot --userspec="$user" "$R" "${env[@]}" bash -c "cd $home/work/main && $cmd" >"$work/$c.$name.log" 2>&1
  rc=$?
  echo "-- $c: $cmd  (exit $rc, $((SECONDS - t0)) s)"
  grep -E '^deps:|^note:|\*\*\*' "$work/$c.$name.log" | head -n 12
  grep -vE '^deps:|^note:|\*\*\*|^(cc|gcc|g\+\+|ar|nvcc|/usr/local/cuda)' "$work/$c.$name.log" | tail -n 3
  table+=("$(printf '%-10s %-40s exit %-3s %5s s  %s' "$c" "$cmd" "$rc" $((SECONDS - t0)) \
             "$(grep -E '^[0-9]+ passed, [0-9]+ failed$|^step +[0-9]+ \| val loss|Stop\.$|^note:' "$work/$c.$name.log" | tail -n 1 | cut -c1-90)")")
  return $rc
}

for c in $cases; do
  echo "== $c"
  case $c in
    cpu) make_root cpu /root
      run cpu a 0:0 1 'make && ./train configs/tiny.yaml' && run cpu b 0:0 1 'make test' ;;
    cuda) make_root cuda /root; with_cuda
      run cuda a 0:0 1 'make && ./train configs/tiny.yaml' && run cuda b 0:0 1 'make test'
      grep -q '^CUDA_BUILD := 1' "$R/root/work/main/build/deps.mk" && table+=("cuda       the CUDA backend was built") ||
        table+=("cuda       FAIL: the CUDA backend was not built") ;;
    fe-offline) make_root fe-offline /root; with_cuda
      chroot "$R" env DEBIAN_FRONTEND=noninteractive bash -c \
        'apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ libyaml-dev libzstd-dev libpcre2-dev' >/dev/null 2>&1
      run fe-offline a 0:0 0 'make && ./train configs/tiny.yaml' ;;
    offline) make_root offline /root
      run offline a 0:0 0 'make && ./train configs/tiny.yaml' ;;
    nonroot) make_root nonroot /home/u
      # g++ there, as on most developer machines; the -dev packages, numpy and clang not.
      chroot "$R" env DEBIAN_FRONTEND=noninteractive bash -c \
        'apt-get update -qq && apt-get install -y -qq --no-install-recommends g++' >/dev/null 2>&1
      chroot "$R" useradd -m -u 1000 u 2>/dev/null; chroot "$R" chown -R u: /home/u/work/main
      run nonroot a 1000:1000 1 'make && ./train configs/tiny.yaml' && run nonroot b 1000:1000 1 'make test' ;;
    *) echo "unknown case $c"; exit 2 ;;
  esac
  umount_all "$R"
done
echo; echo "== summary"; printf '%s\n' "${table[@]}"

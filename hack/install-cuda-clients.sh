#!/usr/bin/env bash
# Installs NVIDIA's Python driver-API clients (cuda-bindings, numba-cuda and the CUDA 12.9 wheels they
# load) into a virtualenv of their own in the machine-wide cache, for the conformance tests that run
# them over the fake driver with libvgpu-control.so preloaded. Not in .venv: about 790 MB of CUDA
# wheels that vgpud never imports (docs/decisions.md). Idempotent: does nothing when the cache holds a
# venv of hack/cuda-clients.txt as it is (a stamp holds the file's hash); an edit there makes a new
# venv and prunes the old one.
#
#   hack/install-cuda-clients.sh             install what is missing, then write <cache>/cuda-clients.env
#   hack/install-cuda-clients.sh --print-env also print cuda-clients.env (CUDA_CLIENTS_PYTHON=...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}/cuda-clients-<hash>. Downloads go to pip's cache
# (PIP_CACHE_DIR: the Makefile points it at .cache/pip). Cold: 258 MB of wheels to fetch, unpacked to
# about 790 MB, about 20 s on 2 cores with a fast mirror; warm: nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=hack/cuda-clients.txt
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
PYTHON=${PYTHON:-python3}

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-cuda-clients: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-cuda-clients: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.install-cuda-clients.lock"
flock 9

hash=$(sha256sum "$LOCK" | cut -c1-16)
DIR=$CACHE/cuda-clients-$hash
stamp=$DIR/.installed

if [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
  start=$(date +%s)
  rm -rf "$DIR"  # an interrupted run's (we hold the lock)
  say "installing $LOCK into $DIR"
  "$PYTHON" -m venv "$DIR"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # the lock names every package: no resolution, no sdist builds
  if ! "$DIR/bin/python" -m pip install -q --no-deps --only-binary=:all: -r "$LOCK" >"$DIR/install.log" 2>&1 ||
    ! "$DIR/bin/python" -m pip check >>"$DIR/install.log" 2>&1 ||
    ! "$DIR/bin/python" -c 'import cuda.bindings.driver, numba.cuda' >>"$DIR/install.log" 2>&1; then
    cat "$DIR/install.log" >&2
    say "failed (log above); nothing kept"
    rm -rf "$DIR"
    exit 1
  fi
  echo "$hash" >"$stamp"
  for old in "$CACHE"/cuda-clients-*; do
    [ "$old" = "$DIR" ] || rm -rf "$old"
  done
  say "done in $(($(date +%s) - start)) s ($(du -sh "$DIR" | cut -f1))"
fi

env_file=$CACHE/cuda-clients.env
printf 'CUDA_CLIENTS_LOCK=%s\nCUDA_CLIENTS_PYTHON=%s\n' "$hash" "$DIR/bin/python" >"$env_file.tmp"
mv "$env_file.tmp" "$env_file"
[ "$print_env" = 1 ] && cat "$env_file"
exit 0

#!/usr/bin/env bash
# Installs NVIDIA's container toolkit CLI and CDI hook into the cache the other node installers use:
# nvidia-ctk and nvidia-cdi-hook built from the github.com/NVIDIA/nvidia-container-toolkit Go module.
# They are the independent peer of vgpud's GPU edits: tests run `nvidia-ctk cdi generate` over the
# local node's fake driver root and compare its spec with vgpud's, and the local node puts
# nvidia-cdi-hook into that root, where vgpud finds it as it finds the toolkit's on a GPU node.
# Both need cgo (go-nvml), and a lazily bound link (-z lazy, as the toolkit's own Makefile builds them):
# go-nvml binds NVML at run time, a bind-now build aborts on the first symbol a driver lacks.
# Idempotent: prints nothing and does nothing when the cache holds this version's build.
#
#   hack/install-nvidia-ctk.sh             install what is missing, then write <cache>/nvidia-ctk.env
#   hack/install-nvidia-ctk.sh --print-env also print nvidia-ctk.env (NVIDIA_CTK_BIN=..., ...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}/nvidia-ctk-<version>. Go's own caches stay at their defaults.
# Cold: the module's dependencies and about a minute of compiling on 2 cores; warm: nothing.
set -euo pipefail

NVIDIA_CTK_VERSION=${NVIDIA_CTK_VERSION:-v1.20.2}  # newest v1.20.x the Go module proxy serves
NVIDIA_CTK_RECIPE=1                                # bump when the build recipe below changes
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
MODULE=github.com/NVIDIA/nvidia-container-toolkit

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-nvidia-ctk: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-nvidia-ctk: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.install-nvidia-ctk.lock"
flock 9
rm -rf "$CACHE"/.nvidia-ctk.*  # an interrupted run's (we hold the lock)

DIR=$CACHE/nvidia-ctk-$NVIDIA_CTK_VERSION
BIN_DIR=$DIR/bin
stamp="version=$NVIDIA_CTK_VERSION recipe=$NVIDIA_CTK_RECIPE"

build() {
  local tmp start out
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || { say "go is not installed (nvidia-container-toolkit $NVIDIA_CTK_VERSION needs Go >= 1.26)"; exit 1; }
  command -v gcc >/dev/null || { say "gcc is not installed (cgo builds go-nvml)"; exit 1; }
  export GOTOOLCHAIN=local CGO_ENABLED=1
  start=$(date +%s)
  say "building nvidia-ctk and nvidia-cdi-hook $NVIDIA_CTK_VERSION from $MODULE into $BIN_DIR"
  tmp=$(mktemp -d "$CACHE/.nvidia-ctk.XXXXXX") && chmod 755 "$tmp"
  # go-nvml's cgo prologue warns about every deprecated NVML call; keep the log to errors
  CGO_CFLAGS="-O2 -Wno-deprecated-declarations" GOBIN=$tmp/bin go install -trimpath \
    -ldflags "-s -w -X $MODULE/internal/info.version=${NVIDIA_CTK_VERSION#v} -extldflags=-Wl,-z,lazy" \
    "$MODULE/cmd/nvidia-ctk@$NVIDIA_CTK_VERSION" "$MODULE/cmd/nvidia-cdi-hook@$NVIDIA_CTK_VERSION"
  if ! out=$("$tmp/bin/nvidia-ctk" --version 2>&1) || [[ $out != *"${NVIDIA_CTK_VERSION#v}"* ]]; then
    say "nvidia-ctk --version says '$out', not $NVIDIA_CTK_VERSION"
    rm -rf "$tmp"
    exit 1
  fi
  if ! "$tmp/bin/nvidia-cdi-hook" --help >/dev/null 2>&1; then
    say "nvidia-cdi-hook --help fails"
    rm -rf "$tmp"
    exit 1
  fi
  echo "$stamp" >"$tmp/.stamp"
  rm -rf "$DIR" && mv "$tmp" "$DIR"
  local old
  for old in "$CACHE"/nvidia-ctk-v*; do
    [ "$old" = "$DIR" ] || { say "removing the old build $old"; rm -rf "$old"; }
  done
  say "built nvidia-ctk $NVIDIA_CTK_VERSION in $(($(date +%s) - start)) s"
}

if ! grep -qxF "$stamp" "$DIR/.stamp" 2>/dev/null; then
  build
fi

# --- nvidia-ctk.env ---------------------------------------------------------------------------------
env_file=$CACHE/nvidia-ctk.env
env_text="NVIDIA_CTK_VERSION=$NVIDIA_CTK_VERSION
NVIDIA_CTK_BIN=$BIN_DIR/nvidia-ctk
NVIDIA_CDI_HOOK_BIN=$BIN_DIR/nvidia-cdi-hook"
if [ "$(cat "$env_file" 2>/dev/null)" != "$env_text" ]; then
  echo "$env_text" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
  say "wrote $env_file"
fi
if [ "$print_env" = 1 ]; then
  echo "$env_text"
fi

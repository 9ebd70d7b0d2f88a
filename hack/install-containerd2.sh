#!/usr/bin/env bash
# Installs the containerd 2.x runtime track of the local test node into the cache hack/install-node.sh
# uses: containerd, containerd-shim-runc-v2 and ctr built from the github.com/containerd/containerd/v2
# Go module (the Debian containerd hack/install-node.sh unpacks, trixie's, is 1.7), with the build tags
# containerd's Makefile uses by default (urfave_cli_no_docs; the shim also no_grpc) and cgo off, which
# leaves out the btrfs snapshotter (it needs cgo and the btrfs headers; the node uses overlayfs). runc
# stays the one hack/install-node.sh unpacks (bookworm's 1.1.5): containerd 2.x drives it through the
# same shim protocol and `runc features`, which 1.1 has (docs/containerd2.md). Idempotent: prints
# nothing and does nothing when the cache holds this version's build.
#
#   hack/install-containerd2.sh             install what is missing, then write <cache>/containerd2.env
#   hack/install-containerd2.sh --print-env also print containerd2.env (CONTAINERD_BIN=..., CTR_BIN=...,
#                                           CONTAINERD2_CONFIG_VERSION=...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}/containerd-<version>. Go's own caches stay at their defaults.
# Cold: the modules containerd needs beyond Kubernetes' and ~1.5 minutes of compiling on 2 cores; warm: nothing.
set -euo pipefail

CONTAINERD2_VERSION=${CONTAINERD2_VERSION:-v2.4.2}  # newest 2.x the Go module proxy serves that builds here
CONTAINERD2_RECIPE=1                                # bump when the build recipe below changes
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
MODULE=github.com/containerd/containerd/v2

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-containerd2: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-containerd2: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.install-containerd2.lock"
flock 9
rm -rf "$CACHE"/.containerd2.*  # an interrupted run's (we hold the lock)

DIR=$CACHE/containerd-$CONTAINERD2_VERSION
BIN_DIR=$DIR/bin
stamp="version=$CONTAINERD2_VERSION recipe=$CONTAINERD2_RECIPE"

build() {
  local tmp start ldflags out
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || { say "go is not installed (containerd $CONTAINERD2_VERSION needs Go >= 1.26)"; exit 1; }
  export GOTOOLCHAIN=local CGO_ENABLED=0
  start=$(date +%s)
  say "building containerd, containerd-shim-runc-v2 and ctr $CONTAINERD2_VERSION from $MODULE into $BIN_DIR"
  tmp=$(mktemp -d "$CACHE/.containerd2.XXXXXX") && chmod 755 "$tmp"
  # What the Makefile's GO_LDFLAGS set (a module build has no git revision to stamp).
  ldflags="-s -w -X $MODULE/version.Version=$CONTAINERD2_VERSION -X $MODULE/version.Package=$MODULE"
  GOBIN=$tmp/bin go install -trimpath -tags urfave_cli_no_docs,no_btrfs -ldflags "$ldflags" \
    "$MODULE/cmd/containerd@$CONTAINERD2_VERSION" "$MODULE/cmd/ctr@$CONTAINERD2_VERSION"
  GOBIN=$tmp/bin go install -trimpath -tags urfave_cli_no_docs,no_btrfs,no_grpc -ldflags "$ldflags" \
    "$MODULE/cmd/containerd-shim-runc-v2@$CONTAINERD2_VERSION"
  if ! out=$("$tmp/bin/containerd" --version 2>&1) || [[ $out != *" $CONTAINERD2_VERSION "* ]]; then
    say "containerd --version says '$out', not $CONTAINERD2_VERSION"
    rm -rf "$tmp"
    exit 1
  fi
  if ! out=$("$tmp/bin/containerd-shim-runc-v2" -v 2>&1) || [[ $out != *"$CONTAINERD2_VERSION"* ]]; then
    say "containerd-shim-runc-v2 -v says '$out', not $CONTAINERD2_VERSION"
    rm -rf "$tmp"
    exit 1
  fi
  echo "$stamp" >"$tmp/.stamp"
  rm -rf "$DIR" && mv "$tmp" "$DIR"
  local old
  for old in "$CACHE"/containerd-v2.*; do
    [ "$old" = "$DIR" ] || { say "removing the old build $old"; rm -rf "$old"; }
  done
  say "built containerd $CONTAINERD2_VERSION in $(($(date +%s) - start)) s"
}

if ! grep -qxF "$stamp" "$DIR/.stamp" 2>/dev/null; then
  build
fi

# --- containerd2.env --------------------------------------------------------------------------------
env_file=$CACHE/containerd2.env
# The config version this containerd writes by default (3 up to 2.3, 4 from 2.4): the node writes it.
config_version=$("$BIN_DIR/containerd" config default | sed -n 's/^version = \([0-9]*\)$/\1/p')
[ -n "$config_version" ] || { say "$BIN_DIR/containerd config default names no config version"; exit 1; }
env_text="CONTAINERD2_VERSION=$CONTAINERD2_VERSION
CONTAINERD2_CONFIG_VERSION=$config_version
CONTAINERD_BIN=$BIN_DIR/containerd
CTR_BIN=$BIN_DIR/ctr
SHIM_BIN_DIR=$BIN_DIR"
if [ "$(cat "$env_file" 2>/dev/null)" != "$env_text" ]; then
  echo "$env_text" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
  say "wrote $env_file"
fi
if [ "$print_env" = 1 ]; then
  echo "$env_text"
fi

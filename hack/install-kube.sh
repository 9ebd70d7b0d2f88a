#!/usr/bin/env bash
# Installs the real Kubernetes peers the tests run against, into a machine-wide cache that survives fresh
# clones: etcd (Debian trixie's etcd-server .deb, unpacked, not installed) and kube-apiserver,
# kube-scheduler and kubelet (built from the k8s.io/kubernetes Go module through a wrapper module that
# pins every k8s.io/* staging module). Idempotent: prints nothing and does nothing when the cache holds
# what this recipe asks for; a version bump rebuilds.
#
#   hack/install-kube.sh             install what is missing, then write <cache>/kube.env
#   hack/install-kube.sh --print-env also print kube.env (KUBE_BIN_DIR=..., ETCD_BIN=..., ...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}. Go's own caches (GOCACHE, GOMODCACHE) stay at their defaults.
# A cold run (empty Go caches) downloads ~700 MB of Go modules and compiles for ~6 minutes on 2 cores; with
# warm Go caches a rebuild is a ~15 s link. Old kube-* builds are pruned after a successful build.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.5}        # newest 1.36 k8s.io/kubernetes the Go module proxy serves
ETCD_SUITE=${ETCD_SUITE:-trixie}              # etcd-server 3.5.16 runs on bookworm (libc 2.36)
ETCD_RECIPE=1                                 # bump when a recipe below changes, to redo that part
KUBE_RECIPE=3
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-kube: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-kube: $*" >&2; }

mkdir -p "$CACHE"
# One installer at a time per cache (CI jobs on one machine share it).
exec 9>"$CACHE/.install-kube.lock"
flock 9
rm -rf "$CACHE"/.kube.* "$CACHE"/.etcd.*  # what an interrupted run left (we hold the lock)

# --- etcd ------------------------------------------------------------------------------------------
ETCD_DIR=$CACHE/etcd-$ETCD_SUITE
ETCD_BIN=$ETCD_DIR/root/usr/bin/etcd
etcd_stamp="suite=$ETCD_SUITE recipe=$ETCD_RECIPE"

# The Debian mirror the system's own sources use (deb822 or one-line format); deb.debian.org otherwise.
debian_mirror() {
  local url
  url=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | sed -n 's#^URIs:[[:space:]]*\([^[:space:]]*/debian\)/\{0,1\}[[:space:]]*$#\1#p' | head -n1 || true)
  if [ -z "$url" ]; then
    url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | sed -n 's#^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]*/debian\)/\{0,1\}[[:space:]].*#\2#p' \
      | head -n1 || true)
  fi
  echo "${url:-http://deb.debian.org/debian}"
}

install_etcd() {
  local mirror apt_dir tmp deb version keyring
  mirror=$(debian_mirror)
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  apt_dir=$CACHE/apt-$ETCD_SUITE
  say "etcd: downloading etcd-server from Debian $ETCD_SUITE ($mirror) with a private apt state in $apt_dir"
  mkdir -p "$apt_dir"/{lists/partial,cache/archives/partial,etc}
  echo "deb [signed-by=$keyring] $mirror $ETCD_SUITE main" >"$apt_dir/etc/sources.list"
  local -a apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
    -o APT::Sandbox::User=root -o Acquire::Languages=none -o APT::Get::List-Cleanup=0
  )
  apt-get "${apt_opts[@]}" -qq update
  tmp=$(mktemp -d "$CACHE/.etcd.XXXXXX") && chmod 755 "$tmp"
  (cd "$tmp" && apt-get "${apt_opts[@]}" -qq download etcd-server)
  deb=$(ls "$tmp"/etcd-server_*.deb)
  version=$(dpkg-deb -f "$deb" Version)
  dpkg-deb -x "$deb" "$tmp/root"
  rm -f "$deb"
  if ! out=$("$tmp/root/usr/bin/etcd" --version 2>&1); then
    say "etcd: the $ETCD_SUITE binary does not run here: $out"
    rm -rf "$tmp"
    exit 1
  fi
  echo "$etcd_stamp version=$version" >"$tmp/.stamp"
  rm -rf "$ETCD_DIR" && mv "$tmp" "$ETCD_DIR"
  rm -rf "$apt_dir"  # 28 MB of package lists, only needed again for a new suite
  say "etcd: $version -> $ETCD_BIN ($(echo "$out" | head -n1))"
}

if [ ! -x "$ETCD_BIN" ] || ! grep -q "^$etcd_stamp version=" "$ETCD_DIR/.stamp" 2>/dev/null; then
  install_etcd
fi

# --- kube-apiserver, kube-scheduler, kubelet ---------------------------------------------------------
KUBE_DIR=$CACHE/kube-$KUBE_VERSION
KUBE_BIN_DIR=$KUBE_DIR/bin
KUBE_CMDS=(kube-apiserver kube-scheduler kubelet)
kube_stamp="version=$KUBE_VERSION recipe=$KUBE_RECIPE cmds=${KUBE_CMDS[*]}"

build_kube() {
  local staging_version="v0${KUBE_VERSION#v1}" tmp info gomod build_date minor major pkgs=() cmd start
  command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null || { say "kube: go is not installed (need Go >= 1.26)"; exit 1; }
  GOFLAGS="-mod=mod $(go env GOFLAGS)"
  export GOFLAGS GOTOOLCHAIN=local CGO_ENABLED=0
  start=$(date +%s)
  say "kube: building ${KUBE_CMDS[*]} $KUBE_VERSION into $KUBE_BIN_DIR (cold: downloads modules, compiles for long)"
  go mod download "k8s.io/kubernetes@$KUBE_VERSION"
  info=$(go list -m -json "k8s.io/kubernetes@$KUBE_VERSION")
  gomod=$(echo "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  # The release's tag time as the build date: reproducible, and what the release binaries carry.
  build_date=$(echo "$info" | sed -n 's/^[[:space:]]*"Time": "\(.*\)",\{0,1\}$/\1/p')
  tmp=$(mktemp -d "$CACHE/.kube.XXXXXX") && chmod 755 "$tmp"
  mkdir -p "$tmp/src"
  {
    echo "// Generated by hack/install-kube.sh: builds k8s.io/kubernetes $KUBE_VERSION commands."
    echo "module vgpud.local/kubebuild"
    echo
    echo "go $(sed -n 's/^go //p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    echo "replace ("
    # Every staging module k8s.io/kubernetes requires at v0.0.0 (it replaces them with ./staging/...,
    # which module zips do not carry) goes to its published v0.x twin.
    sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) v0\.0\.0$#\1#p' "$gomod" | while read -r mod; do
      echo "	$mod => $mod $staging_version"
    done
    echo ")"
  } >"$tmp/src/go.mod"
  # A tools file so `go mod tidy` keeps the commands' dependencies.
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for cmd in "${KUBE_CMDS[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$cmd\""; done
    echo ")"
  } >"$tmp/src/tools.go"
  (cd "$tmp/src" && go mod tidy)
  major=${KUBE_VERSION#v}; major=${major%%.*}
  minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
  local ldflags="-s -w"
  local kv
  for kv in "gitVersion=$KUBE_VERSION" "gitCommit=" "gitMajor=$major" "gitMinor=$minor" "gitTreeState=clean" \
    "buildDate=$build_date"; do
    ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  for cmd in "${KUBE_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  mkdir -p "$tmp/bin"
  (cd "$tmp/src" && go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$tmp/bin/" "${pkgs[@]}")
  for cmd in "${KUBE_CMDS[@]}"; do
    if ! "$tmp/bin/$cmd" --version | grep -qxF "Kubernetes $KUBE_VERSION"; then
      say "kube: $cmd --version says '$("$tmp/bin/$cmd" --version 2>&1)', not Kubernetes $KUBE_VERSION"
      rm -rf "$tmp"
      exit 1
    fi
  done
  echo "$kube_stamp" >"$tmp/.stamp"
  rm -rf "$KUBE_DIR" && mv "$tmp" "$KUBE_DIR"
  local old
  for old in "$CACHE"/kube-v*; do
    [ "$old" = "$KUBE_DIR" ] || { say "kube: removing the old build $old"; rm -rf "$old"; }
  done
  say "kube: built ${KUBE_CMDS[*]} $KUBE_VERSION in $(($(date +%s) - start)) s"
}

if ! grep -qxF "$kube_stamp" "$KUBE_DIR/.stamp" 2>/dev/null; then
  build_kube
fi
for cmd in "${KUBE_CMDS[@]}"; do
  [ -x "$KUBE_BIN_DIR/$cmd" ] || { say "kube: $KUBE_BIN_DIR/$cmd is missing after install"; exit 1; }
done

# --- kube.env ----------------------------------------------------------------------------------------
env_file=$CACHE/kube.env
env_text="KUBE_VERSION=$KUBE_VERSION
KUBE_BIN_DIR=$KUBE_BIN_DIR
ETCD_BIN=$ETCD_BIN
ETCD_VERSION=$(sed -n 's/.* version=//p' "$ETCD_DIR/.stamp")"
if [ "$(cat "$env_file" 2>/dev/null)" != "$env_text" ]; then
  echo "$env_text" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
  say "wrote $env_file"
fi
if [ "$print_env" = 1 ]; then
  echo "$env_text"
fi

#!/usr/bin/env bash
# Installs the container runtime side of the local test node into the cache hack/install-kube.sh uses:
# containerd 1.7 (NRI v0.6 + CDI), runc, the CNI plugins (only `loopback` is used) and busybox-static,
# all from Debian trixie's .debs, unpacked with dpkg -x (not installed), plus three local OCI images built
# by hand (no registry is reachable): localhost/vgpud-busybox, localhost/vgpud-pause (a static C
# program, csrc/pause/pause.c) and localhost/vgpud-cudaprobe (a dynamic libc: bookworm's libc6, the
# test driver tests/unit/libvgpu/c/memprobe.c linked against libcuda.so.1 as a CUDA program is, and
# busybox; it needs `make build` first for the fake libcuda to link against). Idempotent: prints
# nothing and does nothing when the cache holds what this recipe asks for.
#
#   hack/install-node.sh             install what is missing, then write <cache>/node.env
#   hack/install-node.sh --print-env also print node.env (NODE_BIN_DIR=..., BUSYBOX_IMAGE_TAR=..., ...)
#
# Cache: ${VGPUD_CACHE:-$HOME/.cache/vgpud}. Cold: ~40 MB of .debs; warm: nothing.
set -euo pipefail

# suite:package. trixie's containerd 1.7.24 (NRI v0.6.1, CDI 0.8.0) needs libc >= 2.34 and runs on bookworm
# (2.36); trixie's runc 1.1.15 needs libc >= 2.38, so runc comes from bookworm (1.1.5, fine for 1.7).
NODE_SUITE=${NODE_SUITE:-trixie}
RUNC_SUITE=${RUNC_SUITE:-bookworm}
NODE_PACKAGES=("$NODE_SUITE:containerd" "$RUNC_SUITE:runc" "$NODE_SUITE:containernetworking-plugins"
  "$NODE_SUITE:busybox-static")
NODE_RECIPE=2                      # bump when the package recipe below changes
IMAGE_RECIPE=1                     # bump when the image recipe below changes
BUSYBOX_IMAGE=localhost/vgpud-busybox:v1
PAUSE_IMAGE=localhost/vgpud-pause:v1
# The dynamic-libc image: libc6 from the host's suite (bookworm), so programs built here run in it.
LIBC_SUITE=${LIBC_SUITE:-bookworm}
CUDA_IMAGE=localhost/vgpud-cudaprobe:v1
CUDA_IMAGE_RECIPE=2                # bump when the cudaprobe image recipe below changes
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-node: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "install-node: $*" >&2; }
APT_OWNER=node
# shellcheck source=hack/lib/debian.sh
source "$HERE/lib/debian.sh"

mkdir -p "$CACHE"
exec 9>"$CACHE/.install-node.lock"
flock 9
rm -rf "$CACHE"/.node.* "$CACHE"/.images.* "$CACHE"/.libc.* "$CACHE"/.cudaimage.*  # an interrupted run's (we hold the lock)

# --- containerd, runc, CNI plugins, busybox-static ---------------------------------------------------
NODE_DIR=$CACHE/node-$NODE_SUITE
NODE_ROOT=$NODE_DIR/root
node_stamp="suite=$NODE_SUITE recipe=$NODE_RECIPE packages=${NODE_PACKAGES[*]}"

install_packages() {
  local tmp deb spec suite pkg versions=""
  say "downloading ${NODE_PACKAGES[*]} from Debian ($(debian_mirror)) with private apt states in $CACHE/apt-node-*"
  tmp=$(mktemp -d "$CACHE/.node.XXXXXX") && chmod 755 "$tmp"
  for spec in "${NODE_PACKAGES[@]}"; do
    suite=${spec%%:*} pkg=${spec#*:}
    (cd "$tmp" && apt_download "$suite" "$pkg")
    deb=$(ls "$tmp/${pkg}"_*.deb)
    versions+=" $pkg=$(dpkg-deb -f "$deb" Version)"
    dpkg-deb -x "$deb" "$tmp/root"
    rm -f "$deb"
  done
  local check out
  for check in usr/bin/containerd:--version usr/sbin/runc:--version usr/bin/containerd-shim-runc-v2:-v; do
    if ! out=$("$tmp/root/${check%%:*}" "${check#*:}" 2>&1); then
      say "${check%%:*} does not run here: $out"
      rm -rf "$tmp"
      exit 1
    fi
  done
  "$tmp/root/usr/bin/busybox" true || { say "busybox from $NODE_SUITE does not run here"; rm -rf "$tmp"; exit 1; }
  [ -x "$tmp/root/usr/lib/cni/loopback" ] || { say "no CNI loopback plugin in containernetworking-plugins"; rm -rf "$tmp"; exit 1; }
  echo "$node_stamp versions=${versions# }" >"$tmp/.stamp"
  rm -rf "$NODE_DIR" && mv "$tmp" "$NODE_DIR"
  apt_forget_lists
  say "installed${versions} -> $NODE_ROOT"
}

if ! grep -q "^$node_stamp versions=" "$NODE_DIR/.stamp" 2>/dev/null; then
  install_packages
fi

# --- local OCI images -------------------------------------------------------------------------------
IMAGES_DIR=$CACHE/images
src_hash=$(cat "$REPO/csrc/pause/pause.c" "$HERE/ociimage.py" | sha256sum | cut -c1-16)
images_stamp="recipe=$IMAGE_RECIPE src=$src_hash busybox=$BUSYBOX_IMAGE pause=$PAUSE_IMAGE node=$(sed -n 's/.* versions=//p' "$NODE_DIR/.stamp")"

build_images() {
  local tmp applet
  local -a links=()
  tmp=$(mktemp -d "$CACHE/.images.XXXXXX") && chmod 755 "$tmp"
  gcc -static -Os -Wall -Wextra -Werror -o "$tmp/pause" "$REPO/csrc/pause/pause.c"
  python3 "$HERE/ociimage.py" --name "$PAUSE_IMAGE" --out "$tmp/pause.tar" \
    --file "$tmp/pause:/pause:0755" --entrypoint /pause
  # Every applet busybox knows, as a symlink at its usual path.
  while read -r applet; do
    [ "$applet" = bin/busybox ] || links+=(--link "/$applet:/bin/busybox")
  done < <("$NODE_ROOT/usr/bin/busybox" --list-full)
  python3 "$HERE/ociimage.py" --name "$BUSYBOX_IMAGE" --out "$tmp/busybox.tar" \
    --file "$NODE_ROOT/usr/bin/busybox:/bin/busybox:0755" "${links[@]}" \
    --dir /tmp:1777 --dir /etc --dir /proc --dir /sys --dir /dev --dir /root:0700 --cmd /bin/sh
  rm -f "$tmp/pause"
  echo "$images_stamp" >"$tmp/.stamp"
  rm -rf "$IMAGES_DIR" && mv "$tmp" "$IMAGES_DIR"
  say "built $BUSYBOX_IMAGE and $PAUSE_IMAGE -> $IMAGES_DIR"
}

if ! grep -qxF "$images_stamp" "$IMAGES_DIR/.stamp" 2>/dev/null; then
  build_images
fi

# --- the dynamic-libc image (own directories and stamps: the images above stay as they are) -----------
LIBC_DIR=$CACHE/libc-$LIBC_SUITE
libc_stamp="suite=$LIBC_SUITE packages=libc6"

install_libc() {
  local tmp deb
  say "downloading $LIBC_SUITE's libc6 from Debian ($(debian_mirror))"
  tmp=$(mktemp -d "$CACHE/.libc.XXXXXX") && chmod 755 "$tmp"
  (cd "$tmp" && apt_download "$LIBC_SUITE" libc6)
  deb=$(ls "$tmp"/libc6_*.deb)
  dpkg-deb -x "$deb" "$tmp/root"
  echo "$libc_stamp version=$(dpkg-deb -f "$deb" Version)" >"$tmp/.stamp"
  rm -f "$deb"
  rm -rf "$LIBC_DIR" && mv "$tmp" "$LIBC_DIR"
  apt_forget_lists
  say "installed libc6 $(sed -n 's/.* version=//p' "$LIBC_DIR/.stamp") -> $LIBC_DIR/root"
}

if ! grep -q "^$libc_stamp version=" "$LIBC_DIR/.stamp" 2>/dev/null; then
  install_libc
fi

CUDA_IMAGES_DIR=$CACHE/images-cudaprobe
PROBE_SRC=$REPO/tests/unit/libvgpu/c/memprobe.c
FAKE_CUDA_DIR=$REPO/build/fakecuda
probe_hash=$(cat "$PROBE_SRC" "$HERE/ociimage.py" | sha256sum | cut -c1-16)
cuda_image_stamp="recipe=$CUDA_IMAGE_RECIPE src=$probe_hash image=$CUDA_IMAGE libc=$(cat "$LIBC_DIR/.stamp") node=$(sed -n 's/.* versions=//p' "$NODE_DIR/.stamp")"

build_cuda_image() {
  local tmp root=$LIBC_DIR/root applet lib
  local -a files=() links=()
  if [ ! -e "$FAKE_CUDA_DIR/libcuda.so" ]; then
    say "no $FAKE_CUDA_DIR/libcuda.so to link the probe against: run make build first"
    exit 1
  fi
  tmp=$(mktemp -d "$CACHE/.cudaimage.XXXXXX") && chmod 755 "$tmp"
  # Linked by soname (NEEDED libcuda.so.1) like any CUDA program; the container gets the driver mounted.
  gcc -std=gnu11 -O1 -Wall -Werror -o "$tmp/memprobe" "$PROBE_SRC" -L"$FAKE_CUDA_DIR" -lcuda -ldl -lpthread
  # libc6's shared objects (what a dynamic program and the preloaded library load), not its tools.
  while read -r lib; do
    files+=(--file "$root/$lib:/$lib:0755")
  done < <(cd "$root" && find lib* usr/lib* -name '*.so*' -type f | sort)
  while read -r lib; do
    links+=(--link "/$lib:$(readlink "$root/$lib")")
  done < <(cd "$root" && find lib* usr/lib* -name '*.so*' -type l | sort)
  while read -r applet; do
    [ "$applet" = bin/busybox ] || links+=(--link "/$applet:/bin/busybox")
  done < <("$NODE_ROOT/usr/bin/busybox" --list-full)
  python3 "$HERE/ociimage.py" --name "$CUDA_IMAGE" --out "$tmp/cudaprobe.tar" \
    "${files[@]}" "${links[@]}" \
    --file "$tmp/memprobe:/usr/local/bin/memprobe:0755" \
    --file "$NODE_ROOT/usr/bin/busybox:/bin/busybox:0755" \
    --dir /tmp:1777 --dir /etc --dir /proc --dir /sys --dir /dev --dir /root:0700 \
    --dir /usr/lib/x86_64-linux-gnu --env NVIDIA_VISIBLE_DEVICES=all --cmd /bin/sh
  rm -f "$tmp/memprobe"
  echo "$cuda_image_stamp" >"$tmp/.stamp"
  rm -rf "$CUDA_IMAGES_DIR" && mv "$tmp" "$CUDA_IMAGES_DIR"
  say "built $CUDA_IMAGE -> $CUDA_IMAGES_DIR"
}

if ! grep -qxF "$cuda_image_stamp" "$CUDA_IMAGES_DIR/.stamp" 2>/dev/null; then
  build_cuda_image
fi

# --- node.env ---------------------------------------------------------------------------------------
env_file=$CACHE/node.env
env_text="NODE_ROOT=$NODE_ROOT
NODE_PATH=$NODE_ROOT/usr/bin:$NODE_ROOT/usr/sbin
CONTAINERD_BIN=$NODE_ROOT/usr/bin/containerd
CTR_BIN=$NODE_ROOT/usr/bin/ctr
RUNC_BIN=$NODE_ROOT/usr/sbin/runc
CNI_BIN_DIR=$NODE_ROOT/usr/lib/cni
NODE_VERSIONS=$(sed -n 's/.* versions=//p' "$NODE_DIR/.stamp")
BUSYBOX_IMAGE=$BUSYBOX_IMAGE
BUSYBOX_IMAGE_TAR=$IMAGES_DIR/busybox.tar
PAUSE_IMAGE=$PAUSE_IMAGE
PAUSE_IMAGE_TAR=$IMAGES_DIR/pause.tar
CUDA_IMAGE=$CUDA_IMAGE
CUDA_IMAGE_TAR=$CUDA_IMAGES_DIR/cudaprobe.tar"
if [ "$(cat "$env_file" 2>/dev/null)" != "$env_text" ]; then
  echo "$env_text" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
  say "wrote $env_file"
fi
if [ "$print_env" = 1 ]; then
  echo "$env_text"
fi

#!/usr/bin/env bash
# Builds vgpud's image, one for the DaemonSet (`vgpud run`) and the webhook (`vgpud webhook`), as an OCI
# image layout tarball for `ctr -n k8s.io images import` (no Docker, no registry). Three layers:
#   runtime  Debian bookworm's Python 3.11 and the shared libraries it and the wheels load, unpacked
#            from .debs (dpkg-deb -x) into ${VGPUD_CACHE:-~/.cache/vgpud}/python3.11-bookworm, stripped
#            and byte-compiled there once;
#   deps     vgpud's runtime dependencies at the versions installed in .venv (hack/image-requirements.py),
#            wheels only, installed with pip --target into build/image/deps;
#   vgpud    the vgpud package (pip --target from a copy of the source), the C parts from `make build`
#            in /usr/lib/vgpud, and the /usr/bin/vgpud launcher (the entrypoint).
# The tag is vgpud's version plus a hash of every input, so a changed input gives a new tag; the same
# inputs give the same image digest. Idempotent: with nothing changed it prints nothing and does nothing.
#
#   hack/build-image.sh              build what is missing, then write build/image/image.env
#   hack/build-image.sh --print-env  also print image.env (VGPUD_IMAGE=..., VGPUD_IMAGE_TAR=...)
#
# Needs `make build` first (the venv and build/libvgpu). Cold: ~13 MB of .debs and the wheels (pip's
# cache is .cache/pip).
set -euo pipefail

SUITE=bookworm
PY=python3.11
# the interpreter, its stdlib, and what its kept extension modules and the wheels' .so files link
RUNTIME_PACKAGES=(libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libbz2-1.0 liblzma5 libuuid1 libssl3
  "lib$PY-minimal" "lib$PY-stdlib" "$PY-minimal")
RUNTIME_RECIPE=2                    # bump when the runtime recipe (packages, stripping) changes
IMAGE_REPO=localhost/vgpud
IMAGE_LIB_DIR=/usr/lib/vgpud         # where the image holds the C parts vgpud installs on the node
SITE=usr/lib/python3/dist-packages   # on Debian's sys.path
CACHE=${VGPUD_CACHE:-$HOME/.cache/vgpud}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
OUT=$REPO/build/image
VENV_PY=$REPO/.venv/bin/python

print_env=0
for arg in "$@"; do
  case $arg in
    --print-env) print_env=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

say() { echo "build-image: $*" >&2; }
APT_OWNER=image
# shellcheck source=hack/lib/debian.sh
source "$HERE/lib/debian.sh"

for need in "$VENV_PY" "$REPO/build/libvgpu/libvgpu-control.so" "$REPO/build/libvgpu/vgpu-register"; do
  [ -e "$need" ] || { say "no $need: run make build first"; exit 1; }
done

# The runtime's own interpreter, run from its tree (not installed): it byte-compiles the image's
# modules, so the .pyc files are what the image's Python would write. PYTHONHASHSEED fixes the order
# of set constants; -S keeps the host's site-packages out.
runtime_python() {
  local root=$1; shift
  PYTHONHOME=$root/usr PYTHONHASHSEED=0 "$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
    --library-path "$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" "$root/usr/bin/$PY" -s -S "$@"
}

# compile_tree RUNTIME_ROOT TREE DIR...: .pyc files for TREE/DIR, naming sources by their image path;
# unchecked hashes: the image is read-only, so no stat of each source at import.
compile_tree() {
  local runtime=$1 tree=$2; shift 2
  local -a dirs=()
  for d in "$@"; do dirs+=("$tree/$d"); done
  runtime_python "$runtime" -m compileall -q -q -j 0 --invalidation-mode unchecked-hash \
    -s "$tree" -p / "${dirs[@]}"
}

mkdir -p "$CACHE" "$OUT"

# --- runtime: Debian's Python (machine-wide cache) ---------------------------------------------------
RUNTIME_DIR=$CACHE/$PY-$SUITE
RUNTIME_ROOT=$RUNTIME_DIR/root
runtime_stamp="suite=$SUITE recipe=$RUNTIME_RECIPE packages=${RUNTIME_PACKAGES[*]}"

strip_runtime() {
  local root=$1 lib=$1/usr/lib/$PY
  # docs, man pages, locales, gdb helpers; libc's iconv modules and tools; the apport hook (sitecustomize)
  rm -rf "$root"/usr/share "$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/etc/ld.so.conf.d "$root"/etc/$PY \
    "$lib/sitecustomize.py"
  find "$root"/usr/bin -mindepth 1 ! -name "$PY" -delete
  # libc's libraries for debuggers and LD_PRELOAD tools, never linked by a program
  rm -f "$root"/lib/x86_64-linux-gnu/{libthread_db,libmemusage,libpcprofile,libc_malloc_debug}.so*
  find "$root" -name '*.a' -delete
  # stdlib parts nothing here runs: tests, pydoc's topics, venv (no ensurepip, no pip)
  rm -rf "$lib"/test "$lib"/pydoc_data "$lib"/venv "$lib"/ensurepip "$lib"/idlelib "$lib"/tkinter "$lib"/lib2to3
  # extension modules for test, terminals and databases: their libraries (ncurses, readline, sqlite,
  # Berkeley DB, NIS, libcrypt) are not in the image
  local mod
  for mod in _test _ctypes_test _xx xxlimited _curses _dbm _gdbm _sqlite3 nis readline _crypt ossaudiodev; do
    rm -f "$lib"/lib-dynload/"$mod"*.so
  done
  ln -s "$PY" "$root/usr/bin/python3"
}

# check_libraries TREE...: every NEEDED of every ELF file in the merged trees is in one of them.
check_libraries() {
  local tree f lib missing=""
  declare -A have=()
  for tree in "$@"; do
    while read -r f; do have[${f##*/}]=1; done < <(find "$tree" \( -type f -o -type l \) -name '*.so*')
  done
  for tree in "$@"; do
    while read -r f; do
      head -c4 "$f" | grep -q $'^\x7fELF' || continue
      while read -r lib; do
        [ -n "${have[$lib]:-}" ] || missing+=" ${f#"$tree"/}:$lib"
      done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    done < <(find "$tree" -type f \( -name '*.so*' -o -path '*/bin/*' \))
  done
  if [ -n "$missing" ]; then
    say "shared libraries missing from the image:$missing"
    return 1
  fi
}

install_runtime() {
  local tmp pkg deb versions=""
  say "downloading ${RUNTIME_PACKAGES[*]} from Debian $SUITE ($(debian_mirror))"
  tmp=$(mktemp -d "$CACHE/.pyruntime.XXXXXX") && chmod 755 "$tmp"
  for pkg in "${RUNTIME_PACKAGES[@]}"; do
    (cd "$tmp" && apt_download "$SUITE" "$pkg")
    deb=$(ls "$tmp/${pkg}"_*.deb)
    versions+=" $pkg=$(dpkg-deb -f "$deb" Version)"
    dpkg-deb -x "$deb" "$tmp/root"
    rm -f "$deb"
  done
  strip_runtime "$tmp/root"
  check_libraries "$tmp/root"
  compile_tree "$tmp/root" "$tmp/root" "usr/lib/$PY"
  echo "$runtime_stamp versions=${versions# }" >"$tmp/.stamp"
  rm -rf "$RUNTIME_DIR" && mv "$tmp" "$RUNTIME_DIR"
  apt_forget_lists
  say "installed Python from${versions} -> $RUNTIME_ROOT ($(du -sh "$RUNTIME_ROOT" | cut -f1))"
}

(
  flock 9
  rm -rf "$CACHE"/.pyruntime.*  # an interrupted run's (we hold the lock)
  if ! grep -q "^$runtime_stamp versions=" "$RUNTIME_DIR/.stamp" 2>/dev/null; then
    install_runtime
  fi
) 9>"$CACHE/.build-image-runtime.lock"

exec 9>"$OUT/.lock"
flock 9
rm -rf "$OUT"/.deps.* "$OUT"/.vgpud.*

# --- deps: the pinned runtime closure, wheels only ---------------------------------------------------
requirements=$("$VENV_PY" "$HERE/image-requirements.py")
DEPS_DIR=$OUT/deps
deps_stamp="runtime=$(cat "$RUNTIME_DIR/.stamp") script=$(sha256sum <"$0" | cut -c1-16) requirements=$(echo "$requirements" | sha256sum | cut -c1-16)"

# prune_records SITE: each RECORD lists only what is left in SITE (the scripts and removed parts go).
prune_records() {
  "$VENV_PY" - "$1" <<'EOF'
import csv, io, sys
from pathlib import Path
site = Path(sys.argv[1])
for record in sorted(site.glob("*.dist-info/RECORD")):
    rows = [row for row in csv.reader(io.StringIO(record.read_text())) if row and (site / row[0]).resolve().is_relative_to(site.resolve()) and (site / row[0]).exists()]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    record.write_text(out.getvalue())
EOF
}

# pip_target DIR ARGS...: pip install into DIR for the image's interpreter (CPython 3.11, bookworm's glibc)
pip_target() {
  local dir=$1; shift
  PIP_CACHE_DIR=$REPO/.cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV_PY" -m pip install -q --no-compile \
    --no-warn-script-location --target "$dir" "$@"
  rm -rf "$dir/bin" "$dir"/*.dist-info/direct_url.json
}

install_deps() {
  local tmp
  say "installing $(echo "$requirements" | wc -l) pinned runtime dependencies (wheels) -> $DEPS_DIR"
  tmp=$(mktemp -d "$OUT/.deps.XXXXXX") && chmod 755 "$tmp"
  echo "$requirements" >"$tmp/requirements.txt"
  # bookworm's glibc is 2.36: any manylinux wheel up to that (pip does not expand a --platform itself)
  local -a platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  local glibc
  for glibc in $(seq 5 36); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
  pip_target "$tmp/root/$SITE" --no-deps --only-binary=:all: "${platforms[@]}" \
    --python-version 3.11 --implementation cp --abi cp311 -r "$tmp/requirements.txt"
  # every package's own tests
  find "$tmp/root/$SITE" -depth -type d \( -name tests -o -name _tests \) -exec rm -rf {} +
  find "$tmp/root/$SITE" -name '*_test.py' -delete
  prune_records "$tmp/root/$SITE"
  check_libraries "$RUNTIME_ROOT" "$tmp/root"
  compile_tree "$RUNTIME_ROOT" "$tmp/root" "$SITE"
  echo "$deps_stamp" >"$tmp/.stamp"
  rm -rf "$DEPS_DIR" && mv "$tmp" "$DEPS_DIR"
}

if ! grep -qxF "$deps_stamp" "$DEPS_DIR/.stamp" 2>/dev/null; then
  install_deps
fi

# --- vgpud: the package, the C parts, the launcher; the tag from every input ------------------------
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$REPO/pyproject.toml")
sources=$(cd "$REPO" && find pyproject.toml README.md vgpud -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
  ! -path '*.egg-info/*' | LC_ALL=C sort)
input_hash=$( (
  echo "$deps_stamp"
  sha256sum "$HERE/ociimage.py" "$REPO/build/libvgpu/libvgpu-control.so" "$REPO/build/libvgpu/vgpu-register" | cut -d' ' -f1
  cd "$REPO" && sha256sum $sources
) | sha256sum | cut -c1-12)
IMAGE=$IMAGE_REPO:$version-$input_hash
TAR=$OUT/vgpud-$version-$input_hash.tar

build_image() {
  local tmp app start=$SECONDS
  tmp=$(mktemp -d "$OUT/.vgpud.XXXXXX") && chmod 755 "$tmp"
  app=$tmp/root
  # a copy of the source: pip builds in the tree it is given, and nothing stale rides along
  (cd "$REPO" && cp --parents $sources "$tmp/")
  mkdir -p "$tmp/src" && mv "$tmp/pyproject.toml" "$tmp/README.md" "$tmp/vgpud" "$tmp/src/"
  pip_target "$app/$SITE" --no-deps --no-build-isolation "$tmp/src"
  prune_records "$app/$SITE"
  compile_tree "$RUNTIME_ROOT" "$app" "$SITE"
  install -D -m 0755 "$REPO/build/libvgpu/libvgpu-control.so" "$app$IMAGE_LIB_DIR/libvgpu-control.so"
  install -D -m 0755 "$REPO/build/libvgpu/vgpu-register" "$app$IMAGE_LIB_DIR/vgpu-register"
  mkdir -p "$app/usr/bin"
  cat >"$app/usr/bin/vgpud" <<LAUNCHER
#!/usr/bin/$PY
"""The image's entrypoint: vgpud's command line, as \`python3 -m vgpud\` runs it."""
from vgpud.cli import main

raise SystemExit(main())
LAUNCHER
  chmod 0755 "$app/usr/bin/vgpud"
  python3 "$HERE/ociimage.py" --name "$IMAGE" --out "$tmp/image.tar" --layer-cache "$OUT/layers" \
    --layer "runtime: Debian $SUITE $PY" --tree "$RUNTIME_ROOT" --dir /tmp:1777 \
    --layer "deps: vgpud's runtime dependencies" --tree "$DEPS_DIR/root" \
    --layer "vgpud $version" --tree "$app" \
    --env "LIBRARY_SOURCE=$IMAGE_LIB_DIR/libvgpu-control.so" \
    --env "REGISTER_CLIENT_SOURCE=$IMAGE_LIB_DIR/vgpu-register" \
    --entrypoint /usr/bin/vgpud
  rm -f "$OUT"/vgpud-*.tar
  mv "$tmp/image.tar" "$TAR"
  rm -rf "$tmp"
  say "built $IMAGE -> $TAR ($(du -h "$TAR" | cut -f1), $((SECONDS - start)) s)"
}

if [ ! -f "$TAR" ]; then
  build_image
fi

env_file=$OUT/image.env
env_text="VGPUD_IMAGE=$IMAGE
VGPUD_IMAGE_TAR=$TAR"
if [ "$(cat "$env_file" 2>/dev/null)" != "$env_text" ]; then
  echo "$env_text" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
fi
if [ "$print_env" = 1 ]; then
  echo "$env_text"
fi

"""Build an OCI image layout tarball by hand, for `ctr -n k8s.io images import` (no registry).

    python3 hack/ociimage.py --name localhost/vgpud-busybox:v1 --out busybox.tar \\
        --file /bin/busybox:/bin/busybox:0755 --link /bin/sh:busybox --dir /tmp:1777 \\
        --entrypoint /bin/sh

    python3 hack/ociimage.py --name localhost/app:v1 --out app.tar --layer-cache cache/ \\
        --layer runtime --tree rootfs/ --layer app --tree app/ --env LANG=C.UTF-8 --entrypoint /app

Each `--layer NAME` starts a new layer; the --file/--link/--dir/--tree options after it fill that layer
(without any --layer there is one layer). A --tree adds a host directory as the image's root: its
directories, symlinks and files, with modes normalised (0755 for directories and files executable by
their owner, 0644 for other files), so the host's umask does not change the image.

The output is reproducible (sorted entries, mtime 0, owner root, gzip without a timestamp): the same
inputs give the same image digest. With --layer-cache, a layer whose content is unchanged since the
last image built with that cache is not compressed again (the cache keeps that image's layers only).
Stdlib only, so it runs before the project's venv exists.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EPOCH = "1970-01-01T00:00:00Z"
CREATED_BY = "hack/ociimage.py"


@dataclass
class Layer:
    """What one layer holds: image path -> (kind, mode, data or link target)."""

    name: str = ""
    files: list[tuple[str, bytes, int]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)
    dirs: list[tuple[str, int]] = field(default_factory=list)

    def add_tree(self, host_root: Path) -> None:
        """Every directory, symlink and regular file under `host_root`, at the same path under /."""
        if not host_root.is_dir():
            raise SystemExit(f"ociimage: --tree {host_root}: not a directory")
        for top, dirnames, filenames in os.walk(host_root):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                host = Path(top) / name
                image = "/" + host.relative_to(host_root).as_posix()
                st = host.lstat()
                if stat.S_ISLNK(st.st_mode):
                    self.links.append((image, os.readlink(host)))
                elif stat.S_ISDIR(st.st_mode):
                    self.dirs.append((image, 0o755))
                elif stat.S_ISREG(st.st_mode):
                    mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                    self.files.append((image, host.read_bytes(), mode))
                else:
                    raise SystemExit(f"ociimage: --tree: {host} is neither a file, a directory nor a symlink")


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


def layer_tar(
    files: list[tuple[str, bytes, int]], links: list[tuple[str, str]], dirs: list[tuple[str, int]]
) -> bytes:
    """The uncompressed layer: every parent directory (0755 unless given), files, symlinks."""
    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}

    def add_parents(path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            entries.setdefault(parent, (_info(parent, tarfile.DIRTYPE, 0o755), None))

    for path, mode in dirs:
        add_parents(path)
        entries[path.strip("/")] = (_info(path, tarfile.DIRTYPE, mode), None)
    for path, data, mode in files:
        add_parents(path)
        entries[path.strip("/")] = (_info(path, tarfile.REGTYPE, mode, len(data)), data)
    for path, target in links:
        add_parents(path)
        entries[path.strip("/")] = (_info(path, tarfile.SYMTYPE, 0o777, link=target), None)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            info, data = entries[name]
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def compress(layer: bytes, cache: dict[str, bytes] | None = None) -> bytes:
    """The gzipped layer; `cache` maps a layer's diff_id to its compressed form (read and filled)."""
    diff_id = hashlib.sha256(layer).hexdigest()
    if cache is not None and diff_id in cache:
        return cache[diff_id]
    compressed = gzip.compress(layer, mtime=0)
    if cache is not None:
        cache[diff_id] = compressed
    return compressed


def image_layout(
    name: str,
    layers: Sequence[tuple[str, bytes]],
    entrypoint: list[str],
    cmd: list[str],
    *,
    env: Sequence[str] = (),
    cache: dict[str, bytes] | None = None,
) -> bytes:
    """The OCI image layout (oci-layout, index.json, blobs) as one tarball; layers are (name, tar)."""
    blobs: dict[str, bytes] = {}
    layer_descs = [{"mediaType": MEDIA_LAYER, **_blob(blobs, compress(tar, cache))} for _, tar in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": EPOCH,
        "config": {
            "Env": [f"PATH={DEFAULT_PATH}", *env],
            "Entrypoint": entrypoint or None,
            "Cmd": cmd or None,
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest() for _, tar in layers],
        },
        "history": [
            {"created": EPOCH, "created_by": f"{CREATED_BY} {label}" if label else CREATED_BY}
            for label, _ in layers
        ],
    }
    config_desc = {"mediaType": MEDIA_CONFIG, **_blob(blobs, json.dumps(config, sort_keys=True).encode())}
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": layer_descs,
    }
    manifest_desc = {
        "mediaType": MEDIA_MANIFEST,
        **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
    }
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }
    files = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
    ]
    files += [(f"blobs/sha256/{digest.split(':', 1)[1]}", data) for digest, data in sorted(blobs.items())]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirname in ("blobs", "blobs/sha256"):
            tar.addfile(_info(dirname, tarfile.DIRTYPE, 0o755))
        for path, data in files:
            tar.addfile(_info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return out.getvalue()


class _InOrder(argparse.Action):
    """Keeps layer-filling options in command-line order (a --layer splits them)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        namespace.items.append((self.dest, values))


def _mode(spec: list[str], default: int) -> int:
    return int(spec[0], 8) if spec else default


def build_layers(items: list[tuple[str, str]]) -> list[Layer]:
    """The layers the ordered options describe; an empty leading layer (before a --layer) is dropped."""
    layers = [Layer()]
    for kind, spec in items:
        layer = layers[-1]
        if kind == "layer":
            layers.append(Layer(name=spec))
        elif kind == "file":
            host, image, *mode = spec.split(":")
            layer.files.append((image, Path(host).read_bytes(), _mode(mode, 0o755)))
        elif kind == "link":
            image, target = spec.split(":", 1)
            layer.links.append((image, target))
        elif kind == "dir":
            image, *mode = spec.split(":")
            layer.dirs.append((image, _mode(mode, 0o755)))
        elif kind == "tree":
            layer.add_tree(Path(spec))
    first = layers[0]
    if len(layers) > 1 and not (first.files or first.links or first.dirs):
        layers.pop(0)
    return layers


def _read_cache(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    return {path.name.removesuffix(".gz"): path.read_bytes() for path in directory.glob("*.gz")}


def _write_cache(directory: Path, cache: dict[str, bytes], keep: set[str]) -> None:
    for diff_id in keep:
        path = directory / f"{diff_id}.gz"
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(cache[diff_id])
            tmp.replace(path)
    for path in directory.glob("*.gz"):
        if path.name.removesuffix(".gz") not in keep:
            path.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.set_defaults(items=[])
    parser.add_argument("--name", required=True, help="image reference, e.g. localhost/vgpud-pause:v1")
    parser.add_argument("--out", required=True, type=Path, help="the OCI layout tarball to write")
    parser.add_argument("--layer", action=_InOrder, help="NAME: start a new layer (named in the history)")
    parser.add_argument("--file", action=_InOrder, help="HOSTPATH:IMAGEPATH[:OCTALMODE]")
    parser.add_argument("--link", action=_InOrder, help="IMAGEPATH:TARGET (a symlink)")
    parser.add_argument("--dir", action=_InOrder, help="IMAGEPATH[:OCTALMODE]")
    parser.add_argument("--tree", action=_InOrder, help="HOSTDIR: its content, at / of the image")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE in the config (repeat)")
    parser.add_argument("--entrypoint", action="append", default=[], help="one argv word (repeat)")
    parser.add_argument("--cmd", action="append", default=[], help="one argv word (repeat)")
    parser.add_argument("--layer-cache", type=Path, help="directory of compressed layers to reuse")
    args = parser.parse_args(argv)
    for spec in args.env:
        if "=" not in spec or spec.startswith(("=", "PATH=")):
            parser.error(f"--env {spec!r}: want KEY=VALUE (PATH is set by the image)")
    layers = [
        (layer.name, layer_tar(layer.files, layer.links, layer.dirs)) for layer in build_layers(args.items)
    ]
    cache = _read_cache(args.layer_cache) if args.layer_cache else None
    data = image_layout(args.name, layers, args.entrypoint, args.cmd, env=args.env, cache=cache)
    if args.layer_cache and cache is not None:
        _write_cache(args.layer_cache, cache, {hashlib.sha256(tar).hexdigest() for _, tar in layers})
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Build a single-layer OCI image layout tarball by hand, for `ctr -n k8s.io images import` (no registry).

    python3 hack/ociimage.py --name localhost/vgpud-busybox:v1 --out busybox.tar \\
        --file /bin/busybox:/bin/busybox:0755 --link /bin/sh:busybox --dir /tmp:1777 \\
        --entrypoint /bin/sh

The output is reproducible (sorted entries, mtime 0, owner root, gzip without a timestamp): the same
inputs give the same image digest. Stdlib only, so it runs before the project's venv exists.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def image_layout(name: str, layer: bytes, entrypoint: list[str], cmd: list[str]) -> bytes:
    """The OCI image layout (oci-layout, index.json, blobs) as one tarball."""
    blobs: dict[str, bytes] = {}
    compressed = gzip.compress(layer, mtime=0)
    layer_desc = {"mediaType": MEDIA_LAYER, **_blob(blobs, compressed)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": [f"PATH={DEFAULT_PATH}"], "Entrypoint": entrypoint or None, "Cmd": cmd or None},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/ociimage.py"}],
    }
    config_desc = {"mediaType": MEDIA_CONFIG, **_blob(blobs, json.dumps(config, sort_keys=True).encode())}
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": [layer_desc],
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True, help="image reference, e.g. localhost/vgpud-pause:v1")
    parser.add_argument("--out", required=True, type=Path, help="the OCI layout tarball to write")
    parser.add_argument("--file", action="append", default=[], help="HOSTPATH:IMAGEPATH[:OCTALMODE]")
    parser.add_argument("--link", action="append", default=[], help="IMAGEPATH:TARGET (a symlink)")
    parser.add_argument("--dir", action="append", default=[], help="IMAGEPATH[:OCTALMODE]")
    parser.add_argument("--entrypoint", action="append", default=[], help="one argv word (repeat)")
    parser.add_argument("--cmd", action="append", default=[], help="one argv word (repeat)")
    args = parser.parse_args(argv)
    files = []
    for spec in args.file:
        host, image, *mode = spec.split(":")
        files.append((image, Path(host).read_bytes(), int(mode[0], 8) if mode else 0o755))
    links = [tuple(spec.split(":", 1)) for spec in args.link]
    dirs = []
    for spec in args.dir:
        path, *mode = spec.split(":")
        dirs.append((path, int(mode[0], 8) if mode else 0o755))
    data = image_layout(args.name, layer_tar(files, links, dirs), args.entrypoint, args.cmd)  # type: ignore[arg-type]
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

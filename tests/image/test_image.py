"""The vgpud image (`make image`, hack/build-image.sh): unpacked from its tarball and run under chroot,
so nothing of the host's Python can help it: the entrypoint starts vgpud, the runtime imports what the
daemon and the webhook import, every shared object in it loads, and the C parts are where its Env says.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import vgpud
from tests.support import BUILD, require

IMAGE_ENV = BUILD / "image" / "image.env"
RUN_TIMEOUT_S = 60


@dataclass(frozen=True)
class Image:
    name: str
    root: Path
    config: dict[str, Any]

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config["config"]["Env"])

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`argv` inside the image: chrooted, with the image's Env and nothing of the host's."""
        return subprocess.run(
            ["chroot", str(self.root), *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )


def _blob(layout: tarfile.TarFile, digest: str) -> bytes:
    """A blob of the layout, checked against its digest."""
    algorithm, hexdigest = digest.split(":", 1)
    member = layout.extractfile(f"blobs/{algorithm}/{hexdigest}")
    assert member is not None, digest
    data = member.read()
    assert hashlib.sha256(data).hexdigest() == hexdigest, f"blob {digest} does not match its digest"
    return data


def unpack(tar: Path, name: str, dest: Path) -> dict[str, Any]:
    """Apply the image's layers in order under `dest`; returns the image config."""
    with tarfile.open(tar) as layout:
        index = json.loads(layout.extractfile("index.json").read())  # type: ignore[union-attr]
        [manifest_desc] = index["manifests"]
        assert manifest_desc["annotations"]["io.containerd.image.name"] == name
        manifest = json.loads(_blob(layout, manifest_desc["digest"]))
        config = json.loads(_blob(layout, manifest["config"]["digest"]))
        diff_ids = []
        for layer_desc in manifest["layers"]:
            layer_tar = gzip.decompress(_blob(layout, layer_desc["digest"]))
            diff_ids.append("sha256:" + hashlib.sha256(layer_tar).hexdigest())
            with tarfile.open(fileobj=io.BytesIO(layer_tar)) as layer:
                members = layer.getmembers()
                # the builder writes no whiteouts, and this unpacker does not apply them
                assert not [m.name for m in members if "/.wh." in f"/{m.name}"]
                layer.extractall(dest, members=members, filter="tar")
        assert config["rootfs"]["diff_ids"] == diff_ids
    return config


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    require(IMAGE_ENV.exists(), "build/image/image.env", "run `make image` (the test command does it)")
    require(os.geteuid() == 0, "root", "run the image tests as root (they chroot into the image)")
    require(shutil.which("chroot") is not None, "chroot", "apt-get install coreutils")
    env = dict(line.split("=", 1) for line in IMAGE_ENV.read_text().splitlines() if "=" in line)
    tar = Path(env["VGPUD_IMAGE_TAR"])
    assert tar.exists(), f"{IMAGE_ENV} names {tar}, which is missing: run `make image`"
    root = tmp_path_factory.mktemp("image") / "root"
    root.mkdir()
    return Image(env["VGPUD_IMAGE"], root, unpack(tar, env["VGPUD_IMAGE"], root))


def test_the_entrypoint_is_vgpud_at_the_tagged_version(image: Image) -> None:
    assert image.name.rsplit(":", 1)[1].startswith(f"{vgpud.__version__}-")
    done = image.run(*image.config["config"]["Entrypoint"], "--version")
    assert (done.returncode, done.stdout) == (0, f"vgpud {vgpud.__version__}\n"), done.stderr


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_the_daemon_and_the_webhook_start_their_command_lines(image: Image, command: str) -> None:
    done = image.run(*image.config["config"]["Entrypoint"], command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: vgpud {command} ")


def test_the_runtime_is_the_images_own_and_imports_what_vgpud_needs(image: Image) -> None:
    def files() -> set[Path]:
        return {Path(top) / name for top, _, names in os.walk(image.root) for name in names}

    before = files()
    done = image.run(
        "/usr/bin/python3",
        "-c",
        "import sys, ssl, vgpud.cli, vgpud.daemon, vgpud.webhook, vgpud.kube.client, grpclib, urllib3,"
        " trio, trio_asyncio, pynvml, yaml, google.protobuf, hypercorn, prometheus_client;"
        " ssl.create_default_context(); print(sys.prefix, *sys.version_info[:2])",
    )
    assert (done.returncode, done.stdout) == (0, "/usr 3 11\n"), done.stderr
    # every module came with its byte code: nothing compiles (nor writes) at start
    assert files() == before


def test_every_shared_object_in_the_image_loads(image: Image) -> None:
    done = image.run(
        "/usr/bin/python3",
        "-c",
        "import ctypes, os, pathlib\n"
        "loaded, failed = 0, []\n"
        "for top in ('/lib', '/usr/lib'):\n"
        "    for path in sorted(pathlib.Path(top).rglob('*.so*')):\n"
        "        if path.is_file() and not path.is_symlink():\n"
        "            try:\n"
        "                ctypes.CDLL(str(path), os.RTLD_NOW)\n"
        "                loaded += 1\n"
        "            except OSError as exc:\n"
        "                failed.append(str(exc))\n"
        "if failed:\n"
        "    raise SystemExit('\\n'.join(failed))\n"
        "print(loaded)\n",
    )
    assert done.returncode == 0, done.stderr
    # the interpreter's extension modules, the wheels' and the libraries they link
    assert int(done.stdout) > 50


def test_the_c_parts_are_where_the_env_says_and_match_the_build(image: Image) -> None:
    for key, built in [
        ("LIBRARY_SOURCE", BUILD / "libvgpu" / "libvgpu-control.so"),
        ("REGISTER_CLIENT_SOURCE", BUILD / "libvgpu" / "vgpu-register"),
    ]:
        in_image = image.root / image.env[key].lstrip("/")
        assert in_image.read_bytes()[:4] == b"\x7fELF", key
        assert in_image.read_bytes() == built.read_bytes(), f"{key}: the image is older than {built}"

"""hack/ociimage.py, the hand-made OCI layouts the node imports: layers from host trees, normalised
modes, reproducible bytes, a layer cache that changes nothing but the time, and bad input refused."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import REPO


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ociimage", REPO / "hack" / "ociimage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


ociimage = _load()


def _tree(root: Path) -> Path:
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "tool").write_text("#!/bin/sh\n")
    (root / "usr" / "bin" / "tool").chmod(0o700)
    (root / "usr" / "data").write_text("private")
    (root / "usr" / "data").chmod(0o600)
    (root / "usr" / "bin" / "alias").symlink_to("tool")
    return root


def _read(out: Path) -> tuple[dict[str, Any], list[dict[str, tarfile.TarInfo]]]:
    """The image config and, per layer, its entries by name."""
    with tarfile.open(out) as layout:

        def blob(digest: str) -> bytes:
            member = layout.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            assert member is not None
            return member.read()

        index = json.loads(layout.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        layers = []
        for desc in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(desc["digest"])))) as layer:
                layers.append({m.name: m for m in layer.getmembers()})
    return config, layers


def _build(tmp_path: Path, out: str, *extra: str) -> Path:
    runtime = tmp_path / "runtime"
    app = tmp_path / "app"
    if not runtime.exists():
        _tree(runtime)
        (app / "opt").mkdir(parents=True)
        (app / "opt" / "app.py").write_text("print('hi')\n")
    path = tmp_path / out
    layers = ["--layer", "runtime", "--tree", str(runtime), "--dir", "/tmp:1777", "--layer", "app"]
    config = ["--tree", str(app), "--env", "A=b", "--entrypoint", "/x"]
    ociimage.main(["--name", "localhost/t:v1", "--out", str(path), *layers, *config, *extra])
    return path


def test_layers_hold_their_trees_with_normalised_modes_in_order(tmp_path: Path) -> None:
    config, (runtime, app) = _read(_build(tmp_path, "image.tar"))
    assert config["config"]["Env"][1:] == ["A=b"]
    assert config["config"]["Entrypoint"] == ["/x"]
    assert [h["created_by"] for h in config["history"]] == [
        "hack/ociimage.py runtime",
        "hack/ociimage.py app",
    ]
    assert len(config["rootfs"]["diff_ids"]) == 2
    assert runtime["usr/bin/tool"].mode == 0o755
    assert runtime["usr/data"].mode == 0o644
    assert runtime["usr/bin/alias"].issym() and runtime["usr/bin/alias"].linkname == "tool"
    assert runtime["tmp"].mode == 0o1777
    assert set(app) == {"opt", "opt/app.py"}
    assert {(m.mtime, m.uid, m.gid) for layer in (runtime, app) for m in layer.values()} == {(0, 0, 0)}


def test_the_same_inputs_give_the_same_bytes_with_or_without_the_layer_cache(tmp_path: Path) -> None:
    first = _build(tmp_path, "a.tar").read_bytes()
    os.utime(tmp_path / "runtime" / "usr" / "data", (1, 1))  # a new mtime is not a new input
    cache = tmp_path / "cache"
    assert _build(tmp_path, "b.tar", "--layer-cache", str(cache)).read_bytes() == first
    assert _build(tmp_path, "c.tar", "--layer-cache", str(cache)).read_bytes() == first
    config, _ = _read(tmp_path / "c.tar")
    assert {p.name for p in cache.iterdir()} == {
        d.split(":")[1] + ".gz" for d in config["rootfs"]["diff_ids"]
    }


def test_a_changed_layer_replaces_its_cache_entry_only(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _build(tmp_path, "a.tar", "--layer-cache", str(cache))
    (tmp_path / "app" / "opt" / "app.py").write_text("print('changed')\n")
    config, _ = _read(_build(tmp_path, "b.tar", "--layer-cache", str(cache)))
    assert {p.name for p in cache.iterdir()} == {
        d.split(":")[1] + ".gz" for d in config["rootfs"]["diff_ids"]
    }


@pytest.mark.parametrize("env", ["PATH=/bin", "NOEQUALS", "=x"])
def test_a_bad_env_is_refused(tmp_path: Path, env: str) -> None:
    with pytest.raises(SystemExit):
        _build(tmp_path, "image.tar", "--env", env)
    assert not (tmp_path / "image.tar").exists()


def test_a_tree_with_something_else_than_files_dirs_and_links_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path / "runtime")
    os.mkfifo(tmp_path / "runtime" / "fifo")
    with pytest.raises(SystemExit, match="neither a file"):
        _build(tmp_path, "image.tar")

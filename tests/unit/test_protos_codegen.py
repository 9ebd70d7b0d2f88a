"""The generated code in vgpud/_pb is current and importable without shadowing real packages."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import vgpud._pb
from tests.support import REPO


def test_regenerating_gives_no_diff() -> None:
    """Committed code must be exactly what protos/ generates, or the wire contract drifts silently."""
    result = subprocess.run(
        [str(REPO / "hack" / "gen-protos.sh"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"


def test_every_generated_module_imports() -> None:
    """A module that fails to import would only show up when its component starts."""
    names = [m.name for m in pkgutil.walk_packages(vgpud._pb.__path__, "vgpud._pb.")]
    assert "vgpud._pb.grpc.health.v1" in names
    for name in names:
        importlib.import_module(name)


def test_generated_grpc_package_does_not_shadow_grpcio() -> None:
    """The generated `grpc.health.v1` lives under vgpud._pb, so top-level `grpc` stays grpcio."""
    code = "import vgpud._pb.grpc.health.v1, grpc, grpc.aio; print(grpc.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    grpc_file = Path(result.stdout.strip())
    assert vgpud._pb.__path__[0] not in str(grpc_file)
    assert grpc_file.parent.name == "grpc"

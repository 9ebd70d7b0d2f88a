"""The manager root vgpud prepares on the host before any claim: what the CDI mounts point at."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, require, unreachable_kubeconfig
from vgpud.artifacts import DEFAULT_LIBRARY_SOURCE, DEFAULT_REGISTER_CLIENT_SOURCE
from vgpud.config import add_settings_arguments, settings_from
from vgpud.nodesetup import NodeSetupError, prepare_manager_root
from vgpud.partition.layout import Layout

BUILD_LIBVGPU = REPO / "build" / "libvgpu"


def _shared_object(directory: Path, name: str = "lib.so") -> Path:
    """A real (tiny) ELF shared object, built here with gcc -shared."""
    gcc = shutil.which("gcc")
    require(gcc is not None, "gcc", "apt-get install gcc")
    assert gcc is not None
    source = directory / "tiny.c"
    source.write_text("int vgpud_test_marker(void) { return 42; }\n")
    out = directory / name
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(out), str(source)], check=True, timeout=60)
    return out


def _executable(directory: Path) -> Path:
    gcc = shutil.which("gcc")
    require(gcc is not None, "gcc", "apt-get install gcc")
    assert gcc is not None
    source = directory / "client.c"
    source.write_text("int main(void) { return 0; }\n")
    out = directory / "client"
    subprocess.run([gcc, "-o", str(out), str(source)], check=True, timeout=60)
    return out


def test_installs_the_library_and_the_client_under_both_names(tmp_path: Path) -> None:
    library, client = _shared_object(tmp_path), _executable(tmp_path)
    layout = Layout(tmp_path / "root")
    prepare_manager_root(layout, "1.2.3", library, client)
    root = tmp_path / "root"
    assert (root / "claims").is_dir()
    assert (root / "registry").stat().st_mode & 0o777 == 0o711
    assert (root / "ld.so.preload").read_text() == "/etc/vgpu-manager/driver/libvgpu-control.so\n"
    assert (root / "libvgpu-control.so.1.2.3").read_bytes() == library.read_bytes()
    for name in ("vgpu-register", "device-client"):
        installed = root / "registry" / name
        assert installed.read_bytes() == client.read_bytes(), name
        assert os.access(installed, os.X_OK)
        assert subprocess.run([str(installed)], check=False, timeout=30).returncode == 0
    inode = (root / "registry" / "device-client").stat().st_ino
    prepare_manager_root(layout, "1.2.3", library, client)  # again: nothing to replace
    assert (root / "registry" / "device-client").stat().st_ino == inode


def test_the_defaults_are_the_builds_output() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    settings = settings_from(parser.parse_args([]), environ={})
    assert settings.library_source == DEFAULT_LIBRARY_SOURCE == BUILD_LIBVGPU / "libvgpu-control.so"
    assert (
        settings.register_client_source == DEFAULT_REGISTER_CLIENT_SOURCE == BUILD_LIBVGPU / "vgpu-register"
    )


def test_a_missing_library_refuses_with_one_line_and_changes_nothing(tmp_path: Path) -> None:
    client = _executable(tmp_path)
    with pytest.raises(NodeSetupError) as caught:
        prepare_manager_root(Layout(tmp_path / "root"), "1.0", tmp_path / "missing.so", client)
    assert str(caught.value) == (
        f"no control library at {tmp_path}/missing.so: build it with `make build` or name it with "
        "--library-source / LIBRARY_SOURCE"
    )
    assert not (tmp_path / "root").exists()


def test_a_file_that_is_no_elf_is_refused(tmp_path: Path) -> None:
    library = _shared_object(tmp_path)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(NodeSetupError, match=r"the control library .*/empty \(--library-source"):
        prepare_manager_root(Layout(tmp_path / "root"), "1.0", empty, library)
    with pytest.raises(NodeSetupError, match=r"no register client at .*/nothing: build it"):
        prepare_manager_root(Layout(tmp_path / "root"), "1.0", library, tmp_path / "nothing")
    assert not (tmp_path / "root").exists()


def test_a_symlink_where_a_file_goes_is_refused(tmp_path: Path) -> None:
    library, client = _shared_object(tmp_path), _executable(tmp_path)
    target = tmp_path / "precious"
    target.write_text("keep")
    (tmp_path / "ld.so.preload").symlink_to(target)
    with pytest.raises(OSError, match="symbolic link"):
        prepare_manager_root(Layout(tmp_path), "1.0", library, client)
    assert target.read_text() == "keep"


def test_vgpud_run_without_its_library_exits_1_with_one_line(short_tmp: Path) -> None:
    """The daemon as started: no library file -> one error line naming the setting, exit 1."""
    kubeconfig = unreachable_kubeconfig(short_tmp / "kubeconfig")
    env = {
        **os.environ,
        "VGPUD_ROOT_PREFIX": str(short_tmp / "host"),
        "GPU_BACKEND": "mock",
        "GPU_PROFILE": "a100-40gb-x2",
        "KUBECONFIG": str(kubeconfig),
        "LIBRARY_SOURCE": str(short_tmp / "no-such-libvgpu-control.so"),
        "METRICS_ADDRESS": "off",
    }
    done = subprocess.run(
        [sys.executable, "-m", "vgpud", "run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "error" in line.lower()]
    assert len(errors) == 1, done.stderr
    assert f"no control library at {short_tmp}/no-such-libvgpu-control.so" in errors[0]
    assert not (short_tmp / "host" / "etc" / "vgpu-manager" / "ld.so.preload").exists()

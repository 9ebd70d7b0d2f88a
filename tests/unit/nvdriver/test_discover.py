"""What vgpud finds under a driver root: the toolkit's rules, on roots laid out in a temp dir."""

from __future__ import annotations

import os
import socket
from pathlib import Path, PurePosixPath

import pytest

from tests.unit.nvdriver.roots import LIB_DIR, VERSION, driver, gpu_nodes, link, node, place
from vgpud.nvdriver import discover as d
from vgpud.nvdriver.discover import DriverRootError, DriverRoots, discover


def found(files: tuple[d.DriverFile, ...]) -> list[str]:
    return [f.path for f in files]


def test_a_driver_root_gives_its_libraries_links_and_nodes(tmp_path: Path) -> None:
    driver(tmp_path)
    gpu_nodes(tmp_path)
    place(tmp_path, f"{LIB_DIR}/libnvidia-ptxjitcompiler.so.{VERSION}")
    place(tmp_path, f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.{VERSION}")
    place(tmp_path, f"{LIB_DIR}/libnvidia-nvvm70.so.4")
    place(tmp_path, f"{LIB_DIR}/libother.so.1.2.3")  # another version: not the driver's
    files = discover(DriverRoots.same(tmp_path), VERSION, [0, 1], None)
    lib = f"/{LIB_DIR}"
    assert files.library_dirs == (lib,)
    assert found(files.libraries) == [
        f"{lib}/libcuda.so.{VERSION}",
        f"{lib}/libnvidia-ml.so.{VERSION}",
        f"{lib}/libnvidia-ptxjitcompiler.so.{VERSION}",
        f"{lib}/vdpau/libvdpau_nvidia.so.{VERSION}",
        f"{lib}/libnvidia-nvvm70.so.4",
    ]
    assert files.libraries[0].host_path == f"{tmp_path}{lib}/libcuda.so.{VERSION}"
    # the toolkit's create-symlinks set: libcuda's development link, each soname link the root has
    assert files.links == (
        f"libcuda.so.1::{lib}/libcuda.so",
        f"libcuda.so.{VERSION}::{lib}/libcuda.so.1",
        f"libnvidia-ml.so.{VERSION}::{lib}/libnvidia-ml.so.1",
    )
    assert sorted(files.gpu_nodes) == [0, 1]
    gpu1 = files.gpu_nodes[1]
    assert (gpu1.path, gpu1.host_path, gpu1.major, gpu1.minor) == (
        "/dev/nvidia1",
        f"{tmp_path}/dev/nvidia1",
        195,
        1,
    )
    assert [n.path for n in files.control_nodes] == ["/dev/nvidiactl"]


def test_roots_seen_elsewhere_give_host_paths(tmp_path: Path) -> None:
    driver(tmp_path)
    gpu_nodes(tmp_path, (0,))
    roots = DriverRoots(tmp_path, PurePosixPath("/run/nvidia/driver"), tmp_path, PurePosixPath("/"))
    files = discover(roots, VERSION, [0], None)
    assert files.libraries[0].host_path == f"/run/nvidia/driver/{LIB_DIR}/libcuda.so.{VERSION}"
    assert files.libraries[0].path == f"/{LIB_DIR}/libcuda.so.{VERSION}"
    assert files.gpu_nodes[0].host_path == "/dev/nvidia0"


def test_absolute_links_resolve_inside_the_root(tmp_path: Path) -> None:
    place(tmp_path, f"opt/nvidia/libcuda.so.{VERSION}")
    place(tmp_path, f"opt/nvidia/libnvidia-ml.so.{VERSION}")
    # absolute targets, as a driver container lays them out: they mean the root's own /opt
    link(tmp_path, f"usr/lib64/libcuda.so.{VERSION}", f"/opt/nvidia/libcuda.so.{VERSION}")
    link(tmp_path, f"usr/lib64/libnvidia-ml.so.{VERSION}", f"/opt/nvidia/libnvidia-ml.so.{VERSION}")
    assert d.library_dirs(tmp_path, VERSION) == [PurePosixPath("/opt/nvidia")]
    assert d.resolve_in_root(tmp_path, PurePosixPath(f"/usr/lib64/libcuda.so.{VERSION}")) == PurePosixPath(
        f"/opt/nvidia/libcuda.so.{VERSION}"
    )
    link(tmp_path, "loop/a", "/loop/b")
    link(tmp_path, "loop/b", "/loop/a")
    assert d.resolve_in_root(tmp_path, PurePosixPath("/loop/a")) is None


def test_no_driver_of_that_version_is_an_error_naming_it(tmp_path: Path) -> None:
    driver(tmp_path, version="535.1.1")
    with pytest.raises(DriverRootError, match=f"no libcuda.so.{VERSION} or libnvidia-ml.so.{VERSION}"):
        d.library_dirs(tmp_path, VERSION)


def test_the_ld_cache_finds_a_driver_outside_the_standard_dirs(tmp_path: Path) -> None:
    from tests.unit.nvdriver.test_ldcache import X86_64, cache

    place(tmp_path, f"opt/nv/lib/libcuda.so.{VERSION}")
    place(tmp_path, f"opt/nv/lib/libnvidia-ml.so.{VERSION}")
    entries = [(X86_64, "libcuda.so.1", f"/opt/nv/lib/libcuda.so.{VERSION}")]
    entries.append((X86_64, "libnvidia-ml.so.1", f"/opt/nv/lib/libnvidia-ml.so.{VERSION}"))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(cache(entries))
    assert d.library_dirs(tmp_path, VERSION) == [PurePosixPath("/opt/nv/lib")]


def test_missing_gpu_nodes_are_named(tmp_path: Path) -> None:
    driver(tmp_path)
    gpu_nodes(tmp_path, (0,))
    link(tmp_path, "dev/nvidia1", "nvidia0")  # a link is no node: lstat, as the toolkit
    with pytest.raises(DriverRootError, match="/dev/nvidia1 under the dev root"):
        discover(DriverRoots.same(tmp_path), VERSION, [0, 1], None)


def test_control_nodes_keep_their_mode_and_group(tmp_path: Path) -> None:
    gpu_nodes(tmp_path, (0,))
    node(tmp_path, "dev/nvidia-uvm", 511, 0, mode=0o660, gid=44)
    info = d.char_device(DriverRoots.same(tmp_path), PurePosixPath("/dev/nvidia-uvm"))
    assert info is not None and (info.major, info.minor, info.file_mode, info.gid) == (511, 0, 0o660, 44)
    (tmp_path / "dev/nvidia-modeset").write_text("a file, not a node")
    assert d.char_device(DriverRoots.same(tmp_path), PurePosixPath("/dev/nvidia-modeset")) is None


def test_binaries_firmware_and_ipc(tmp_path: Path) -> None:
    place(tmp_path, "usr/bin/nvidia-smi", mode=0o755)
    place(tmp_path, "bin/nvidia-smi", mode=0o755)  # later in PATH order: not taken
    place(tmp_path, "usr/bin/nvidia-debugdump", mode=0o644)  # not executable: not a binary
    place(tmp_path, "bin/nvidia-persistenced", mode=0o755)
    assert [str(p) for p in d._binaries(tmp_path)] == ["/usr/bin/nvidia-smi", "/bin/nvidia-persistenced"]

    place(tmp_path, f"lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin")
    place(tmp_path, f"lib/firmware/updates/nvidia/{VERSION}/gsp_tu10x.bin")
    place(tmp_path, f"custom/nvidia/{VERSION}/ucodes_x.bin")
    place(tmp_path, "lib/firmware/nvidia/999.0/gsp_ga10x.bin")  # another version
    got = [str(p) for p in d._firmware(tmp_path, VERSION, "6.1.0", "/custom")]
    assert got == [  # pattern by pattern, each through the directories in order, as the toolkit
        f"/lib/firmware/updates/nvidia/{VERSION}/gsp_tu10x.bin",
        f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin",
        f"/custom/nvidia/{VERSION}/ucodes_x.bin",
    ]

    (tmp_path / "var/run/nvidia-persistenced").mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "var/run/nvidia-persistenced/socket"))
    (tmp_path / "run/nvidia-fabricmanager/socket").mkdir(parents=True)  # a directory: not an endpoint
    try:
        assert [str(p) for p in d._ipc(tmp_path)] == ["/var/run/nvidia-persistenced/socket"]
    finally:
        server.close()


def test_the_hook_is_found_where_the_toolkit_installs_it(tmp_path: Path) -> None:
    roots = DriverRoots(tmp_path, PurePosixPath("/host"), tmp_path, PurePosixPath("/host"))
    assert d.find_cdi_hook(roots) is None
    place(tmp_path, "usr/local/nvidia/toolkit/nvidia-cdi-hook", mode=0o755)
    assert d.find_cdi_hook(roots) == "/host/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    with pytest.raises(DriverRootError, match="not an executable file"):
        d.check_cdi_hook(tmp_path / "missing")
    assert os.access(tmp_path / "usr/local/nvidia/toolkit/nvidia-cdi-hook", os.X_OK)


def test_nvml_is_found_under_the_root(tmp_path: Path) -> None:
    assert d.find_nvml(DriverRoots.same(tmp_path)) is None
    driver(tmp_path, lib_dir="usr/lib64")
    assert d.find_nvml(DriverRoots.same(tmp_path)) == tmp_path / f"usr/lib64/libnvidia-ml.so.{VERSION}"


def test_the_toolkits_fixed_links_beside_glx_and_opticalflow(tmp_path: Path) -> None:
    for name in (f"libGLX_nvidia.so.{VERSION}", f"libnvidia-opticalflow.so.{VERSION}", "libc.so.6"):
        place(tmp_path, f"{LIB_DIR}/{name}")
    libs = [PurePosixPath(f"/{LIB_DIR}/{n}") for n in os.listdir(tmp_path / LIB_DIR)]
    lib = f"/{LIB_DIR}"
    assert sorted(d.library_links(tmp_path, sorted(libs))) == [
        f"libGLX_nvidia.so.{VERSION}::{lib}/libGLX_indirect.so.0",
        f"libnvidia-opticalflow.so.1::{lib}/libnvidia-opticalflow.so",
    ]


def test_the_start_up_decision_is_strict_only_when_the_driver_is_required(tmp_path: Path) -> None:
    from vgpud.nvdriver.node import node_driver_files

    roots = DriverRoots.same(tmp_path)
    assert node_driver_files(roots, VERSION, [0], required=False, hook_setting=None) is None
    with pytest.raises(DriverRootError, match="vGPU containers would get no GPU"):
        node_driver_files(roots, VERSION, [0], required=True, hook_setting=None)
    assert node_driver_files(roots, VERSION, [], required=True, hook_setting=None) is None  # no GPUs
    driver(tmp_path)
    gpu_nodes(tmp_path, (0,))
    place(tmp_path, "usr/bin/nvidia-cdi-hook", mode=0o755)
    files = node_driver_files(roots, VERSION, [0], required=True, hook_setting=None)
    assert files is not None and files.cdi_hook == f"{tmp_path}/usr/bin/nvidia-cdi-hook"
    off = node_driver_files(roots, VERSION, [0], required=True, hook_setting="off")
    assert off is not None and off.cdi_hook is None
    with pytest.raises(DriverRootError, match="not an executable file"):
        node_driver_files(roots, VERSION, [0], required=True, hook_setting=tmp_path / "none")

"""Paths and env names are the contract's; every name that becomes a path component is checked."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from vgpud.partition import layout as L
from vgpud.partition.layout import Layout, LayoutError, Mount


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (L.CONT_CONFIG_DIR, "/etc/vgpu-manager/config"),
        (L.CONT_PIDS_FILE, "/etc/vgpu-manager/config/pids.config"),
        (L.CONT_VGPU_LOCK, "/tmp/.vgpu_lock"),
        (L.CONT_VMEM_NODE, "/tmp/.vmem_node"),
        (L.CONT_SM_NODE, "/tmp/.sm_node"),
        (L.CONT_REGISTRY_DIR, "/etc/vgpu-manager/registry"),
        (L.CONT_REGISTRY_SOCKET, "/etc/vgpu-manager/registry/socket.sock"),
        (L.CONT_CONTROL_LIBRARY, "/etc/vgpu-manager/driver/libvgpu-control.so"),
        (L.CONT_LD_SO_PRELOAD, "/etc/ld.so.preload"),
        (L.CONT_HOST_PROC, "/etc/vgpu-manager/.host_proc"),
        (L.CONT_WATCHER_DIR, "/etc/vgpu-manager/watcher"),
        (L.HOST_PROC, "/proc"),
        (L.DEFAULT_MANAGER_ROOT, "/etc/vgpu-manager"),
    ],
)
def test_container_and_host_paths(value: PurePosixPath, expected: str) -> None:
    assert str(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (L.ENV_LD_PRELOAD, "LD_PRELOAD"),
        (L.ENV_COMPATIBILITY_MODE, "MANAGER_COMPATIBILITY_MODE"),
        (L.ENV_VISIBLE_DEVICES, "MANAGER_VISIBLE_DEVICES"),
        (L.ENV_VISIBLE_DEVICE, "MANAGER_VISIBLE_DEVICE"),
        (L.ENV_CUDA_MEM_LIMIT, "CUDA_MEM_LIMIT"),
        (L.ENV_CUDA_MEM_RATIO, "CUDA_MEM_RATIO"),
        (L.ENV_CUDA_MEM_OVERSOLD, "CUDA_MEM_OVERSOLD"),
        (L.ENV_CUDA_CORE_LIMIT, "CUDA_CORE_LIMIT"),
        (L.ENV_CUDA_CORE_SOFT_LIMIT, "CUDA_CORE_SOFT_LIMIT"),
        (L.ENV_VMEMORY_NODE_ENABLED, "VMEMORY_NODE_ENABLED"),
        (L.ENV_CUDA_SM_SHARED_BUCKET, "CUDA_SM_SHARED_BUCKET"),
        (L.ENV_CLAIM_UID, "MANAGER_VGPU_CLAIM_UID"),
        (L.ENV_REGISTER_UUID, "MANAGER_CLIENT_REGISTER_UUID"),
        (L.ENV_POD_NAME, "VGPU_POD_NAME"),
        (L.ENV_POD_NAMESPACE, "VGPU_POD_NAMESPACE"),
        (L.ENV_POD_UID, "VGPU_POD_UID"),
        (L.ENV_CONTAINER_NAME, "VGPU_CONTAINER_NAME"),
        (L.ENV_EXTERNAL_SM_WATCHER_ENABLED, "EXTERNAL_SM_WATCHER_ENABLED"),
        (L.indexed(L.ENV_CUDA_MEM_LIMIT, 7), "CUDA_MEM_LIMIT_7"),
    ],
)
def test_env_names(value: str, expected: str) -> None:
    assert value == expected


def test_mode_bits() -> None:
    assert (L.MODE_HOST, L.MODE_CGROUP_V1, L.MODE_CGROUP_V2, L.MODE_OPEN_KERNEL, L.MODE_CLIENT_REGISTER) == (
        0,
        1,
        2,
        100,
        200,
    )
    with pytest.raises(ValueError, match="negative"):
        L.indexed("X", -1)


def test_layout_paths_under_a_root(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    root = PurePosixPath(tmp_path)
    assert layout.claims_dir == root / "claims"
    assert layout.claim_dir("c-1") == root / "claims/c-1"
    assert (
        layout.partition("c-1", "pod-0123456789ab-app/main").config
        == root / "claims/c-1/pod-0123456789ab-app/main/config"
    )
    assert (
        layout.container_partition("c-1", "p-1", "main").pids_file
        == root / "claims/c-1/p-1_main/config/pids.config"
    )
    assert layout.device_plugin_config_dir("p-1", "main") == root / "p-1_main/config"
    assert layout.registry_socket == root / "registry/socket.sock"
    assert layout.ld_so_preload == root / "ld.so.preload"
    assert layout.control_library("0.1.0") == root / "libvgpu-control.so.0.1.0"
    assert layout.host(layout.claims_dir) == root / "claims"


def test_host_root_maps_mount_sources() -> None:
    layout = Layout("/var/lib/vgpud", host_root="/etc/vgpu-manager")
    paths = layout.partition("c-1", "gpu")
    assert layout.host(paths.config) == PurePosixPath("/etc/vgpu-manager/claims/c-1/gpu/config")
    assert L.partition_mounts(layout, paths)[0] == Mount(
        "/etc/vgpu-manager/claims/c-1/gpu/config",
        "/etc/vgpu-manager/config",
        ("rw", "nosuid", "nodev", "bind"),
    )
    with pytest.raises(LayoutError, match="not absolute"):
        Layout("relative/root")


def test_common_mounts() -> None:
    layout = Layout("/etc/vgpu-manager")
    client = L.common_mounts(layout, library_version="0.1.0", client_mode=True)
    assert [(m.host_path, m.container_path, m.read_only) for m in client] == [
        ("/etc/vgpu-manager/registry", "/etc/vgpu-manager/registry", True),
        ("/etc/vgpu-manager/libvgpu-control.so.0.1.0", "/etc/vgpu-manager/driver/libvgpu-control.so", True),
        ("/etc/vgpu-manager/ld.so.preload", "/etc/ld.so.preload", True),
    ]
    cgroup = L.common_mounts(layout, library_version="0.1.0", client_mode=False, sm_watcher=True)
    assert [m.container_path for m in cgroup[3:]] == [
        "/etc/vgpu-manager/.host_proc",
        "/etc/vgpu-manager/watcher",
    ]
    assert cgroup[3].host_path == "/proc" and all(m.options[1:] == L.BIND_OPTIONS for m in cgroup)


@pytest.mark.parametrize("key", ["", "..", "a/../b", "/abs", "a//b", "a/.", "sp ace", "a\x00b"])
def test_unsafe_partition_keys_are_refused(key: str) -> None:
    with pytest.raises(LayoutError):
        Layout().partition("c-1", key)


@pytest.mark.parametrize(
    ("pod_uid", "container"),
    [("..", "main"), ("a/b", "main"), ("p", "Main"), ("p", "a_b"), ("p", ""), ("", "main"), ("p", "-x")],
)
def test_unsafe_container_dir_names_are_refused(pod_uid: str, container: str) -> None:
    with pytest.raises(LayoutError):
        L.container_dir_name(pod_uid, container)

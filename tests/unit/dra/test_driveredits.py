"""The CDI edits that deliver the GPU itself: their shape (the toolkit's), and a claim's spec with them
in eager and NRI mode alike."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests import objects as o
from tests.draharness import GPUS, REF, Harness, single_container_claim
from vgpud.dra.cdi import ContainerEdits, DeviceNode, Hook, claim_spec, device_name
from vgpud.dra.driveredits import driver_edits, library_folders, link_mounts
from vgpud.nvdriver.discover import DeviceNodeInfo, DriverFile, DriverFiles

SCHEMA = json.loads((Path(__file__).parent / "cdi_schema.json").read_text())
V = "550.54.15"
LIB = "/usr/lib/x86_64-linux-gnu"
HOST = "/run/nvidia/driver"
HOOK = "/usr/bin/nvidia-cdi-hook"


def lib(name: str) -> DriverFile:
    return DriverFile(f"{LIB}/{name}", f"{HOST}{LIB}/{name}")


def node(path: str, major: int, minor: int, mode: int = 0o666, gid: int = 0) -> DeviceNodeInfo:
    return DeviceNodeInfo(path, path, major, minor, mode, gid)


def files(*, hook: str | None = HOOK, ctl_mode: int = 0o666, ctl_gid: int = 0) -> DriverFiles:
    return DriverFiles(
        version=V,
        library_dirs=(LIB,),
        libraries=(lib(f"libcuda.so.{V}"), lib(f"libnvidia-ml.so.{V}")),
        links=(
            f"libcuda.so.1::{LIB}/libcuda.so",
            f"libcuda.so.{V}::{LIB}/libcuda.so.1",
            f"libnvidia-ml.so.{V}::{LIB}/libnvidia-ml.so.1",
        ),
        binaries=(DriverFile("/usr/bin/nvidia-smi", f"{HOST}/usr/bin/nvidia-smi"),),
        firmware=(
            DriverFile(f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", f"{HOST}/lib/firmware/nvidia/{V}/gsp.bin"),
        ),
        ipc=(DriverFile("/run/nvidia-persistenced/socket", f"{HOST}/run/nvidia-persistenced/socket"),),
        control_nodes=(node("/dev/nvidiactl", 195, 255, ctl_mode, ctl_gid), node("/dev/nvidia-uvm", 511, 0)),
        gpu_nodes={0: node("/dev/nvidia0", 195, 0), 1: node("/dev/nvidia1", 195, 1)},
        cdi_hook=hook,
    )


def test_common_edits_carry_the_driver_and_void_the_runtimes_selection() -> None:
    edits = driver_edits(files()).common.to_cdi()
    assert edits["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}", "NVIDIA_VISIBLE_DEVICES=void"]
    # ordered by path, as the toolkit lists them
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert edits["deviceNodes"][1] == {
        "path": "/dev/nvidiactl",
        "major": 195,
        "minor": 255,
        "fileMode": 0o666,
        "permissions": "rwm",
    }
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert mounts[f"{LIB}/libcuda.so.{V}"]["hostPath"] == f"{HOST}{LIB}/libcuda.so.{V}"
    assert mounts[f"{LIB}/libcuda.so.{V}"]["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert mounts["/run/nvidia-persistenced/socket"]["options"] == [
        "nosuid",
        "nodev",
        "rbind",
        "rprivate",
        "noexec",
    ]
    assert mounts["/var/run/nvidia-container-devices/void"]["hostPath"] == "/dev/null"
    assert "/usr/bin/nvidia-smi" in mounts and f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin" in mounts
    # with the hook, the links are the hook's: no mount at a link's path
    assert f"{LIB}/libcuda.so.1" not in mounts


def test_hooks_are_the_toolkits_in_its_order() -> None:
    hooks = driver_edits(files()).common.hooks
    assert [h.args[:2] for h in hooks] == [
        ("nvidia-cdi-hook", "create-symlinks"),
        ("nvidia-cdi-hook", "enable-cuda-compat"),
        ("nvidia-cdi-hook", "update-ldcache"),
        ("nvidia-cdi-hook", "disable-device-node-modification"),
    ]
    assert all(h.hook_name == "createContainer" and h.path == HOOK for h in hooks)
    assert all(h.env == ("NVIDIA_CTK_DEBUG=false",) for h in hooks)
    assert hooks[0].args[2:] == (
        "--link",
        f"libcuda.so.1::{LIB}/libcuda.so",
        "--link",
        f"libcuda.so.{V}::{LIB}/libcuda.so.1",
        "--link",
        f"libnvidia-ml.so.{V}::{LIB}/libnvidia-ml.so.1",
    )
    assert hooks[1].args[2:] == (f"--host-driver-version={V}",)
    assert hooks[2].args[2:] == ("--folder", LIB)


def test_without_the_hook_each_link_is_a_mount_of_the_file_it_leads_to() -> None:
    edits = driver_edits(files(hook=None)).common
    assert edits.hooks == ()
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    # libcuda.so -> libcuda.so.1 -> libcuda.so.<V>: the chain ends at the mounted file
    assert mounts[f"{LIB}/libcuda.so"] == f"{HOST}{LIB}/libcuda.so.{V}"
    assert mounts[f"{LIB}/libcuda.so.1"] == f"{HOST}{LIB}/libcuda.so.{V}"
    assert mounts[f"{LIB}/libnvidia-ml.so.1"] == f"{HOST}{LIB}/libnvidia-ml.so.{V}"
    # a link to nothing mounted, or a loop, gives no mount
    assert link_mounts((lib("a.so.1"),), ("gone.so.1::/x/a.so", "b::/l/c", "c::/l/b")) == []


def test_each_gpu_gets_its_own_node_only() -> None:
    by_minor = driver_edits(files()).by_minor
    assert by_minor[1].device_nodes == (DeviceNode("/dev/nvidia1", "/dev/nvidia1", 195, 1, 0o666, "rwm", 0),)
    assert by_minor[1].to_cdi() == {
        "deviceNodes": [
            {"path": "/dev/nvidia1", "major": 195, "minor": 1, "fileMode": 0o666, "permissions": "rwm"}
        ]
    }


def test_a_node_not_world_rw_brings_its_group() -> None:
    edits = driver_edits(files(ctl_mode=0o660, ctl_gid=44)).common
    assert edits.additional_gids == (44,)
    assert edits.to_cdi()["deviceNodes"][1]["gid"] == 44
    assert driver_edits(files(ctl_mode=0o666, ctl_gid=44)).common.additional_gids == ()
    assert driver_edits(files(ctl_mode=0o660, ctl_gid=0)).common.additional_gids == ()


def test_library_folders_take_library_names_only() -> None:
    names = ["libcuda.so.1", "libfoo.so", "libbar.so.1.2", "notalib.so", "libx.sox", "lib.so", "libz.so.s.so"]
    got = library_folders(tuple(DriverFile(f"/d{i}/{n}", "") for i, n in enumerate(names)))
    assert got == ["/d0", "/d1", "/d2", "/d6"]


def test_a_claim_spec_with_driver_edits_is_valid_cdi() -> None:
    edits = driver_edits(files(ctl_mode=0o660, ctl_gid=44))
    name = device_name(o.CLAIM_UID, "gpu", 0, None, 0)
    spec = claim_spec(o.DRIVER, o.CLAIM_UID, [(name, edits.by_minor[0])], edits.common)
    jsonschema.Draft7Validator(SCHEMA).validate(spec)
    assert spec["cdiVersion"] == "0.7.0"  # additionalGids
    plain = driver_edits(files())
    spec = claim_spec(o.DRIVER, o.CLAIM_UID, [(name, plain.by_minor[0])], plain.common)
    assert spec["cdiVersion"] == "0.5.0"  # a device name starting with a digit, hostPath on nodes
    hook = Hook("createContainer", "/h", ("h",))
    assert ContainerEdits(hooks=(hook,)).to_cdi() == {
        "hooks": [{"hookName": "createContainer", "path": "/h", "args": ["h"]}]
    }


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "nri"])
async def test_prepare_hands_over_the_gpu_the_same_way_in_both_modes(tmp_path: Path, lazy: bool) -> None:
    edits = driver_edits(files())
    h = Harness(tmp_path, lazy=lazy, driver_edits=edits)
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    assert (await h.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    spec = h.spec()
    common = spec["containerEdits"]
    assert common["deviceNodes"] == edits.common.to_cdi()["deviceNodes"]
    assert common["hooks"] == edits.common.to_cdi()["hooks"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]
    mounts = {m["containerPath"] for m in common["mounts"]}
    assert f"{LIB}/libcuda.so.{V}" in mounts and "/etc/vgpu-manager/driver/libvgpu-control.so" in mounts
    (device,) = spec["devices"]
    assert device["containerEdits"]["deviceNodes"] == edits.by_minor[GPUS[0].minor].to_cdi()["deviceNodes"]


async def test_a_gpu_without_a_node_is_a_per_claim_error(tmp_path: Path) -> None:
    edits = driver_edits(files())
    h = Harness(tmp_path, driver_edits=type(edits)(edits.common, {1: edits.by_minor[1]}))
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    error = (await h.driver.prepare([REF]))[o.CLAIM_UID].error
    assert f"GPU {GPUS[0].uuid} (minor 0) has no device node" in error

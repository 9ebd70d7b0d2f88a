"""A device hot-plugged into a running container (issue 18): its env cannot change, so the library
takes the limits of a device its env does not name from the entry vgpud adds to vgpu.config
(vgpud.hotplug.configfile), in every process started after the entry is there; before it, and after
detach (the entry removed), the device is not the container's: the library refuses it. The
container's own devices keep the env's limits whatever the file says. Real processes under
LD_PRELOAD on the fake driver: device 0 is the hot-plugged one, device 1 the container's own."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from tests.unit.libvgpu.cbuild import CUDA_DECLS, compile_on_fake_cuda
from tests.unit.libvgpu.conftest import MIB, PHYSICAL, UUIDS, Container
from vgpud.hotplug import configfile as C
from vgpud.hotplug import vgpuconfig as V
from vgpud.partition import libfiles as F
from vgpud.partition.edits import device_env

#: the target's own env: device 1 only (MANAGER_VISIBLE_DEVICE_1 hides the fixture's device list)
OWN = device_env(1, UUIDS[1], total_memory=PHYSICAL, consumed_capacity={"memory": "2Gi"})
#: a process of the target on its own device only (CUDA device 0 is host GPU 1)
ON_OWN = {**OWN, "CUDA_VISIBLE_DEVICES": "1"}
#: the slave claim's env for device 0: what vgpud reads from its CDI spec
SLAVE = device_env(0, UUIDS[0], total_memory=PHYSICAL, consumed_capacity={"memory": "1Gi", "cores": "30"})
ADDED = [V.AddedDevice(0, V.device_limits(SLAVE, 0) or F.DeviceLimits())]

#: launches one kernel on CUDA device 0, then prints the shared bucket's view of host device 0
CORE_PROBE = (
    r"""
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
"""
    + CUDA_DECLS
    + r"""
int main(int argc, char **argv) {
    CUfunction f;
    if (argc != 2 || load_kernel("k", &f) || cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))
        return 1;
    int fd = open(argv[1], O_RDONLY);
    int32_t hard = -1;
    if (fd >= 0 && pread(fd, &hard, 4, 128 + 96) != 4) /* devices[0].hard_core */
        return 1;
    printf("hard_core %d\n", hard);
    return 0;
}
"""
)


def fill(container: Container) -> int | None:
    """Bytes one process allocates on CUDA device 0 (the hot-plugged GPU) before it is refused;
    None when the device itself is refused (not the container's without its entry)."""
    got = container.attempt("fill", "direct", str(256 * MIB), **OWN)
    if got.refused:
        return None
    assert got.returncode == 0, got
    return int(got.lines["total"])


def attach(path: Path, *, create: bool = False) -> C.ConfigOutcome:
    return trio.run(
        functools.partial(
            C.change_target_config, path, functools.partial(V.extend_config, added=ADDED), create=create
        )
    )


def detach(path: Path) -> C.ConfigOutcome:
    return trio.run(C.change_target_config, path, functools.partial(V.shrink_config, uuids=[UUIDS[0]]))


def test_an_added_entry_limits_the_processes_started_after_it(container: Container) -> None:
    assert fill(container) is None  # before Attach: the device its env does not name is refused
    path = container.root / "config" / F.VGPU_CONFIG_FILE
    assert attach(path).state is C.ConfigState.CHANGED
    assert fill(container) == 1024 * MIB
    info = container.run("info", **OWN)
    views = (int(info["meminfo_total"]), int(info["totalmem"]), int(info["nvml_total"]))
    assert views == (1024 * MIB,) * 3, info
    assert detach(path).state is C.ConfigState.CHANGED
    assert fill(container) is None


def test_a_file_vgpud_creates_before_the_library_ran(container: Container) -> None:
    """Attach to a container none of whose processes ran yet: vgpud creates the file (header and its
    entry); the first process merges its env in (its own entries and identity, as on a fresh file),
    keeps the added entry and enforces it; a second process changes nothing; detach leaves exactly
    the library's own file."""
    env = {**OWN, "VGPU_POD_UID": "0f1e2d3c-uid", "VGPU_POD_NAME": "trainer", "VGPU_CONTAINER_NAME": "main"}
    path = container.root / "config" / F.VGPU_CONFIG_FILE
    container.run("info", **env, CUDA_VISIBLE_DEVICES="1")  # on its own device: CUDA device 0 is GPU 1
    fresh = path.read_bytes()  # what the library writes with no file there
    assert F.parse_vgpu_config(fresh).active().keys() == {1}
    path.unlink()

    made = attach(path, create=True)
    assert (made.state, made.written, made.created) == (C.ConfigState.CHANGED, (0,), True)
    entry = F.build_config_device(replace(ADDED[0].limits, hotplug=True))
    at = F.config_device_offset(0)
    header_only = F.build_vgpu_config(F.VgpuConfig())
    assert path.read_bytes() == header_only[:at] + entry + header_only[at + len(entry) :]

    assert int(container.run("fill", "direct", str(256 * MIB), **env)["total"]) == 1024 * MIB  # adopted
    merged = path.read_bytes()
    assert merged == fresh[:at] + entry + fresh[at + len(entry) :]
    container.run("info", **env, CUDA_VISIBLE_DEVICES="1")
    assert path.read_bytes() == merged
    assert detach(path).state is C.ConfigState.CHANGED
    assert path.read_bytes() == fresh


def test_the_env_s_own_devices_keep_their_limits(container: Container) -> None:
    """An entry at an index the env names, or naming a UUID the env has elsewhere, is not taken."""
    devices = [F.DeviceLimits()] * F.MAX_DEVICES
    loose = F.DeviceLimits(uuid=UUIDS[0], total_memory=PHYSICAL, real_memory=PHYSICAL, activate=True)
    devices[0] = replace(loose, hotplug=True)
    devices[2] = replace(ADDED[0].limits, hotplug=True)  # device 0's UUID at another index
    (container.root / "config").mkdir()
    (container.root / "config" / F.VGPU_CONFIG_FILE).write_bytes(
        F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices)))
    )
    own0 = device_env(0, UUIDS[0], total_memory=PHYSICAL, consumed_capacity={"memory": "512Mi"})
    assert int(container.run("fill", "direct", str(256 * MIB), **own0)["total"]) == 512 * MIB


def test_only_entries_marked_hotplug_are_taken(container: Container) -> None:
    """The library writes every entry of its own unmarked; an unmarked entry at an index the env
    leaves empty is not one vgpud added, and is not taken: the device stays refused."""
    devices = [F.DeviceLimits()] * F.MAX_DEVICES
    devices[0] = ADDED[0].limits
    (container.root / "config").mkdir()
    (container.root / "config" / F.VGPU_CONFIG_FILE).write_bytes(
        F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices)))
    )
    assert fill(container) is None


@pytest.fixture
def core_probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_on_fake_cuda(tmp_path_factory.mktemp("core") / "coreprobe", CORE_PROBE)


def test_an_added_entry_s_core_limit_is_applied(container: Container, core_probe: Path) -> None:
    def hard_core(**extra: str) -> int | None:
        """The probe's view of host device 0's hard limit; None when CUDA device 0 is refused."""
        env = container.environ(**OWN, CUDA_SM_SHARED_BUCKET="TRUE", **extra)
        sm_node = container.root / "sm" / F.SM_NODE_FILE
        sm_node.unlink(missing_ok=True)
        proc = subprocess.run(
            [str(core_probe), str(sm_node)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode != 0 and "cuDeviceGet(&dev, 0): 101" in proc.stderr:
            return None
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.split()[1])

    assert hard_core() is None  # the device is not the container's yet
    assert hard_core(CUDA_VISIBLE_DEVICES="1") == -1  # its own device: no limit anywhere, no bucket
    path = container.root / "config" / F.VGPU_CONFIG_FILE
    container.run("info", **ON_OWN)  # the library's first process writes the file
    attach(path)
    assert hard_core() == 30

"""vgpu.config, written by the first library process of a container from its environment (DRA
mode) and completed by later ones, read back with vgpud's own parser (vgpud/partition/libfiles.py)."""

from __future__ import annotations

import functools
from dataclasses import replace

import trio

from tests.unit.libvgpu.conftest import MIB, PHYSICAL, UUIDS, Container
from vgpud.hotplug import configfile as C
from vgpud.hotplug import vgpuconfig as V
from vgpud.partition import libfiles as F
from vgpud.partition.edits import device_env

ENV = {
    "CUDA_MEM_LIMIT_0": "1024m",
    "CUDA_MEM_LIMIT_1": "2g",
    "CUDA_MEM_RATIO_1": "2",
    "CUDA_CORE_LIMIT_0": "30",
    "VGPU_POD_UID": "0f1e2d3c-uid",
    "VGPU_POD_NAME": "trainer",
    "VGPU_POD_NAMESPACE": "ml",
    "VGPU_CONTAINER_NAME": "main",
}


def test_written_from_the_environment(container: Container) -> None:
    container.run("fill", "direct", str(512 * MIB), **ENV)
    config = F.parse_vgpu_config((container.root / "config" / "vgpu.config").read_bytes())
    assert len((container.root / "config" / "vgpu.config").read_bytes()) == F.CONFIG_FILE_SIZE
    assert (config.pod_uid, config.pod_name, config.pod_namespace, config.container_name) == (
        "0f1e2d3c-uid",
        "trainer",
        "ml",
        "main",
    )
    assert config.cuda_version[0] >= 11 and config.driver_version
    active = config.active()
    assert sorted(active) == [0, 1]
    assert active[0].uuid == UUIDS[0] and active[0].total_memory == 1024 * MIB and active[0].memory_limit
    assert (active[0].hard_core, active[0].core_limit) == (30, True)
    assert active[1].total_memory == 2048 * MIB and active[1].real_memory == 1024 * MIB
    assert active[1].memory_oversold and not active[1].core_limit


def test_a_valid_file_gets_what_is_blank_and_a_bad_one_is_rebuilt(container: Container) -> None:
    """A process finding a valid file (an earlier process's, or one vgpud created) fills in only
    what is still zero: identity fields and the empty slots of its env's devices."""
    path = container.root / "config" / "vgpu.config"
    path.parent.mkdir(parents=True)
    earlier = F.DeviceLimits(
        uuid=UUIDS[0], total_memory=MIB, real_memory=MIB, memory_limit=True, activate=True
    )
    devices = (earlier,) + (F.DeviceLimits(),) * (F.MAX_DEVICES - 1)
    path.write_bytes(F.build_vgpu_config(F.VgpuConfig(devices=devices, pod_name="written-by-the-host")))
    container.run("fill", "direct", str(512 * MIB), **ENV)
    merged = F.parse_vgpu_config(path.read_bytes())
    assert (merged.pod_name, merged.pod_uid, merged.container_name) == (
        "written-by-the-host",
        "0f1e2d3c-uid",
        "main",
    )
    assert merged.cuda_version[0] >= 11 and merged.driver_version
    assert merged.active()[0] == earlier  # an active entry stays as the first publisher wrote it
    assert merged.active()[1].total_memory == 2048 * MIB and merged.active()[1].memory_oversold
    once = path.read_bytes()
    container.run("fill", "direct", str(512 * MIB), **ENV)
    assert path.read_bytes() == once
    path.write_bytes(b"\0" * 100)
    container.run("fill", "direct", str(512 * MIB), **ENV)
    assert F.parse_vgpu_config(path.read_bytes()).pod_name == "trainer"


def test_hot_plug_entries_follow_the_library_s_rules_and_survive_it(container: Container) -> None:
    """vgpud's reading of a slave's env (vgpud.hotplug.vgpuconfig) gives the entry this library
    writes for the same env, and a file extended with it is kept by the library's next process."""
    env = {
        **device_env(0, UUIDS[0], total_memory=PHYSICAL, consumed_capacity={"memory": "3Gi", "cores": "40"}),
        **device_env(
            1, UUIDS[1], total_memory=PHYSICAL, consumed_capacity={"memory": "8Gi"}, memory_ratio=200
        ),
        "CUDA_CORE_SOFT_LIMIT_0": "70",
    }
    container.run("fill", "direct", str(512 * MIB), **env)
    path = container.root / "config" / "vgpu.config"
    written = F.parse_vgpu_config(path.read_bytes()).active()
    assert written == {i: V.device_limits(env, i) for i in (0, 1)}
    assert written[0].soft_core == 70 and written[1].memory_oversold

    # the target runs device 1 only; device 0 is added and removed in its file
    path.unlink()
    own = {k: v for k, v in env.items() if k.endswith("_1")}
    own["CUDA_VISIBLE_DEVICES"] = "1"  # its processes use its device (CUDA device 0 is host GPU 1)
    container.run("fill", "direct", str(512 * MIB), **own)
    base = path.read_bytes()
    added = [V.AddedDevice(0, written[0])]
    outcome = trio.run(C.change_target_config, path, functools.partial(V.extend_config, added=added))
    assert outcome.state is C.ConfigState.CHANGED
    extended = path.read_bytes()
    container.run("fill", "direct", str(512 * MIB), **own)
    assert path.read_bytes() == extended  # nothing to merge: the env's entries are there already
    assert F.parse_vgpu_config(extended).active() == {0: replace(written[0], hotplug=True), 1: written[1]}
    trio.run(C.change_target_config, path, functools.partial(V.shrink_config, uuids=[UUIDS[0]]))
    assert path.read_bytes() == base

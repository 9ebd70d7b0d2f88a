"""vgpu.config, written by the first library process of a container from its environment (DRA
mode: nobody else writes it), read back with vgpud's own parser (vgpud/partition/libfiles.py)."""

from __future__ import annotations

from tests.unit.libvgpu.conftest import MIB, UUIDS, Container
from vgpud.partition import libfiles as F

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


def test_a_valid_file_is_kept_and_a_bad_one_rebuilt(container: Container) -> None:
    path = container.root / "config" / "vgpu.config"
    path.parent.mkdir(parents=True)
    mine = F.build_vgpu_config(F.VgpuConfig(pod_name="written-by-the-host"))
    path.write_bytes(mine)
    container.run("fill", "direct", str(512 * MIB), **ENV)
    assert path.read_bytes() == mine
    path.write_bytes(b"\0" * 100)
    container.run("fill", "direct", str(512 * MIB), **ENV)
    assert F.parse_vgpu_config(path.read_bytes()).pod_name == "trainer"

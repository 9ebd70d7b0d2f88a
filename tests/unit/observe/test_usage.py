"""Each container's limits and usage in the metrics and the debug state, read from the library's files
in its directory: lazy (the NRI cache's directories) and eager (the checkpoint's partitions), with
files written by the Python builder and by the C structs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trio

from tests import objects as o
from tests.draharness import REF, single_container_claim
from tests.support import built
from tests.unit.observe.node import Node, make_node
from tests.unit.observe.test_metrics import families, family, value
from vgpud import metrics_names as names
from vgpud._pb.nri.pkg.api.v1alpha1 import Container, CreateContainerRequest, PodSandbox
from vgpud.partition import libfiles as F

GIB = 1 << 30
POD = PodSandbox(id="sb", name="train", namespace=o.NAMESPACE, uid=o.POD1_UID)
UUID = "GPU-8d2f0d3a-5c41-4b0e-9d2a-0123456789ab"


async def _prepared(root: Path, *, lazy: bool) -> Node:
    node = make_node(root, lazy=lazy)
    claim, pod = single_container_claim()
    node.harness.kube.add_claim(claim)
    node.harness.kube.add_pod(pod)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    return node


async def _container_dir(node: Node, name: str) -> Path:
    env = [f"MANAGER_VGPU_CLAIM_UID={o.CLAIM_UID}"]
    await node.nri.create_container(
        CreateContainerRequest(
            pod=POD, container=Container(id=f"id-{name}", pod_sandbox_id="sb", name=name, env=env)
        )
    )
    return Path(node.harness.layout.container_partition(o.CLAIM_UID, o.POD1_UID, name).base)


def _write_limits(directory: Path, index: int, memory: int, cores: int) -> None:
    devices = [F.DeviceLimits()] * 16
    devices[index] = F.DeviceLimits(
        uuid=UUID, total_memory=memory, hard_core=cores, memory_limit=True, core_limit=True, activate=True
    )
    (directory / "config" / F.VGPU_CONFIG_FILE).write_bytes(
        F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices)))
    )


async def test_lazy_containers_show_their_limits_and_ledger(short_tmp: Path) -> None:
    node = await _prepared(short_tmp, lazy=True)
    main, side = await _container_dir(node, "main"), await _container_dir(node, "side")
    _write_limits(main, 0, 4 * GIB, 30)
    ledger = {0: [F.LedgerEntry(100, GIB), F.LedgerEntry(101, 2 * GIB)]}
    (main / "vmem_node" / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node(ledger))
    _write_limits(side, 0, 2 * GIB, 20)  # no ledger yet: no ledger samples, only limits
    (side / "sm_node" / F.SM_NODE_FILE).write_bytes(b"not a bucket")

    status = await node.usage.read()
    assert status.reads == 1
    found = families(node)
    main_labels = {"claim_uid": o.CLAIM_UID, "partition": f"{o.POD1_UID}_main", "index": "0", "uuid": UUID}
    side_labels = {**main_labels, "partition": f"{o.POD1_UID}_side"}
    limit = found[family(names.CONTAINER_MEMORY_LIMIT)]
    assert value(limit, names.CONTAINER_MEMORY_LIMIT.name, **main_labels) == 4 * GIB
    assert value(limit, names.CONTAINER_MEMORY_LIMIT.name, **side_labels) == 2 * GIB
    assert (
        value(found[family(names.CONTAINER_CORE_LIMIT)], names.CONTAINER_CORE_LIMIT.name, **main_labels) == 30
    )
    ledger_samples = found[family(names.CONTAINER_LEDGER_BYTES)]
    assert value(ledger_samples, names.CONTAINER_LEDGER_BYTES.name, **main_labels) == 3 * GIB
    assert [s.labels for s in ledger_samples] == [main_labels]
    processes = found[family(names.CONTAINER_LEDGER_PROCESSES)]
    assert value(processes, names.CONTAINER_LEDGER_PROCESSES.name, **main_labels) == 2
    errors = found[family(names.CONTAINER_FILE_ERRORS)]
    owner = {"claim_uid": o.CLAIM_UID, "partition": f"{o.POD1_UID}_side"}
    assert value(errors, names.CONTAINER_FILE_ERRORS.name, **owner) == 1
    assert value(found[family(names.USAGE_READS)], names.USAGE_READS.name) == 1

    state = json.loads(json.dumps(await node.state.snapshot()))
    containers = state["usage"]["containers"]
    assert set(containers) == {f"{o.CLAIM_UID}/{o.POD1_UID}_main", f"{o.CLAIM_UID}/{o.POD1_UID}_side"}
    shown = containers[f"{o.CLAIM_UID}/{o.POD1_UID}_main"]
    assert (shown["pod_uid"], shown["container"], shown["directory"]) == (o.POD1_UID, "main", str(main))
    assert shown["files"] == {"vgpu_config": True, "vmem_node": True, "sm_node": False}
    assert shown["devices"] == {
        "0": {
            "uuid": UUID,
            "memory_limit_bytes": 4 * GIB,
            "core_limit_percent": 30,
            "ledger_bytes": 3 * GIB,
            "ledger_processes": 2,
            "sm_utilization_permille": None,
        }
    }
    side_errors = containers[f"{o.CLAIM_UID}/{o.POD1_UID}_side"]["errors"]
    assert side_errors == ["sm_node.config: 12 bytes at offset 0, expected 2176 (file too short)"]


async def test_a_restart_of_the_container_resets_what_it_shows(short_tmp: Path) -> None:
    """The ledger of an earlier instance is deleted at CreateContainer, so the usage drops with it."""
    node = await _prepared(short_tmp, lazy=True)
    main = await _container_dir(node, "main")
    _write_limits(main, 0, 4 * GIB, 30)
    (main / "vmem_node" / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node({0: [F.LedgerEntry(7, GIB)]}))
    (container,) = (await node.usage.read()).containers
    assert container.usage.devices[0].ledger_bytes == GIB
    await _container_dir(node, "main")  # the restarted instance
    (container,) = (await node.usage.read()).containers
    assert not container.usage.has_ledger and container.usage.devices[0].ledger_bytes == 0


@pytest.mark.needs_build
async def test_eager_partitions_show_what_the_c_structs_wrote(short_tmp: Path) -> None:
    node = await _prepared(short_tmp, lazy=False)
    ((claim_uid, (_, record)),) = node.harness.driver.index.records().items()
    (key,) = set(record.request_partitions.values())
    directory = Path(node.harness.layout.partition(claim_uid, key).base)
    out = short_tmp / "c"
    out.mkdir()
    await trio.run_process([str(built("libvgpu/tests/files_layout")), "--write", str(out)])
    shutil.copy(out / F.VGPU_CONFIG_FILE, directory / "config")
    shutil.copy(out / F.VMEM_NODE_FILE, directory / "vmem_node")
    shutil.copy(out / F.SM_NODE_FILE, directory / "sm_node")

    await node.usage.read()
    found = families(node)
    labels = {"claim_uid": claim_uid, "partition": key, "index": "3", "uuid": UUID}
    assert (
        value(found[family(names.CONTAINER_MEMORY_LIMIT)], names.CONTAINER_MEMORY_LIMIT.name, **labels)
        == 4 * GIB
    )
    assert (
        value(found[family(names.CONTAINER_LEDGER_BYTES)], names.CONTAINER_LEDGER_BYTES.name, **labels)
        == (1 << 20) + 3 * GIB + 7
    )
    sm = found[family(names.CONTAINER_SM_UTILIZATION)]
    assert value(sm, names.CONTAINER_SM_UTILIZATION.name, **labels) == pytest.approx(0.295)
    state = await node.state.snapshot()
    shown = state["usage"]["containers"][f"{claim_uid}/{key}"]
    assert shown["pod_uid"] == "" and shown["devices"]["3"]["sm_utilization_permille"] == 295


async def test_no_directories_no_samples(short_tmp: Path) -> None:
    node = make_node(short_tmp, lazy=True)
    status = await node.usage.read()
    assert status.containers == () and status.last_read is not None
    assert families(node)[family(names.CONTAINER_MEMORY_LIMIT)] == []

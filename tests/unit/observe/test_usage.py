"""Each container's limits and usage in the metrics and the debug state, read from the library's files
in its directory: lazy (the NRI cache's directories) and eager (the checkpoint's partitions), with
files written by the Python builder and by the C structs."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests import objects as o
from tests.draharness import GPUS
from tests.support import built
from tests.unit.fakes import gpu as fakegpu
from tests.unit.observe.node import container_dir, make_node, prepared_node, write_limits
from tests.unit.observe.test_metrics import families, family, value
from vgpud import metrics_names as names
from vgpud.gpu.nvml import NvmlInventory
from vgpud.observe.usage import UsageReader
from vgpud.partition import libfiles as F
from vgpud.partition.pidsfile import write_pids_file

GIB = 1 << 30
UUID = "GPU-8d2f0d3a-5c41-4b0e-9d2a-0123456789ab"


def _write_limits(directory: Path, index: int, memory: int, cores: int) -> None:
    write_limits(directory, index, UUID, memory, cores)


async def test_lazy_containers_show_their_limits_and_ledger(short_tmp: Path) -> None:
    node = await prepared_node(short_tmp, lazy=True)
    main, side = await container_dir(node, "main"), await container_dir(node, "side")
    _write_limits(main, 0, 4 * GIB, 30)
    ledger = {0: [F.LedgerEntry(100, GIB), F.LedgerEntry(101, 2 * GIB)]}
    (main / "vmem_node" / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node(ledger))
    _write_limits(side, 0, 2 * GIB, 20)  # no ledger yet: no ledger samples, only limits
    (side / "sm_node" / F.SM_NODE_FILE).write_bytes(b"not a bucket")

    status = await node.usage.read()
    assert status.reads == 1
    found = families(node)
    main_owner = {"namespace": o.NAMESPACE, "pod": "train", "container": "main", "claim_uid": o.CLAIM_UID}
    main_labels = {**main_owner, "partition": f"{o.POD1_UID}_main", "index": "0", "uuid": UUID}
    side_labels = {**main_labels, "container": "side", "partition": f"{o.POD1_UID}_side"}
    limit = found[family(names.CONTAINER_MEMORY_LIMIT)]
    assert value(limit, names.CONTAINER_MEMORY_LIMIT.name, **main_labels) == 4 * GIB
    assert value(limit, names.CONTAINER_MEMORY_LIMIT.name, **side_labels) == 2 * GIB
    core = found[family(names.CONTAINER_CORE_LIMIT)]
    assert value(core, names.CONTAINER_CORE_LIMIT.name, **main_labels) == 0.3
    ledger_samples = found[family(names.CONTAINER_LEDGER_BYTES)]
    assert value(ledger_samples, names.CONTAINER_LEDGER_BYTES.name, **main_labels) == 3 * GIB
    assert [s.labels for s in ledger_samples] == [main_labels]
    processes = found[family(names.CONTAINER_LEDGER_PROCESSES)]
    assert value(processes, names.CONTAINER_LEDGER_PROCESSES.name, **main_labels) == 2
    errors = found[family(names.CONTAINER_FILE_ERRORS)]
    owner = {**main_owner, "container": "side", "partition": f"{o.POD1_UID}_side"}
    assert value(errors, names.CONTAINER_FILE_ERRORS.name, **owner) == 1
    assert value(found[family(names.USAGE_READS)], names.USAGE_READS.name) == 1

    state = json.loads(json.dumps(await node.state.snapshot()))
    containers = state["usage"]["containers"]
    assert set(containers) == {f"{o.CLAIM_UID}/{o.POD1_UID}_main", f"{o.CLAIM_UID}/{o.POD1_UID}_side"}
    shown = containers[f"{o.CLAIM_UID}/{o.POD1_UID}_main"]
    assert (shown["pod_uid"], shown["container"], shown["directory"]) == (o.POD1_UID, "main", str(main))
    assert (shown["namespace"], shown["pod"]) == (o.NAMESPACE, "train")
    assert shown["files"] == {"vgpu_config": True, "vmem_node": True, "sm_node": False}
    assert shown["devices"] == {
        "0": {
            "uuid": UUID,
            "memory_limit_bytes": 4 * GIB,
            "core_limit_percent": 30,
            "ledger_bytes": 3 * GIB,
            "ledger_processes": 2,
            "sm_utilization_permille": None,
            "nvml_bytes": None,
            "used_bytes": None,
        }
    }
    side_errors = containers[f"{o.CLAIM_UID}/{o.POD1_UID}_side"]["errors"]
    assert side_errors == ["sm_node.config: 12 bytes at offset 0, expected 2176 (file too short)"]


async def test_a_restart_of_the_container_resets_what_it_shows(short_tmp: Path) -> None:
    """The ledger of an earlier instance is deleted at CreateContainer, so the usage drops with it."""
    node = await prepared_node(short_tmp, lazy=True)
    main = await container_dir(node, "main")
    _write_limits(main, 0, 4 * GIB, 30)
    (main / "vmem_node" / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node({0: [F.LedgerEntry(7, GIB)]}))
    (container,) = (await node.usage.read()).containers
    assert container.usage.devices[0].ledger_bytes == GIB
    await container_dir(node, "main")  # the restarted instance
    (container,) = (await node.usage.read()).containers
    assert not container.usage.has_ledger and container.usage.devices[0].ledger_bytes == 0


@pytest.mark.needs_build
async def test_eager_partitions_show_what_the_c_structs_wrote(short_tmp: Path) -> None:
    node = await prepared_node(short_tmp, lazy=False)
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
    owner = {"namespace": o.NAMESPACE, "pod": "", "container": ""}  # a partition may serve several pods
    labels = {**owner, "claim_uid": claim_uid, "partition": key, "index": "3", "uuid": UUID}
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


@contextlib.contextmanager
def _process_holding_3_gib(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[int, NvmlInventory, int]]:
    """A process of the fake libcuda holding 3 GiB on a fake 8 GiB GPU, and vgpud's NVML inventory over
    the same state (its env set): (the process's PID, the inventory, the GPU's index)."""
    profile = short_tmp / "profile.yaml"
    profile.write_text(fakegpu.profile_text(memory_gib=8))
    env = {"FAKE_NVML_PROFILE": str(profile), "FAKE_GPU_STATE": str(short_tmp / "gpu.state")}
    child = fakegpu.start(
        "cuda.init()\ncuda.use(0)\ncuda.alloc(3 * GIB)\nemit(pid=os.getpid(), uuid=cuda.uuid(0))\nhold()\n",
        {**env, "FAKE_CUDA_LIB": str(built(fakegpu.CUDA_LIB))},
    )
    try:
        report = child.read()
        for key, val in env.items():
            monkeypatch.setenv(key, val)
        inventory = NvmlInventory(str(built(fakegpu.NVML_LIB)))
        index = {gpu.uuid: gpu.index for gpu in inventory.gpus()}[report["uuid"]]
        yield report["pid"], inventory, index
    finally:
        child.proc.communicate("", timeout=30)


@pytest.mark.needs_build
def test_the_registered_pids_nvml_memory_plus_the_ledger_is_the_usage(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML (the fake, sharing its state with a process of the fake libcuda that holds 3 GiB) gives
    the memory of the PIDs pids.config registers; with the ledger's 1 GiB it is the usage."""
    with _process_holding_3_gib(short_tmp, monkeypatch) as (pid, inventory, index):
        assert inventory.process_memory()[index] == {pid: 3 * GIB}

        async def scenario() -> None:
            node = await prepared_node(short_tmp, lazy=True)
            main = await container_dir(node, "main")
            await container_dir(node, "other")
            write_pids_file(main / "config", [pid, 4_000_000])
            ledger = {index: [F.LedgerEntry(pid, GIB)]}
            (main / "vmem_node" / F.VMEM_NODE_FILE).write_bytes(F.build_vmem_node(ledger))
            reader = UsageReader(
                node.harness.layout,
                node.harness.driver.index,
                node.store,
                1.0,
                process_memory=inventory.process_memory,
            )
            metrics = node.make_metrics(usage=reader)
            status = await reader.read()
            assert status.process_memory_error == ""
            by_partition = {c.target.partition: c.usage for c in status.containers}
            (device,) = by_partition[f"{o.POD1_UID}_main"].devices
            assert (device.index, device.nvml_bytes, device.used_bytes) == (index, 3 * GIB, 4 * GIB)
            assert by_partition[f"{o.POD1_UID}_other"].devices == ()  # no registered PID: unknown
            body, _ = metrics.exposition()
            (used,) = [
                f
                for f in text_string_to_metric_families(body.decode())
                if f.name == names.CONTAINER_MEMORY_USED.name
            ]
            labels = {
                "namespace": o.NAMESPACE,
                "pod": "train",
                "container": "main",
                "claim_uid": o.CLAIM_UID,
                "partition": f"{o.POD1_UID}_main",
                "index": str(index),
                "uuid": "",
            }
            assert value(used.samples, names.CONTAINER_MEMORY_USED.name, **labels) == 4 * GIB

            monkeypatch.delenv("FAKE_NVML_PROFILE")
            status = await reader.read()
            assert "FAKE_NVML_PROFILE is not set" in status.process_memory_error
            (device,) = {c.target.partition: c.usage for c in status.containers}[f"{o.POD1_UID}_main"].devices
            assert device.nvml_bytes is None and device.ledger_bytes == GIB

        trio.run(scenario)


@pytest.mark.needs_build
def test_cgroup_mode_counts_the_pids_of_the_containers_cgroup(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without registration (cgroup mode) the container's PIDs come from its cgroup, looked up by pod
    UID and container ID (`container_pids`, here a table): pids.config is not read, even when there."""
    with _process_holding_3_gib(short_tmp, monkeypatch) as (pid, inventory, index):
        asked: list[tuple[str, str]] = []

        def container_pids(pod_uid: str, container_id: str) -> frozenset[int]:
            asked.append((pod_uid, container_id))
            return frozenset({pid}) if container_id == "id-main" else frozenset()

        async def scenario() -> None:
            node = await prepared_node(short_tmp, lazy=True)
            await container_dir(node, "main")
            other = await container_dir(node, "other")
            write_pids_file(other / "config", [pid])  # not read in cgroup mode
            reader = UsageReader(
                node.harness.layout,
                node.harness.driver.index,
                node.store,
                1.0,
                process_memory=inventory.process_memory,
                container_pids=container_pids,
            )
            status = await reader.read()
            by_partition = {c.target.partition: c.usage for c in status.containers}
            (device,) = by_partition[f"{o.POD1_UID}_main"].devices
            assert (device.index, device.nvml_bytes) == (index, 3 * GIB)
            assert by_partition[f"{o.POD1_UID}_main"].pids == {pid}
            assert by_partition[f"{o.POD1_UID}_other"].devices == ()
            assert sorted(asked) == [(o.POD1_UID, "id-main"), (o.POD1_UID, "id-other")]

        trio.run(scenario)


async def test_each_gpu_shows_capacity_allocated_and_used_by_its_vgpus(short_tmp: Path) -> None:
    """Two containers on GPU 0 (4 GiB/30% and 2 GiB/20%): the GPU's allocated memory and cores are their
    limits' sums; GPU 1 has none; the metrics, the debug state and their containers agree."""
    node = await prepared_node(short_tmp, lazy=True)
    gpu0, gpu1 = GPUS[0], GPUS[1]
    main, side = await container_dir(node, "main"), await container_dir(node, "side")
    for directory, memory, cores in ((main, 4 * GIB, 30), (side, 2 * GIB, 20)):
        write_limits(directory, gpu0.index, gpu0.uuid, memory, cores)
    await node.usage.read()
    found = families(node)
    labels0 = {"index": str(gpu0.index), "uuid": gpu0.uuid}
    labels1 = {"index": str(gpu1.index), "uuid": gpu1.uuid}
    total = found[family(names.GPU_MEMORY_TOTAL)]
    assert value(total, names.GPU_MEMORY_TOTAL.name, **labels0) == gpu0.memory_total
    allocated = found[family(names.GPU_MEMORY_ALLOCATED)]
    assert value(allocated, names.GPU_MEMORY_ALLOCATED.name, **labels0) == 6 * GIB
    assert value(allocated, names.GPU_MEMORY_ALLOCATED.name, **labels1) == 0
    cores = found[family(names.GPU_CORES_ALLOCATED)]
    assert value(cores, names.GPU_CORES_ALLOCATED.name, **labels0) == pytest.approx(0.5)
    vgpus = found[family(names.GPU_VGPUS)]
    assert value(vgpus, names.GPU_VGPUS.name, **labels0, memory_limited="true") == 2
    assert value(vgpus, names.GPU_VGPUS.name, **labels0, memory_limited="false") == 0
    info = found[family(names.GPU_INFO)]
    assert value(info, names.GPU_INFO.name, **labels1, product=gpu1.product_name) == 1

    state = json.loads(json.dumps(await node.state.snapshot()))
    shown0, shown1 = state["gpus"]
    assert (shown0["index"], shown0["memory_allocated_bytes"], shown0["cores_allocated_ratio"]) == (
        gpu0.index,
        6 * GIB,
        0.5,
    )
    assert shown0["healthy"] is (None if node.watcher is None else True) and shown1["vgpus"] == []
    assert [(v["namespace"], v["pod"], v["container"], v["memory_limit_bytes"]) for v in shown0["vgpus"]] == [
        (o.NAMESPACE, "train", "main", 4 * GIB),
        (o.NAMESPACE, "train", "side", 2 * GIB),
    ]


async def test_without_the_usage_reader_a_gpu_shows_only_its_capacity(short_tmp: Path) -> None:
    node = await prepared_node(short_tmp, lazy=True)
    body, _ = node.make_metrics(usage=None).exposition()
    found = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    assert len(found[family(names.GPU_MEMORY_TOTAL)]) == len(GPUS)
    assert found[family(names.GPU_MEMORY_ALLOCATED)] == []

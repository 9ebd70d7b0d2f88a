"""The ResourceSlice builder (exact shape, API validation rules) and SliceKeeper against FakeKube."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from vgpud.dra.slicebuild import (
    MIB,
    build_slice,
    device_attributes,
    device_capacity,
    same_slice,
    semver,
    slice_name,
)
from vgpud.dra.slices import SliceError, SliceKeeper, read_pcie_root, read_pcie_roots
from vgpud.gpu import GpuInfo, open_inventory
from vgpud.gpu.mock import PROFILES_DIR
from vgpud.kube import KubeError, NotFound
from vgpud.kube.fake import FakeKube
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

DRIVER = "manager.nvidia.com"
NODE = "node-a"
NODE_UID = "3f1c2a5e-0000-4000-8000-000000000001"
NAME = "node-a-manager-nvidia-com"
A100 = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2.yaml").gpus()
H100 = open_inventory("mock", profile=PROFILES_DIR / "h100-80gb-x8.yaml").gpus()
#: GPU 0 in MIG mode, GPU 1 not
MIG = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2-mig.yaml").gpus()

# The API's own patterns (k8s.io/apimachinery validation, semver.org's regex as resource.k8s.io uses it).
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def build(gpus: list[GpuInfo], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("nri_mode", False)
    return build_slice(driver=DRIVER, node_name=NODE, node_uid=NODE_UID, gpus=gpus, **kwargs)


def device(slice_: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [d for d in slice_["spec"]["devices"] if d["name"] == name]
    return found


def policy(default: int, low: int, high: int, step: int) -> dict[str, Any]:
    return {"default": str(default), "validRange": {"min": str(low), "max": str(high), "step": str(step)}}


# --- builder --------------------------------------------------------------------------------------


def test_a100_slice_exactly() -> None:
    slice_ = build(A100)
    assert slice_["apiVersion"] == "resource.k8s.io/v1"
    assert slice_["kind"] == "ResourceSlice"
    assert slice_["metadata"] == {
        "name": NAME,
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": True}
        ],
    }
    spec = slice_["spec"]
    assert {k: v for k, v in spec.items() if k != "devices"} == {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
    }
    assert [d["name"] for d in spec["devices"]] == ["vgpu-0", "vgpu-1"]
    assert device(slice_, "vgpu-1") == {
        "name": "vgpu-1",
        "attributes": {
            "type": {"string": "vgpu"},
            "uuid": {"string": "gpu-bdad1e16-755f-41d4-985c-16737eb6e907"},
            "minor": {"int": 1},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "550.54.15"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "coreRatio": {"int": 100},
            "memoryRatio": {"int": 100},
            "nriMode": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": "0000:87:00.0"},
            "resource.kubernetes.io/numaNode": {"int": 1},
        },
        "capacity": {
            "cores": {"value": "100", "requestPolicy": policy(100, 0, 100, 1)},
            "memory": {"value": "42949672960", "requestPolicy": policy(42949672960, MIB, 42949672960, MIB)},
        },
        "allowMultipleAllocations": True,
    }


def test_h100_devices_are_named_by_minor_not_index() -> None:
    slice_ = build(H100)
    assert [d["name"] for d in slice_["spec"]["devices"]] == [f"vgpu-{m}" for m in range(8)]
    for gpu in H100:
        attributes = device(slice_, f"vgpu-{gpu.minor}")["attributes"]
        assert attributes["uuid"] == {"string": gpu.uuid.lower()}
        assert attributes["minor"] == {"int": gpu.minor}
    vgpu0 = device(slice_, "vgpu-0")  # NVML index 2
    assert vgpu0["attributes"]["uuid"] == {"string": "gpu-f56befb5-4cfd-4850-9d57-aab70c5b1e0c"}
    assert vgpu0["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:3a:00.0"}
    assert vgpu0["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert vgpu0["attributes"]["architecture"] == {"string": "Hopper"}
    assert vgpu0["capacity"]["memory"]["value"] == "85520809984"


@pytest.mark.parametrize(("ratio", "value", "limit"), [(50, 50, 50), (100, 100, 100), (200, 200, 100)])
def test_cores_ratio(ratio: int, value: int, limit: int) -> None:
    cores = device_capacity(A100[0], cores_ratio=ratio, memory_ratio=100)["cores"]
    assert cores == {"value": str(value), "requestPolicy": policy(limit, 0, limit, 1)}
    assert device_attributes(A100[0], cores_ratio=ratio, memory_ratio=100, nri_mode=False)["coreRatio"] == {
        "int": ratio
    }


def test_memory_ratio_scales_the_value() -> None:
    memory = device_capacity(A100[0], cores_ratio=100, memory_ratio=150)["memory"]
    full = 42949672960 * 3 // 2  # 60 GiB, MiB-aligned
    assert memory == {"value": str(full), "requestPolicy": policy(full, MIB, full, MIB)}
    assert device_attributes(A100[0], cores_ratio=100, memory_ratio=150, nri_mode=False)["memoryRatio"] == {
        "int": 150
    }


@pytest.mark.parametrize("nri_mode", [True, False])
def test_every_device_says_whether_the_node_runs_nri_mode(nri_mode: bool) -> None:
    slice_ = build(H100, nri_mode=nri_mode)
    assert [d["attributes"][NRI_MODE_ATTRIBUTE] for d in slice_["spec"]["devices"]] == [
        {"bool": nri_mode}
    ] * 8
    assert NRI_MODE_ATTRIBUTE == "nriMode", "unqualified: the driver's domain, like `type`"


def test_memory_policy_stays_on_mib_steps_when_the_value_does_not() -> None:
    # 81559 MiB * 1.5 = 122338.5 MiB: the API needs default and max on min + n*step.
    memory = device_capacity(H100[0], cores_ratio=100, memory_ratio=150)["memory"]
    assert memory["value"] == "128281214976"
    assert memory["requestPolicy"] == policy(122338 * MIB, MIB, 122338 * MIB, MIB)


def test_bad_ratios_and_tiny_memory_are_refused() -> None:
    with pytest.raises(ValueError, match="ratios must be >= 1"):
        device_capacity(A100[0], cores_ratio=0, memory_ratio=100)
    with pytest.raises(ValueError, match="too little to share"):
        device_capacity(replace(A100[0], memory_total=MIB), cores_ratio=100, memory_ratio=100)


def test_empty_gpu_list_publishes_an_empty_slice() -> None:
    slice_ = build([])
    assert slice_["spec"]["devices"] == []
    assert slice_["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}


def test_optional_attributes() -> None:
    gpu = replace(A100[0], addressing_mode="HMM", numa_node=None, pci_bus_id="not-a-bdf")
    attributes = device_attributes(
        gpu, cores_ratio=100, memory_ratio=100, nri_mode=False, pcie_root="pci0000:00"
    )
    assert attributes["addressingMode"] == {"string": "HMM"}
    assert attributes["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert "resource.kubernetes.io/numaNode" not in attributes
    assert "resource.kubernetes.io/pciBusID" not in attributes
    long_name = replace(A100[0], product_name="X" * 100)
    assert device_attributes(long_name, cores_ratio=1, memory_ratio=1, nri_mode=False)["productName"] == {
        "string": "X" * 64
    }
    odd = replace(A100[0], driver_version="unknown")
    assert "driverVersion" not in device_attributes(odd, cores_ratio=1, memory_ratio=1, nri_mode=False)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("12.4", "12.4.0"),
        ("9.0", "9.0.0"),
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),  # semver forbids leading zeros
        ("470.82.01.02", "470.82.1+02"),  # a fourth part is build metadata
        ("12", "12.0.0"),
        ("", None),
        ("550.54.15-beta", None),
        ("abc", None),
    ],
)
def test_semver(raw: str, expected: str | None) -> None:
    assert semver(raw) == expected
    assert expected is None or SEMVER.match(expected)


def test_slice_name() -> None:
    assert slice_name(NODE, DRIVER) == NAME
    assert slice_name("Node.Example.COM", DRIVER) == "node.example.com-manager-nvidia-com"
    long_a, long_b = slice_name("a" * 240 + "x", DRIVER), slice_name("a" * 240 + "y", DRIVER)
    assert long_a != long_b
    for name in (long_a, long_b, slice_name("b" * 230 + ".c", DRIVER)):
        assert len(name) <= 253
        assert DNS_SUBDOMAIN.match(name), name
    assert slice_name("a" * 240 + "x", DRIVER) == long_a


def assert_valid_slice(slice_: dict[str, Any]) -> None:
    """The resource.k8s.io/v1 validation rules that the builder's output could break."""
    assert json.loads(json.dumps(slice_)) == slice_
    assert DNS_SUBDOMAIN.match(slice_["metadata"]["name"]) and len(slice_["metadata"]["name"]) <= 253
    devices = slice_["spec"]["devices"]
    assert len(devices) <= 128
    assert len({d["name"] for d in devices}) == len(devices)
    for dev in devices:
        assert DNS_LABEL.match(dev["name"]) and len(dev["name"]) <= 63
        assert len(dev["attributes"]) + len(dev["capacity"]) <= 32
        for name in [*dev["attributes"], *dev["capacity"]]:
            domain, _, ident = name.rpartition("/")
            assert C_IDENTIFIER.match(ident) and len(ident) <= 32, name
            assert not domain or (DNS_SUBDOMAIN.match(domain) and len(domain) <= 63), name
        for value in dev["attributes"].values():
            ((kind, raw),) = value.items()
            assert kind in {"int", "bool", "string", "version"}
            if kind in {"string", "version"}:
                assert len(raw) <= 64
            if kind == "version":
                assert SEMVER.match(raw), raw
        for capacity in dev["capacity"].values():
            value, request = int(capacity["value"]), capacity["requestPolicy"]
            default, valid = int(request["default"]), request["validRange"]
            low, high, step = int(valid["min"]), int(valid["max"]), int(valid["step"])
            assert low <= default <= high <= value
            assert low + step <= value
            assert (default - low) % step == 0 and (high - low) % step == 0


@pytest.mark.parametrize("gpus", [A100, H100, MIG, []], ids=["a100", "h100", "mig", "none"])
def test_shipped_profiles_make_valid_slices(gpus: list[GpuInfo]) -> None:
    assert_valid_slice(build(gpus, pcie_roots={gpu.pci_bus_id: "pci0000:00" for gpu in gpus}))


@given(
    cores=st.integers(1, 1000),
    memory=st.integers(1, 1000),
    total=st.integers(2 * MIB, 1 << 40),
)
def test_any_ratio_and_memory_size_make_a_valid_slice(cores: int, memory: int, total: int) -> None:
    gpu = replace(A100[0], memory_total=total)
    if total * memory // 100 < 2 * MIB:
        return  # refused, see test_bad_ratios_and_tiny_memory_are_refused
    assert_valid_slice(build([gpu], cores_ratio=cores, memory_ratio=memory))


def test_a_gpu_in_mig_mode_is_never_published() -> None:
    assert [d["name"] for d in build(MIG)["spec"]["devices"]] == ["vgpu-1"]
    assert device(build(MIG), "vgpu-1")["attributes"]["uuid"] == {"string": MIG[1].uuid.lower()}
    assert build(MIG, left_out={MIG[1].uuid})["spec"]["devices"] == []
    # a pending MIG mode is no MIG mode yet: the GPU counts by its current one
    assert [
        d["name"] for d in build([replace(MIG[0], mig_mode=False, mig_devices=())])["spec"]["devices"]
    ] == ["vgpu-0"]


def test_read_pcie_root_from_sysfs(tmp_path: Path) -> None:
    device_dir = tmp_path / "devices" / "pci0000:05" / "0000:05:01.0" / "0000:07:00.0"
    device_dir.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    os.symlink(os.path.relpath(device_dir, links), links / "0000:07:00.0")
    os.symlink(os.path.relpath(tmp_path / "elsewhere" / "0000:87:00.0", links), links / "0000:87:00.0")
    assert read_pcie_root("0000:07:00.0", tmp_path) == "pci0000:05"
    assert read_pcie_root("0000:87:00.0", tmp_path) is None  # points outside /sys/devices
    assert read_pcie_root("0000:99:00.0", tmp_path) is None  # no such device
    assert read_pcie_roots(A100, tmp_path) == {"0000:07:00.0": "pci0000:05"}
    slice_ = build(A100, pcie_roots=read_pcie_roots(A100, tmp_path))
    assert device(slice_, "vgpu-0")["attributes"]["resource.kubernetes.io/pcieRoot"] == {
        "string": "pci0000:05"
    }
    assert "resource.kubernetes.io/pcieRoot" not in device(slice_, "vgpu-1")["attributes"]


def test_same_slice_ignores_what_the_server_adds_and_rewrites() -> None:
    ours = build(A100)
    served = json.loads(json.dumps(ours))
    served["metadata"].update(uid="x", resourceVersion="7", managedFields=[{"manager": "vgpud"}])
    served["spec"]["devices"][0]["capacity"]["memory"]["value"] = "40Gi"
    served["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"]["step"] = "1000m"
    served["spec"]["devices"][0]["consumesCounters"] = []
    assert same_slice(served, ours)
    served["spec"]["devices"][1]["attributes"]["brand"] = {"string": "GeForce"}
    assert not same_slice(served, ours)
    assert not same_slice(ours, build(A100, generation=2))
    assert not same_slice(ours, build(A100[:1]))


# --- keeper ---------------------------------------------------------------------------------------


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE, "uid": NODE_UID}})
    return kube


def keeper_for(kube: FakeKube, gpus: list[GpuInfo] = A100, **kwargs: Any) -> SliceKeeper:
    settings: dict[str, Any] = {"cores_ratio": 100, "memory_ratio": 100, "nri_mode": False, "sysfs": None}
    return SliceKeeper(kube, driver=DRIVER, node_name=NODE, gpus=gpus, **(settings | kwargs))


async def start(nursery: trio.Nursery, keeper: SliceKeeper) -> None:
    """Run the keeper; returns once it called ready()."""

    async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await keeper.run(task_status.started)

    await nursery.start(serve)


def stored(kube: FakeKube, name: str = NAME) -> dict[str, Any] | None:
    return next((s for s in kube.slices() if s["metadata"]["name"] == name), None)


async def until(condition: Callable[[], bool]) -> None:
    """Poll (the clock is virtual) for at most 10 s."""
    for _ in range(1000):
        if condition():
            return
        await trio.sleep(0.01)
    pytest.fail("the condition never held")


def other_slice(name: str, *, driver: str = DRIVER, node: str = NODE, generation: int = 1) -> dict[str, Any]:
    body = build([], generation=generation)
    body["metadata"]["name"] = name
    body["spec"].update(driver=driver, nodeName=node)
    return body


async def test_publishes_once_and_calls_ready(kube: FakeKube, autojump_clock: trio.abc.Clock) -> None:
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        served = stored(kube)
        assert served is not None
        assert same_slice(served, build(A100))
        assert served["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
        assert served["metadata"]["managedFields"][0]["manager"] == "vgpud"
        await trio.sleep(1000)  # the ADDED event of our own apply, and three resyncs
        assert kube.calls["apply_resource_slice"] == 1
        assert kube.calls["list_resource_slices"] >= 4
        assert keeper.repairs == 0
        nursery.cancel_scope.cancel()


async def test_deleted_slice_comes_back(
    kube: FakeKube, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        with caplog.at_level(logging.INFO, logger="vgpud.dra.slices"):
            await kube.delete_resource_slice(NAME)  # kubelet at its start
            await until(lambda: stored(kube) is not None)
        assert same_slice(stored(kube) or {}, build(A100))
        assert keeper.repairs == 1
        assert f"ResourceSlice {NAME} deleted by someone: re-created" in caplog.messages
        await trio.sleep(10)
        assert kube.calls["apply_resource_slice"] == 2
        nursery.cancel_scope.cancel()


async def test_altered_spec_is_restored(kube: FakeKube, autojump_clock: trio.abc.Clock) -> None:
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        altered = build(A100)
        altered["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Ti"
        await kube.apply_resource_slice(altered, field_manager="someone")
        await until(lambda: same_slice(stored(kube) or {}, build(A100)))
        assert keeper.repairs == 1
        await trio.sleep(10)
        assert kube.calls["apply_resource_slice"] == 3  # ours, theirs, the repair: no more
        nursery.cancel_scope.cancel()


async def test_stale_slices_of_ours_go_and_foreign_ones_stay(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    for body in (
        other_slice("node-a-vgpu-manager-old", generation=3),  # an older version's name
        other_slice("node-a-other-driver", driver="gpu.example.com"),
        other_slice("node-b-manager-nvidia-com", node="node-b"),
    ):
        await kube.apply_resource_slice(body, field_manager="setup")
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        names = {s["metadata"]["name"] for s in kube.slices()}
        assert names == {NAME, "node-a-other-driver", "node-b-manager-nvidia-com"}
        assert (stored(kube) or {})["spec"]["pool"]["generation"] == 4  # above the leftover's
        assert keeper.repairs == 0  # the first reconcile is publishing, not repairing

        await kube.apply_resource_slice(other_slice("node-a-intruder"), field_manager="someone")
        await kube.apply_resource_slice(
            other_slice("node-a-foreign", driver="x.example.com"), field_manager="x"
        )
        await until(lambda: stored(kube, "node-a-intruder") is None)
        assert stored(kube, "node-a-foreign") is not None
        assert keeper.repairs == 1
        nursery.cancel_scope.cancel()


async def test_the_keeper_publishes_no_mig_gpu_and_warns_once(
    kube: FakeKube, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's slice holds GPU 1 only; one WARNING names GPU 0, not one per session or re-apply."""
    keeper = keeper_for(kube, MIG)
    with caplog.at_level(logging.INFO, logger="vgpud.dra.slices"):
        for _ in range(2):  # the supervisor's restart after an API error is a second session
            async with trio.open_nursery() as nursery:
                await start(nursery, keeper)
                assert [d["name"] for d in (stored(kube) or {})["spec"]["devices"]] == ["vgpu-1"]
                await kube.delete_resource_slice(NAME)  # a repair rebuilds nothing to warn about
                await until(lambda: stored(kube) is not None)
                nursery.cancel_scope.cancel()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"GPU {MIG[0].uuid} (index 0) left out of the ResourceSlice: in MIG mode (4 MIG devices): vgpud "
        'does not share MIG GPUs (see docs/decisions.md, "MIG-mode GPUs are left out of the ResourceSlice")'
    ]
    assert warnings[0].__dict__["gpu"] == MIG[0].uuid
    assert f"ResourceSlice {NAME} published: 1 devices" in caplog.messages


async def test_restart_with_the_same_slice_applies_nothing(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    await kube.apply_resource_slice(build(A100, generation=5), field_manager="vgpud")
    kube.calls.clear()
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper_for(kube))
        await trio.sleep(10)
        assert kube.calls["apply_resource_slice"] == 0
        assert (stored(kube) or {})["spec"]["pool"]["generation"] == 5
        nursery.cancel_scope.cancel()


async def test_restart_with_other_ratios_bumps_the_generation(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    await kube.apply_resource_slice(build(A100, generation=5), field_manager="vgpud")
    keeper = keeper_for(kube, cores_ratio=200)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        assert same_slice(stored(kube) or {}, build(A100, cores_ratio=200, generation=6))
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("before", "after"), [(False, True), (True, False)])
async def test_restart_in_the_other_mode_republishes_the_attribute(
    kube: FakeKube, autojump_clock: trio.abc.Clock, before: bool, after: bool
) -> None:
    await kube.apply_resource_slice(build(A100, nri_mode=before, generation=5), field_manager="vgpud")
    keeper = keeper_for(kube, nri_mode=after)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        stored_now = stored(kube) or {}
        assert same_slice(stored_now, build(A100, nri_mode=after, generation=6))
        assert {d["attributes"]["nriMode"]["bool"] for d in stored_now["spec"]["devices"]} == {after}
        nursery.cancel_scope.cancel()


async def test_a_broken_watch_is_reopened_and_missed_changes_repaired(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        kube.end_watches()
        await kube.delete_resource_slice(NAME)  # nobody is watching: only a fresh list sees it
        await until(lambda: stored(kube) is not None)
        assert kube.calls["watch_resource_slices"] == 2
        assert keeper.repairs == 1
        nursery.cancel_scope.cancel()


async def test_missing_node_is_a_clear_error(autojump_clock: trio.abc.Clock) -> None:
    with pytest.raises(SliceError, match=f"node '{NODE}' does not exist") as caught:
        await keeper_for(FakeKube()).run(lambda: None)
    assert isinstance(caught.value.__cause__, NotFound)


@pytest.mark.parametrize("method", ["apply_resource_slice", "list_resource_slices", "watch_resource_slices"])
async def test_api_errors_end_the_session(
    kube: FakeKube, autojump_clock: trio.abc.Clock, method: str
) -> None:
    kube.fail_next(method, KubeError("the server is down", 503))
    ready: list[bool] = []
    with trio.fail_after(10), pytest.raises(KubeError, match="the server is down"):
        await keeper_for(kube).run(lambda: ready.append(True))
    assert ready == []


async def test_a_watch_error_ends_the_session(kube: FakeKube, autojump_clock: trio.abc.Clock) -> None:
    keeper = keeper_for(kube)

    async def break_watch() -> None:
        await until(lambda: stored(kube) is not None)
        await trio.sleep(1)
        kube.end_watches(KubeError("watch expired", 410))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(break_watch)
            with pytest.raises(KubeError, match="watch expired"):
                await keeper.run(lambda: None)


class StrippingKube(FakeKube):
    """A server without DRAConsumableCapacity: it drops the fields of consumable capacity."""

    async def apply_resource_slice(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        for dev in body["spec"]["devices"]:
            dev.pop("allowMultipleAllocations")
            for capacity in dev["capacity"].values():
                capacity.pop("requestPolicy")
        return await super().apply_resource_slice(body, field_manager=field_manager)


async def test_a_server_that_drops_fields_causes_a_warning_not_a_loop(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kube = StrippingKube()
    kube.add_node({"metadata": {"name": NODE, "uid": NODE_UID}})
    keeper = keeper_for(kube)
    async with trio.open_nursery() as nursery:
        with caplog.at_level(logging.WARNING, logger="vgpud.dra.slices"):
            await start(nursery, keeper)
            await trio.sleep(1000)
        assert kube.calls["apply_resource_slice"] == 1
        assert keeper.repairs == 0
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
            f"ResourceSlice {NAME}: the API server does not keep it as sent (is the DRAConsumableCapacity "
            "feature gate on?): vGPU sharing will not work"
        ]
        await kube.delete_resource_slice(NAME)
        await until(lambda: stored(kube) is not None)
        assert keeper.repairs == 1
        nursery.cancel_scope.cancel()

"""Device health in the ResourceSlice: the taint a sick GPU gets (shape, API rules), and SliceKeeper
following the health board against FakeKube: tainted, restored, left out on a server that drops taints,
untouched without a board (the NVMLDeviceHealthCheck gate off)."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

import pytest
import trio

from tests.unit.dra.test_slices import (
    A100,
    DRIVER,
    H100,
    NAME,
    NODE,
    NODE_UID,
    build,
    device,
    keeper_for,
    start,
    stored,
    until,
)
from vgpud.dra.slicebuild import (
    device_names,
    same_slice,
    taint_key,
    taint_value,
    unhealthy_taint,
)
from vgpud.gpu.health import DeviceHealth, HealthBoard
from vgpud.kube.fake import FakeKube

# k8s.io/apimachinery: a label value, and the RFC 3339 form the server renders a metav1.Time in
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
GPU0, GPU1 = A100[0].uuid, A100[1].uuid
#: 2026-12-01T10:00:00Z
SINCE = 1796119200.0
XID79 = DeviceHealth(GPU0, healthy=False, reason="XID 79: GPU has fallen off the bus", since=SINCE, xid=79)


def taint(value: str) -> dict[str, str]:
    return {
        "key": f"{DRIVER}/unhealthy",
        "value": value,
        "effect": "NoSchedule",
        "timeAdded": "2026-12-01T10:00:00Z",
    }


def taints_of(slice_: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """Device name -> its taints (every device, [] when it has none)."""
    assert slice_ is not None
    return {d["name"]: d.get("taints", []) for d in slice_["spec"]["devices"]}


def generation_of(slice_: dict[str, Any] | None) -> int:
    assert slice_ is not None
    return int(slice_["spec"]["pool"]["generation"])


# --- the taint ------------------------------------------------------------------------------------


def test_the_taint_of_an_xid() -> None:
    assert unhealthy_taint(DRIVER, XID79) == taint("xid-79")
    assert taint_key(DRIVER) == "manager.nvidia.com/unhealthy"


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("GPU lost: nvmlDeviceGetHandleByUUID returned NVML_ERROR_GPU_IS_LOST", "gpu-lost"),
        ("  Double-bit ECC error!  ", "double-bit-ecc-error"),
        ("---", "unhealthy"),
        ("", "unhealthy"),
        ("é" * 10, "unhealthy"),
        ("x" * 100 + ": why", "x" * 63),
        ("a" * 62 + " b", "a" * 62),  # cut at 63 would end on "-": trimmed to a valid value
    ],
)
def test_a_reason_without_xid_becomes_a_valid_label_value(reason: str, value: str) -> None:
    health = DeviceHealth(GPU0, healthy=False, reason=reason, since=SINCE)
    assert taint_value(health) == value
    assert LABEL_VALUE.match(value) and len(value) <= 63


def test_time_added_is_whole_seconds_in_rfc3339() -> None:
    added = unhealthy_taint(DRIVER, DeviceHealth(GPU0, healthy=False, reason="x", since=SINCE + 0.9))
    assert added["timeAdded"] == "2026-12-01T10:00:00Z" and TIME.match(added["timeAdded"])


def test_device_names_follow_the_minor_in_slice_order() -> None:
    names = device_names(list(reversed(H100)))
    assert list(names.values()) == [f"vgpu-{gpu.minor}" for gpu in sorted(H100, key=lambda g: g.minor)]
    assert [d["name"] for d in build(H100)["spec"]["devices"]] == list(names.values())


def test_a_tainted_device_keeps_its_place_and_everything_else() -> None:
    plain = build(A100)
    tainted = build(A100, taints={GPU0: taint("xid-79")})
    assert device(tainted, "vgpu-0")["taints"] == [taint("xid-79")]
    assert "taints" not in device(tainted, "vgpu-1") and "taints" not in device(plain, "vgpu-0")
    without = copy.deepcopy(tainted)
    del without["spec"]["devices"][0]["taints"]
    assert without == plain


def test_a_left_out_device_leaves_the_others_as_they_were() -> None:
    plain = build(A100)
    left = build(A100, left_out={GPU0})
    assert left["spec"]["devices"] == plain["spec"]["devices"][1:]
    assert [d["name"] for d in left["spec"]["devices"]] == ["vgpu-1"]


def test_same_slice_sees_every_taint_change() -> None:
    tainted = build(A100, taints={GPU0: taint("xid-79")})
    assert same_slice(tainted, copy.deepcopy(tainted))
    assert not same_slice(build(A100), tainted), "a taint added"
    assert not same_slice(tainted, build(A100)), "a taint removed"
    assert not same_slice(tainted, build(A100, taints={GPU0: taint("xid-48")})), "another value"
    assert not same_slice(tainted, build(A100, taints={GPU1: taint("xid-79")})), "another device"
    later = dict(taint("xid-79"), timeAdded="2026-12-01T10:00:01Z")
    assert not same_slice(tainted, build(A100, taints={GPU0: later})), "another time"
    noexecute = dict(taint("xid-79"), effect="NoExecute")
    assert not same_slice(tainted, build(A100, taints={GPU0: noexecute})), "another effect"


# --- the keeper -----------------------------------------------------------------------------------


@pytest.fixture
def kube() -> FakeKube:
    kube = FakeKube()
    kube.add_node({"metadata": {"name": NODE, "uid": NODE_UID}})
    return kube


async def test_a_sick_device_is_tainted_and_restored(
    kube: FakeKube, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    board = HealthBoard([GPU0, GPU1])
    keeper = keeper_for(kube, health=board)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        assert taints_of(stored(kube)) == {"vgpu-0": [], "vgpu-1": []}
        first = generation_of(stored(kube))

        with caplog.at_level(logging.INFO, logger="vgpud.dra.slices"):
            board.update(XID79)
            await until(lambda: taints_of(stored(kube))["vgpu-0"] != [])
        assert taints_of(stored(kube)) == {"vgpu-0": [taint("xid-79")], "vgpu-1": []}
        assert generation_of(stored(kube)) == first + 1, "a new pool content, a new generation"
        assert f"ResourceSlice {NAME} device health changed: vgpu-0 tainted xid-79" in caplog.messages
        assert keeper.repairs == 0, "following the board is publishing, not repairing"

        await trio.sleep(1000)  # our own MODIFIED event and resyncs: nothing more to apply
        assert kube.calls["apply_resource_slice"] == 2

        board.update(DeviceHealth(GPU0, healthy=True, since=SINCE + 60))
        await until(lambda: taints_of(stored(kube))["vgpu-0"] == [])
        assert same_slice(stored(kube) or {}, build(A100, generation=first + 2))
        nursery.cancel_scope.cancel()


async def test_a_device_sick_at_start_is_published_tainted(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    board = HealthBoard([GPU0, GPU1])
    board.update(XID79)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper_for(kube, health=board))
        assert taints_of(stored(kube)) == {"vgpu-0": [taint("xid-79")], "vgpu-1": []}
        assert kube.calls["apply_resource_slice"] == 1
        nursery.cancel_scope.cancel()


async def test_a_removed_taint_is_put_back(kube: FakeKube, autojump_clock: trio.abc.Clock) -> None:
    board = HealthBoard([GPU0, GPU1])
    board.update(XID79)
    keeper = keeper_for(kube, health=board)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        altered = stored(kube)
        assert altered is not None
        del altered["spec"]["devices"][0]["taints"]
        await kube.apply_resource_slice(altered, field_manager="someone")
        await until(lambda: taints_of(stored(kube))["vgpu-0"] == [taint("xid-79")])
        assert keeper.repairs == 1
        nursery.cancel_scope.cancel()


async def test_a_burst_of_changes_ends_in_the_last_state(
    kube: FakeKube, autojump_clock: trio.abc.Clock
) -> None:
    board = HealthBoard([GPU0, GPU1])
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper_for(kube, health=board))
        board.update(XID79)
        board.update(DeviceHealth(GPU1, healthy=False, reason="GPU lost: gone", since=SINCE))
        board.update(DeviceHealth(GPU0, healthy=True, since=SINCE))
        await trio.sleep(10)
        assert taints_of(stored(kube)) == {"vgpu-0": [], "vgpu-1": [taint("gpu-lost")]}
        nursery.cancel_scope.cancel()


async def test_without_a_board_nothing_is_tainted(kube: FakeKube, autojump_clock: trio.abc.Clock) -> None:
    """The gate off: the daemon passes no board, and a board changing elsewhere changes nothing."""
    board = HealthBoard([GPU0, GPU1])
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper_for(kube))
        board.update(XID79)
        await trio.sleep(1000)
        assert same_slice(stored(kube) or {}, build(A100))
        assert kube.calls["apply_resource_slice"] == 1
        nursery.cancel_scope.cancel()


class TaintlessKube(FakeKube):
    """A server with DRADeviceTaints off: it drops the taints of every device, as 1.36 does."""

    async def apply_resource_slice(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
        body = copy.deepcopy(body)
        for dev in body["spec"]["devices"]:
            dev.pop("taints", None)
        return await super().apply_resource_slice(body, field_manager=field_manager)


async def test_a_server_that_drops_taints_gets_the_sick_device_left_out(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    kube = TaintlessKube()
    kube.add_node({"metadata": {"name": NODE, "uid": NODE_UID}})
    board = HealthBoard([GPU0, GPU1])
    keeper = keeper_for(kube, health=board)
    async with trio.open_nursery() as nursery:
        await start(nursery, keeper)
        first = generation_of(stored(kube))
        with caplog.at_level(logging.INFO, logger="vgpud.dra.slices"):
            board.update(XID79)
            await until(lambda: len((stored(kube) or {})["spec"]["devices"]) == 1)
            assert keeper.leaves_out_sick
            assert same_slice(stored(kube) or {}, build(A100, left_out={GPU0}, generation=first + 2))
            await trio.sleep(1000)
            board.update(DeviceHealth(GPU1, healthy=False, reason="GPU lost: gone", since=SINCE))
            await until(lambda: (stored(kube) or {})["spec"]["devices"] == [])
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"ResourceSlice {NAME}: the API server drops device taints (is the DRADeviceTaints feature "
            "gate on?): unhealthy devices are left out of the slice instead"
        ], "said once"
        assert f"ResourceSlice {NAME} device health changed: vgpu-0 left out (xid-79)" in caplog.messages

        board.update(DeviceHealth(GPU0, healthy=True, since=SINCE))
        board.update(DeviceHealth(GPU1, healthy=True, since=SINCE))
        await until(lambda: len((stored(kube) or {})["spec"]["devices"]) == 2)
        assert same_slice(stored(kube) or {}, build(A100, generation=generation_of(stored(kube))))
        assert keeper.repairs == 0
        nursery.cancel_scope.cancel()

"""What the state document shows, section by section, and where it reads it from: the NRI session and
the node's containers as the hooks heard them (the injected ones, and every one with a claim UID),
eager partitions, unused register UUIDs; and the call filter shared by the routes, the stream and the
CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from tests import objects as o
from tests.draharness import REF, single_container_claim
from tests.unit.hotplug.world import CLAIMS, KEY, Access, Targets
from tests.unit.nri.fakeruntime import fake_runtime, injected
from tests.unit.observe.node import make_node
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    CreateContainerRequest,
    PodSandbox,
    RemoveContainerRequest,
    StopPodSandboxRequest,
    SynchronizeRequest,
)
from vgpud.containers.record import Injection
from vgpud.dra.claimindex import ClaimRef
from vgpud.hotplug.node import HotPlug
from vgpud.hotplug.rules import Attachment, AttachState
from vgpud.hotplug.service import HotPlugService
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore
from vgpud.hotplug.table import AttachmentTable
from vgpud.nri.conn import Identity, SessionEnded, run_session
from vgpud.nri.sync import decode_sync
from vgpud.observe.filters import CallFilter
from vgpud.observe.state import hotplug_json, register_uuids_json
from vgpud.recorder import HookCall

NS = o.NAMESPACE
POD = PodSandbox(id="sb", name="train", namespace=NS, uid=o.POD1_UID)


def ctr(name: str, claim: str | None = o.CLAIM_UID) -> Container:
    env = [f"MANAGER_VGPU_CLAIM_UID={claim}"] if claim else ["A=1"]
    return Container(id=f"id-{name}", pod_sandbox_id="sb", name=name, env=env)


async def prepared_lazy_node(root: Path):  # type: ignore[no-untyped-def]
    node = make_node(root)
    claim, pod = single_container_claim()
    node.harness.kube.add_claim(claim)
    node.harness.kube.add_pod(pod)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    return node


async def test_lazy_state_maps_directories_to_containers(short_tmp: Path) -> None:
    node = await prepared_lazy_node(short_tmp)
    old = injected(node.nri.assigner, POD, ctr("old"))
    sync = SynchronizeRequest(pods=[POD], containers=[old, ctr("plain", None)])
    await node.nri.synchronize(decode_sync(bytes(sync)))
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=ctr("main")))
    state = json.loads(json.dumps(await node.state.snapshot(calls=5)))  # JSON-ready as a whole

    nri = state["nri"]
    directories = nri["cache"]["directories"]
    base = Path(node.harness.layout.claim_dir(o.CLAIM_UID))
    assert directories == {
        str(base / f"{o.POD1_UID}_{name}"): {
            "pod_uid": o.POD1_UID,
            "container": name,
            "claim_uid": o.CLAIM_UID,
            "pod_namespace": NS,
            "pod_name": "train",
            "container_ids": [f"id-{name}"],
        }
        for name in ("main", "old")
    }
    assert nri["cache"] == {"synced": True, "entries": 2, "directories": directories}
    assert nri["not_injected"] == {}
    assert nri["runtime_containers"] == 2
    assert nri["stats"]["injected"] == 1 and nri["stats"]["sync_reported"] == 2
    assert state["partitions"] is None and state["register_uuids"] is None
    assert state["claim_modes"] == {"current": "lazy", "mismatches": [], "unrecorded": []}
    assert [c["call"] for c in state["calls"]["recent"]] == ["Prepare", "Synchronize", "CreateContainer"]
    assert state["calls"]["last_seq"] == 3
    assert set(state) == {
        "node",
        "version",
        "python",
        "mode",
        "nri_fallback",
        "time",
        "healthy",
        "claim_modes",
        "prepare_refusals",
        "components",
        "nri",
        "gpus",
        "excluded_gpus",
        "partitions",
        "partition_conflicts",
        "partition_errors",
        "register_uuids",
        "drift",
        "device_health",
        "usage",
        "hotplug",
        "stream",
        "calls",
    }
    assert state["hotplug"] is None  # not served


async def test_the_runtime_view_follows_sync_and_events(short_tmp: Path) -> None:
    node = await prepared_lazy_node(short_tmp)
    other_pod = PodSandbox(id="sb2", name="other", namespace=NS, uid=o.POD2_UID)
    sync = SynchronizeRequest(
        pods=[POD, other_pod],
        containers=[
            ctr("a"),
            ctr("plain", None),
            Container(id="x", pod_sandbox_id="sb2", name="b", env=ctr("b").env),
        ],
    )
    await node.nri.synchronize(decode_sync(bytes(sync)))
    store = node.nri.containers
    assert [c.key for c in store.select()] == sorted([(o.POD1_UID, "a"), (o.POD2_UID, "b")])
    forged = PodSandbox(id="sb3", name="forger", namespace="elsewhere", uid="u3")
    await node.nri.create_container(CreateContainerRequest(pod=forged, container=ctr("c")))
    found = store.newest("u3", "c")
    assert found is not None
    assert (found.pod_uid, found.name, found.claim_uid, found.pod_namespace, found.pod_name) == (
        "u3",
        "c",
        o.CLAIM_UID,
        "elsewhere",
        "forger",
    )
    assert found.injection is Injection.REFUSED  # rejected: another namespace's claim
    assert store.injected("u3", "c") is None
    await node.nri.remove_container(RemoveContainerRequest(pod=POD, container=ctr("a")))
    await node.nri.stop_pod_sandbox(StopPodSandboxRequest(pod=other_pod))
    assert [c.key for c in store.select()] == [("u3", "c")]


async def test_session_state_and_connection_closes(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    socket_path = short_tmp / "nri.sock"
    ready = trio.Event()
    async with fake_runtime(socket_path) as plugins, trio.open_nursery() as nursery:

        async def session() -> None:
            with pytest.raises(SessionEnded):
                await run_session(str(socket_path), node.nri, Identity("manager.nvidia.com", "00"), ready.set)

        nursery.start_soon(session)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            await runtime.handshake(runtime_version="1.7.24", NRI_version="v0.6.1")
            await ready.wait()
        state = node.nri.session_state()
        assert (state.connected, state.runtime, state.nri_version) == (True, "fake 1.7.24", "v0.6.1")
        assert state.synchronized and state.sessions == 1 and state.last_sync_time is not None
        await runtime.stream.aclose()
    state = node.nri.session_state()
    assert not state.connected and state.last_close == "the runtime closed the connection"
    assert node.nri.stats.connection_closes == 1


def test_register_uuids_issued_and_unconsumed() -> None:
    a, b = ClaimRef("ns", "claim-a", "a"), ClaimRef("ns", "claim-b", "b")
    issued = {"u1": a, "u2": a, "u3": b}
    assert register_uuids_json(issued, frozenset({"u2", "gone"})) == {
        "issued": 3,
        "consumed": 1,
        "unconsumed": {
            "u1": {"claim_uid": "claim-a", "namespace": "ns", "name": "a"},
            "u3": {"claim_uid": "claim-b", "namespace": "ns", "name": "b"},
        },
    }


async def test_eager_client_mode_lists_partitions_and_register_uuids(short_tmp: Path) -> None:
    node = make_node(short_tmp, lazy=False, client_mode=True)
    claim, pod = single_container_claim()
    node.harness.kube.add_claim(claim)
    node.harness.kube.add_pod(pod)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    state = await node.state.snapshot()
    assert state["nri"] is None and state["partition_conflicts"] == [] and state["partition_errors"] == []
    ((name, partition),) = state["partitions"].items()
    uuid = partition["register_uuid"]
    assert name == f"{o.CLAIM_UID}/{partition['key']}"
    assert partition["containers"] == [f"{o.POD1_UID}/app/main"] and partition["requests"] == ["r1"]
    assert Path(partition["directory"]).is_dir()
    assert state["register_uuids"]["unconsumed"] == {
        uuid: {"claim_uid": o.CLAIM_UID, "namespace": NS, "name": "gpu-claim"}
    }
    node.registry.service._consumed_uuid(uuid)  # type: ignore[union-attr]  # what a registration does
    assert (await node.state.snapshot())["register_uuids"]["unconsumed"] == {}


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        ("", [1, 2, 3, 4]),
        ("hook=createcontainer", [1, 2]),
        ("component=DRA", [3, 4]),
        ("pod=uid-1", [1]),
        ("pod=train", [1, 2]),
        ("pod=ml/train", [1, 2]),
        ("pod=other/train", []),
        ("claim=c1&outcome=error", [4]),
        ("hook=Prepare&claim=c1", [3]),
    ],
)
def test_call_filter(query: str, matches: list[int]) -> None:
    calls = [
        HookCall(
            seq=1,
            component="nri",
            call="CreateContainer",
            pod_uid="uid-1",
            pod_name="train",
            pod_namespace="ml",
        ),
        HookCall(
            seq=2,
            component="nri",
            call="CreateContainer",
            pod_uid="uid-2",
            pod_name="train",
            pod_namespace="ml",
        ),
        HookCall(seq=3, component="dra", call="Prepare", claim_uid="c1"),
        HookCall(seq=4, component="dra", call="Unprepare", claim_uid="c1", outcome="error"),
    ]
    where = CallFilter.from_query(query)
    assert [c.seq for c in calls if where(c)] == matches
    assert CallFilter.from_query(where.to_query()) == where
    assert bool(where) == bool(query)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("colour=blue", "unknown parameter 'colour'"),
        ("hook=a&hook=b", "given 2 times"),
        ("outcome=fine", "is not one of"),
    ],
)
def test_call_filter_refuses(query: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CallFilter.from_query(query)


async def test_hotplug_section_lists_each_attachment_with_its_state(short_tmp: Path) -> None:
    table = AttachmentTable(AttachmentStore(short_tmp / HOTPLUG_FILE, "boot"))
    attachment = Attachment(KEY, "c" * 64, "team", "trainer", CLAIMS, 5.0)
    await table.put(replace(attachment, state=AttachState.DETACHING))
    service = HotPlugService(
        table=table,
        targets=Targets(),
        claims=lambda pod: (),
        prepared=lambda uid: True,
        access=Access(),
        recorder=make_node(short_tmp).recorder,
    )
    state = hotplug_json(HotPlug(service, short_tmp / "hotplug.sock"))
    assert state["socket"] == str(short_tmp / "hotplug.sock")
    (row,) = state["attachments"]
    assert (row["containerId"], row["targetPodName"], row["state"]) == ("c" * 64, "trainer", "detaching")
    assert [c["devices"] for c in row["claims"]] == [["vgpu-0"]]
    json.dumps(state)  # JSON-ready

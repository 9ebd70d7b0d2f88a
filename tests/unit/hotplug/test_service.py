"""The hot-plug API end to end over its root-only unix socket: grpcio clients (an independent gRPC
stack, classes from protoc) against `HotPlugService` served by vgpud's gRPC stack, with the real
attachment table and file. The runtime's containers and the device step are the two inputs the
service takes from its caller; here they are a table of containers and a recorder of grants."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trio
import trio_asyncio

from tests import hotplugclient
from tests.unit.hotplug.world import CLAIM, CLAIMS, OTHER_SLAVE, RUNNING, SLAVE, TARGET, Access, Targets
from vgpud.grpcserve import serve
from vgpud.hotplug.rules import AttachKey, Attachment, AttachState, SlaveClaim
from vgpud.hotplug.service import MAX_MESSAGE, HotPlugService
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore, StoreError
from vgpud.hotplug.table import AttachmentTable
from vgpud.recorder import Outcome, Recorder
from vgpud.sockpath import SocketPathError

SERVICE = hotplugclient.SERVICE
BOOT = "boot-1"


@dataclass
class Node:
    path: Path
    service: HotPlugService
    targets: Targets
    access: Access
    recorder: Recorder
    claims: dict[str, tuple[SlaveClaim, ...]]
    #: the claim UIDs prepared on this node
    prepared: set[str]

    def call(self, method: str, timeout: float = 10, **fields: str) -> tuple[grpc.StatusCode, str, object]:
        return hotplugclient.call(self.path, method, timeout, **fields)

    async def acall(self, method: str, **fields: str) -> tuple[grpc.StatusCode, str, object]:
        return await trio.to_thread.run_sync(lambda: self.call(method, **fields))


REQUEST = {"target_pod_uid": TARGET, "container_name": "app", "slave_pod_uid": SLAVE}


def make_service(plugin_dir: Path, *, claims: dict[str, tuple[SlaveClaim, ...]] | None = None) -> Node:
    targets = Targets(known={(TARGET, "app"): RUNNING})
    access, recorder = Access(), Recorder()
    by_pod = {SLAVE: CLAIMS} if claims is None else claims
    lookup: Callable[[str], Iterable[SlaveClaim]] = lambda pod: by_pod.get(pod, ())  # noqa: E731
    prepared = {c.uid for claims in by_pod.values() for c in claims}
    service = HotPlugService(
        table=AttachmentTable(FlakyStore(plugin_dir / HOTPLUG_FILE, BOOT)),
        targets=targets,
        claims=lookup,
        prepared=prepared.__contains__,
        access=access,
        recorder=recorder,
        clock=lambda: 42.0,
    )
    return Node(plugin_dir / "hotplug.sock", service, targets, access, recorder, by_pod, prepared)


class FlakyStore(AttachmentStore):
    """The real file store; `fail_saves` numbers the saves (1 = the next) that fail as a full disk would."""

    fail_saves: set[int]
    saves = 0

    def save(self, attachments: Mapping[AttachKey, Attachment]) -> None:
        self.saves += 1
        if self.saves in getattr(self, "fail_saves", set()):
            raise StoreError(f"cannot write {self.path}: no space left on device (save {self.saves})")
        super().save(attachments)


def fail_saves(node: Node, *numbers: int) -> None:
    """Make the table's next saves with these numbers (1: the next one) fail."""
    store = node.service.table.store
    assert isinstance(store, FlakyStore)
    store.fail_saves = {store.saves + n for n in numbers}


@asynccontextmanager
async def serving(node: Node) -> AsyncIterator[Node]:
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await node.service.table.load()
        ready = trio.Event()
        nursery.start_soon(
            lambda: serve([node.service], path=node.path, private=True, ready=lambda _: ready.set())
        )
        await ready.wait()
        yield node
        nursery.cancel_scope.cancel()


@pytest.fixture
def node(short_tmp: Path) -> Node:
    return make_service(short_tmp)


async def test_attach_list_detach_and_idempotency(node: Node) -> None:
    async with serving(node):
        assert stat.S_IMODE(os.lstat(node.path).st_mode) == 0o600  # root-only
        code, _, reply = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.OK and not reply.already_attached
        a = reply.attachment
        assert (a.target_pod_uid, a.container_name, a.slave_pod_uid, a.container_id) == (
            TARGET,
            "app",
            SLAVE,
            "c" * 64,
        )
        assert (a.target_pod_namespace, a.target_pod_name, a.attached_at) == ("team", "trainer", 42.0)
        assert [(c.namespace, c.name, c.uid, list(c.devices)) for c in a.claims] == [
            ("team", "slave-gpu", CLAIM, ["vgpu-0"])
        ]
        assert node.access.log == [("grant", "c" * 64)]

        code, _, again = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.OK and again.already_attached and again.attachment == a
        assert node.access.log == [("grant", "c" * 64)]  # nothing done twice

        code, _, listed = await node.acall("List")
        assert code is grpc.StatusCode.OK and list(listed.attachments) == [a]

        code, _, detached = await node.acall("Detach", **REQUEST)
        assert code is grpc.StatusCode.OK and detached.attachment == a
        assert node.access.log == [("grant", "c" * 64), ("revoke", "c" * 64)]
        code, details, _ = await node.acall("Detach", **REQUEST)
        assert code is grpc.StatusCode.NOT_FOUND
        assert details == f"slave pod {SLAVE} is not attached to container app of pod {TARGET}"
        code, _, listed = await node.acall("List")
        assert list(listed.attachments) == []
    assert not node.path.exists()

    calls = [(c.call, c.outcome, c.pod_uid, c.container, c.claim_uid) for c in node.recorder.recent()]
    assert calls == [
        ("Attach", Outcome.OK, TARGET, "app", CLAIM),
        ("Attach", Outcome.OK, TARGET, "app", CLAIM),
        ("Detach", Outcome.OK, TARGET, "app", CLAIM),
        ("Detach", Outcome.REJECTED, TARGET, "app", ""),
    ]
    details = [c.detail for c in node.recorder.recent()]
    assert details[1].startswith(f"slave pod {SLAVE}: already attached: claim team/slave-gpu")
    assert details[3].startswith("NOT_FOUND: ")
    assert {c.component for c in node.recorder.recent()} == {"hotplug"}
    assert node.recorder.recent()[0].pod_namespace == "team"


async def test_refusals_reach_the_caller_with_their_status(node: Node) -> None:
    node.targets.known[(TARGET, "stopped")] = RUNNING._replace(name="stopped", running=False, pid=0)
    async with serving(node):
        cases = [
            ({**REQUEST, "target_pod_uid": "nope"}, grpc.StatusCode.INVALID_ARGUMENT, "not a pod UID"),
            ({**REQUEST, "container_name": ""}, grpc.StatusCode.INVALID_ARGUMENT, "container_name is empty"),
            ({**REQUEST, "container_name": "gone"}, grpc.StatusCode.NOT_FOUND, "container gone of pod"),
            ({**REQUEST, "container_name": "stopped"}, grpc.StatusCode.FAILED_PRECONDITION, "not running"),
            (
                {**REQUEST, "slave_pod_uid": OTHER_SLAVE},
                grpc.StatusCode.FAILED_PRECONDITION,
                f"slave pod {OTHER_SLAVE} has no vGPU claim prepared on this node",
            ),
        ]
        for fields, status, text in cases:
            code, details, _ = await node.acall("Attach", **fields)
            assert (code, text in details) == (status, True), (fields, code, details)
        node.targets.synced, node.targets.known = False, {}
        code, details, _ = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.UNAVAILABLE and "retry" in details
    assert node.access.log == []
    assert [c.outcome for c in node.recorder.recent()] == [Outcome.REJECTED] * 5 + [Outcome.ERROR]
    assert not (node.path.parent / HOTPLUG_FILE).exists()  # nothing was ever recorded


async def test_oversize_and_malformed_requests(node: Node) -> None:
    async with serving(node):
        code, details, _ = await node.acall("Attach", **{**REQUEST, "container_name": "x" * MAX_MESSAGE})
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and f"limit of {MAX_MESSAGE}" in details

        def raw(payload: bytes) -> tuple[grpc.StatusCode, str]:
            with grpc.insecure_channel(f"unix://{node.path}") as channel:
                stub = channel.unary_unary(SERVICE + "Detach")  # bytes in, bytes out
                try:
                    stub(payload, timeout=10)
                except grpc.RpcError as err:
                    return err.code(), err.details() or ""
            return grpc.StatusCode.OK, ""

        code, details = await trio.to_thread.run_sync(raw, b"\x0a\xff")  # a field longer than the message
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "malformed DetachRequest" in details
    recorded = [(c.call, c.outcome, c.detail.split(":")[0]) for c in node.recorder.recent()]
    assert recorded == [
        ("Attach", Outcome.REJECTED, "RESOURCE_EXHAUSTED"),
        ("Detach", Outcome.REJECTED, "INVALID_ARGUMENT"),
    ]


async def test_a_failed_grant_changes_nothing_and_names_the_step(node: Node) -> None:
    node.access.fail.add("grant")
    async with serving(node):
        code, details, _ = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.INTERNAL
        assert details.startswith(f"attach of container app of pod {TARGET} (slave pod {SLAVE}) failed at ")
        assert "device cgroup rule: grant refused by the test" in details
        _, _, listed = await node.acall("List")
        assert list(listed.attachments) == []
        code, _, _ = await node.acall("Attach", **REQUEST)  # the retry works
        assert code is grpc.StatusCode.OK
    assert node.recorder.recent()[0].outcome is Outcome.ERROR


async def test_a_failed_first_record_changes_nothing(node: Node) -> None:
    async with serving(node):
        (node.path.parent / HOTPLUG_FILE).mkdir()  # the table's file cannot be written
        code, details, _ = await node.acall("Attach", **REQUEST)
    assert code is grpc.StatusCode.INTERNAL
    assert "recording it failed" in details and details.endswith("nothing changed")
    assert node.access.log == []
    assert node.service.table.attachments == {}


async def test_a_failed_final_record_rolls_the_grant_back(node: Node) -> None:
    async with serving(node):
        fail_saves(node, 2)  # the record as attaching is written, the record as attached is not
        code, details, _ = await node.acall("Attach", **REQUEST)
    assert code is grpc.StatusCode.INTERNAL
    assert "granted, but recording it as done failed" in details
    assert details.endswith("the grant was rolled back; nothing stays of it")
    assert node.access.log == [("grant", "c" * 64), ("revoke", "c" * 64)]
    assert node.service.table.attachments == {}


async def test_a_failed_revoke_keeps_the_attachment(node: Node) -> None:
    async with serving(node):
        assert (await node.acall("Attach", **REQUEST))[0] is grpc.StatusCode.OK
        node.access.fail.add("revoke")
        code, details, _ = await node.acall("Detach", **REQUEST)
        assert code is grpc.StatusCode.INTERNAL
        assert details.endswith("still attached (the previous attachment stays as it was)")
        assert [a.state for a in node.service.table.attachments.values()] == [AttachState.ATTACHED]
        assert (await node.acall("Detach", **REQUEST))[0] is grpc.StatusCode.OK


async def test_a_restarted_target_is_granted_again(node: Node) -> None:
    async with serving(node):
        await node.acall("Attach", **REQUEST)
        node.targets.known[(TARGET, "app")] = RUNNING._replace(container_id="d" * 64)
        code, _, reply = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.OK and not reply.already_attached
        assert reply.attachment.container_id == "d" * 64
    assert node.access.log == [("grant", "c" * 64), ("revoke", "c" * 64), ("grant", "d" * 64)]


async def test_a_restarted_target_whose_new_grant_fails_keeps_no_stale_record(node: Node) -> None:
    async with serving(node):
        await node.acall("Attach", **REQUEST)
        node.targets.known[(TARGET, "app")] = RUNNING._replace(container_id="d" * 64)
        node.access.fail.add("grant")
        code, details, _ = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.INTERNAL
        assert details.endswith("grant refused by the test; nothing stays of it")
        _, _, listed = await node.acall("List")
        assert list(listed.attachments) == []
    assert node.access.log == [("grant", "c" * 64), ("revoke", "c" * 64)]


async def test_the_table_survives_a_restart(short_tmp: Path) -> None:
    first = make_service(short_tmp)
    async with serving(first):
        assert (await first.acall("Attach", **REQUEST))[0] is grpc.StatusCode.OK
    second = make_service(short_tmp)
    async with serving(second):
        _, _, listed = await second.acall("List")
        assert [a.slave_pod_uid for a in listed.attachments] == [SLAVE]
        assert [a["slavePodUid"] for a in second.service.debug_state()] == [SLAVE]
        _, _, reply = await second.acall("Attach", **REQUEST)
        assert reply.already_attached  # known after the restart: not granted twice
        assert (await second.acall("Detach", **REQUEST))[0] is grpc.StatusCode.OK
    assert second.access.log == [("revoke", "c" * 64)]
    assert second.service.debug_state() == []


async def test_something_else_at_the_socket_path_is_refused(short_tmp: Path) -> None:
    node = make_service(short_tmp)
    precious = short_tmp / "precious"
    precious.write_text("keep me")
    node.path.symlink_to(precious)
    with pytest.raises(ExceptionGroup) as info:
        async with serving(node):
            pass
    assert info.group_contains(SocketPathError, match="is not a socket", depth=None)
    assert node.path.is_symlink() and precious.read_text() == "keep me"


async def test_a_stale_socket_is_replaced(short_tmp: Path) -> None:
    node = make_service(short_tmp)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(node.path))
    async with serving(node):
        assert (await node.acall("List"))[0] is grpc.StatusCode.OK


# -- reconcile: a half-done change is finished, a record of what is gone is dropped ------------------


async def test_a_crash_between_record_and_grant_is_finished_by_reconcile(node: Node) -> None:
    async with serving(node):
        node.access.fail.add("grant")
        fail_saves(node, 2)  # the rollback's removal fails too: the record stays as attaching
        code, details, _ = await node.acall("Attach", **REQUEST)
        assert code is grpc.StatusCode.INTERNAL and "vgpud finishes it when it next reconciles" in details
        assert [a.state for a in node.service.table.attachments.values()] == [AttachState.ATTACHING]
        await node.service.reconcile()
        assert [a.state for a in node.service.table.attachments.values()] == [AttachState.ATTACHED]
        await node.service.reconcile()  # nothing left to do
    assert node.access.log == [("grant", "c" * 64)]
    recorded = [(c.call, c.outcome, c.detail) for c in node.recorder.recent()][1:]
    assert recorded == [("Reconcile", Outcome.OK, f"slave pod {SLAVE}: grant: an attach was cut short")]


async def test_a_cut_short_detach_is_finished_by_reconcile(node: Node) -> None:
    async with serving(node):
        await node.acall("Attach", **REQUEST)
        fail_saves(node, 2)  # revoked, but the record cannot be removed: it stays as detaching
        code, details, _ = await node.acall("Detach", **REQUEST)
        assert code is grpc.StatusCode.INTERNAL and "record stays as detaching" in details
        await node.service.reconcile()
        assert node.service.table.attachments == {}
    assert node.access.log == [("grant", "c" * 64), ("revoke", "c" * 64), ("revoke", "c" * 64)]


async def test_reconcile_forgets_a_gone_target_and_revokes_an_unprepared_claim(short_tmp: Path) -> None:
    other_target = "22222222-2222-3333-4444-555555555555"
    other_claim = SlaveClaim(
        "team", "second", "cccccccc-0000-0000-0000-000000000002", ("vgpu-1",), frozenset()
    )
    node = make_service(short_tmp, claims={SLAVE: CLAIMS, OTHER_SLAVE: (other_claim,)})
    node.targets.known[(other_target, "app")] = RUNNING._replace(container_id="e" * 64, pod_uid=other_target)
    async with serving(node):
        await node.acall("Attach", **REQUEST)
        await node.acall(
            "Attach", target_pod_uid=other_target, container_name="app", slave_pod_uid=OTHER_SLAVE
        )
        node.targets.synced = False
        del node.targets.known[(TARGET, "app")]
        node.prepared.discard(other_claim.uid)
        await node.service.reconcile()  # not synced: the runtime's list is not complete, nothing is decided
        assert len(node.service.table.attachments) == 2
        node.targets.synced = True
        await node.service.reconcile()
        assert node.service.table.attachments == {}
    # the gone target's cgroup went with it: nothing to revoke; the unprepared claim's grant is revoked
    assert node.access.log == [("grant", "c" * 64), ("grant", "e" * 64), ("revoke", "e" * 64)]
    details = sorted(c.detail for c in node.recorder.recent() if c.call == "Reconcile")
    assert details == [
        f"slave pod {SLAVE}: forget: target instance {'c' * 64} no longer runs",
        f"slave pod {OTHER_SLAVE}: revoke: claim team/second ({other_claim.uid}) of slave pod {OTHER_SLAVE} "
        "is no longer prepared",
    ]


async def test_a_failed_repair_is_recorded_and_tried_again(node: Node) -> None:
    async with serving(node):
        await node.acall("Attach", **REQUEST)
        node.prepared.clear()
        node.access.fail.add("revoke")
        await node.service.reconcile()
        assert [a.state for a in node.service.table.attachments.values()] == [AttachState.ATTACHED]
        await node.service.reconcile()
        assert node.service.table.attachments == {}
    outcomes = [(c.call, c.outcome) for c in node.recorder.recent() if c.call == "Reconcile"]
    assert outcomes == [("Reconcile", Outcome.ERROR), ("Reconcile", Outcome.OK)]

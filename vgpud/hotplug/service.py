"""`vgpud.hotplug.v1.HotPlug`: Attach, Detach and List for device-mounter (issue 18).

Each change runs under one lock, so deciding (`vgpud.hotplug.rules`) and changing are one step:

- Attach: validate; decide against the running containers NRI reported, the slave pod's prepared
  claims and the table; ALREADY answers the existing attachment and changes nothing. Otherwise record
  it as attaching, revoke the previous grant (REATTACH), grant the devices (`DeviceAccess`), record it
  as attached. A failed step undoes what came before it where it can and names itself in the error.
- Detach: record it as detaching, revoke, remove the record.
- The record is written before each grant and revoke, so a vgpud that dies in between finds the
  change half done and `reconcile` finishes it (also: forgets records of instances that are gone,
  revokes those whose slave claim is no longer prepared). The changes are shielded from
  cancellation: a caller that hangs up never leaves half a change.

`DeviceAccess` is what makes the devices usable in the target container (a device cgroup rule for
the slave claim's GPUs); the service takes it from its caller. Every call, refused ones included, is
recorded (component "hotplug"; claim_uid the slave's first claim, the detail names every claim and
device; a failure's detail starts with its gRPC status name), so the metrics,
the debug ring buffer and the live hook stream show it like every other hook. Requests are at most
`MAX_MESSAGE` bytes (RESOURCE_EXHAUSTED from the length prefix).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, NoReturn, Protocol, TypeVar

import grpclib.const
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from vgpud._pb.vgpud.hotplug import v1 as pb
from vgpud.containers.record import NodeContainer
from vgpud.grpcserve import read_unary
from vgpud.hotplug.rules import (
    AttachKey,
    Attachment,
    AttachState,
    Decision,
    Refusal,
    Repair,
    SlaveClaim,
    parse_key,
    plan_attach,
    plan_detach,
    plan_reconcile,
)
from vgpud.hotplug.store import StoreError
from vgpud.hotplug.table import AttachmentTable
from vgpud.recorder import Outcome, Recorder, TimedCall

log = logging.getLogger("vgpud.hotplug")
T = TypeVar("T")

COMPONENT = "hotplug"
#: three IDs and a name are under 200 bytes; anything much larger is not a request of this API
MAX_MESSAGE = 4096
#: statuses that are vgpud's failure, not the caller's (recorded as errors, logged as warnings)
FAILURES = frozenset({Status.INTERNAL, Status.UNAVAILABLE})


class TargetLookup(Protocol):
    """The containers the runtime reported through NRI."""

    @property
    def synced(self) -> bool:
        """The runtime's full list has arrived (until then an unknown container may still exist)."""
        ...

    def newest(self, pod_uid: str, name: str) -> NodeContainer | None:
        """The newest instance of (pod UID, container name), None when the runtime reported none."""
        ...

    def by_id(self, container_id: str) -> NodeContainer | None:
        """The instance with this ID, None when the runtime does not report it (any more)."""
        ...


class ApplyError(Exception):
    """Granting or revoking device access failed at `step` (named in the caller's error)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class DeviceAccess(Protocol):
    """Gives a target container access to an attachment's devices, and takes it back. Both are
    idempotent; each raises ApplyError naming the step that failed, having undone its own part."""

    async def grant(self, attachment: Attachment) -> None: ...

    async def revoke(self, attachment: Attachment) -> None: ...


def attachment_message(a: Attachment) -> pb.Attachment:
    return pb.Attachment(
        target_pod_uid=a.key.target_pod_uid,
        container_name=a.key.container,
        slave_pod_uid=a.key.slave_pod_uid,
        container_id=a.container_id,
        target_pod_namespace=a.target_pod_namespace,
        target_pod_name=a.target_pod_name,
        claims=[
            pb.Claim(namespace=c.namespace, name=c.name, uid=c.uid, devices=list(c.devices)) for c in a.claims
        ],
        attached_at=a.attached_at,
    )


def describe(a: Attachment) -> str:
    """The attachment's claims and devices, for the recorded call and the log."""
    return ", ".join(f"{c} [{' '.join(c.devices) or 'no devices'}]" for c in a.claims)


class HotPlugService(pb.HotPlugBase):
    """The grpclib handler; `attach`, `detach` and `list` are the Trio side, callable directly."""

    def __init__(
        self,
        *,
        table: AttachmentTable,
        targets: TargetLookup,
        claims: Callable[[str], Iterable[SlaveClaim]],
        prepared: Callable[[str], bool],
        access: DeviceAccess,
        recorder: Recorder,
        clock: Callable[[], float] = time.time,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        """`claims`: the slave pod UID -> its vGPU claims prepared here (`vgpud.hotplug.claims`);
        `prepared`: whether a claim UID is still prepared here."""
        self.table = table
        self.targets = targets
        self.claims = claims
        self.prepared = prepared
        self.access = access
        self.recorder = recorder
        self.clock = clock
        self.max_message = max_message
        self._lock = trio.Lock()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """The generated mapping with our handlers (the generated ones read without a limit)."""
        calls = {"Attach": self.attach, "Detach": self.detach, "List": self.list}
        mapping = {}
        for path, h in super().__mapping__().items():
            method = path.rpartition("/")[2]
            mapping[path] = h._replace(func=self._handler(method, h.request_type, calls[method]))
        return mapping

    def _handler(self, method: str, request_type: type, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
        async def handle(stream: Any) -> None:
            try:
                request = await read_unary(stream, request_type, self.max_message)
            except GRPCError as err:
                await trio_asyncio.trio_as_aio(self._unreadable)(method, err)
                raise
            await stream.send_message(await trio_asyncio.trio_as_aio(call)(request))

        return handle

    async def _unreadable(self, method: str, err: GRPCError) -> None:
        log.info("hot-plug %s refused: %s: %s", method, err.status.name, err.message)
        with self.recorder.timed(COMPONENT, method) as call:
            call.outcome, call.detail = Outcome.REJECTED, f"{err.status.name}: {err.message}"

    # -- the calls --------------------------------------------------------------------------------

    async def attach(self, message: pb.AttachRequest) -> pb.AttachResponse:
        with self._timed("Attach", message) as call:
            async with self._lock:
                key = self._key(call, message)
                target = self.targets.newest(key.target_pod_uid, key.container)
                if target is not None:
                    call.update(pod_namespace=target.pod_namespace, pod_name=target.pod_name)
                plan = self._decide(
                    call,
                    lambda: plan_attach(
                        key,
                        target=target,
                        synced=self.targets.synced,
                        slave_claims=self.claims(key.slave_pod_uid),
                        attachments=self.table.attachments,
                        now=self.clock(),
                    ),
                )
                attachment = plan.attachment
                call.update(claim_uid=attachment.claims[0].uid)
                if plan.decision is Decision.ALREADY:
                    call.detail = f"slave pod {key.slave_pod_uid}: already attached: {describe(attachment)}"
                    return pb.AttachResponse(attachment=attachment_message(attachment), already_attached=True)
                with trio.CancelScope(shield=True):
                    await self._apply(call, key, plan.previous, attachment)
                call.detail = f"slave pod {key.slave_pod_uid}: {plan.decision.value}: {describe(attachment)}"
                log.info("hot-plug: %s %s: %s", plan.decision.value, key, describe(attachment))
                return pb.AttachResponse(attachment=attachment_message(attachment))

    async def _apply(
        self, call: TimedCall, key: AttachKey, previous: Attachment | None, new: Attachment
    ) -> None:
        """Record the change as begun, revoke the previous grant (REATTACH), grant, record it done; a
        failed step undoes what came before it where it can and names itself in the error."""
        pending = replace(new, state=AttachState.ATTACHING)
        try:
            await self.table.put(pending)
        except StoreError as err:
            self._fail(call, Status.INTERNAL, f"attach of {key}: recording it failed: {err}; nothing changed")
        if previous is not None:
            try:
                await self.access.revoke(previous)
            except ApplyError as err:
                self._fail(
                    call,
                    Status.INTERNAL,
                    f"attach of {key}: revoking the grant of instance {previous.container_id} failed at "
                    f"{err.step}: {err}; {await self._restore(previous)}",
                )
        try:
            await self.access.grant(new)
        except ApplyError as err:
            self._fail(
                call, Status.INTERNAL, f"attach of {key} failed at {err.step}: {err}; {await self._drop(key)}"
            )
        try:
            await self.table.put(new)
        except StoreError as err:
            self._fail(
                call,
                Status.INTERNAL,
                f"attach of {key}: granted, but recording it as done failed: {err}; {await self._undo(new)}",
            )

    async def _undo(self, attachment: Attachment) -> str:
        """Roll a grant back and drop its record; what happened, for the caller's error."""
        try:
            await self.access.revoke(attachment)
        except ApplyError as err:
            log.error("hot-plug: rollback of %s failed at %s: %s", attachment.key, err.step, err)
            return (
                f"rolling the grant back failed too, at {err.step}: {err} (the record stays as "
                f"{attachment.state.value}: vgpud finishes it when it next reconciles)"
            )
        return f"the grant was rolled back; {await self._drop(attachment.key)}"

    async def _drop(self, key: AttachKey) -> str:
        """Remove the record of a change that did not happen; what happened, for the caller's error."""
        try:
            await self.table.remove(key)
        except StoreError as err:
            return f"its record stays as pending ({err}): vgpud finishes it when it next reconciles"
        return "nothing stays of it"

    async def _restore(self, previous: Attachment) -> str:
        """Put the previous record back after its revoke failed (the grant is intact)."""
        try:
            await self.table.put(previous)
        except StoreError as err:
            return f"its record stays as pending ({err}): vgpud finishes it when it next reconciles"
        return "the previous attachment stays as it was"

    async def detach(self, message: pb.DetachRequest) -> pb.DetachResponse:
        with self._timed("Detach", message) as call:
            async with self._lock:
                key = self._key(call, message)
                attachment = self._decide(call, lambda: plan_detach(key, self.table.attachments))
                call.update(
                    pod_namespace=attachment.target_pod_namespace,
                    pod_name=attachment.target_pod_name,
                    claim_uid=attachment.claims[0].uid if attachment.claims else "",
                )
                with trio.CancelScope(shield=True):
                    await self._revoke_and_remove(call, attachment, "detach")
                call.detail = f"slave pod {key.slave_pod_uid}: detached: {describe(attachment)}"
                log.info("hot-plug: detached %s: %s", key, describe(attachment))
                return pb.DetachResponse(attachment=attachment_message(attachment))

    async def _revoke_and_remove(self, call: TimedCall, attachment: Attachment, what: str) -> None:
        """Record the detach as begun, revoke, remove the record; a failed step says what stays."""
        key = attachment.key
        try:
            await self.table.put(replace(attachment, state=AttachState.DETACHING))
        except StoreError as err:
            self._fail(call, Status.INTERNAL, f"{what} of {key}: recording it failed: {err}; still attached")
        try:
            await self.access.revoke(attachment)
        except ApplyError as err:
            restored = await self._restore(attachment)
            message = f"{what} of {key} failed at {err.step}: {err}; still attached ({restored})"
            self._fail(call, Status.INTERNAL, message)
        try:
            await self.table.remove(key)
        except StoreError as err:
            message = (
                f"{what} of {key}: access was revoked but the record stays as detaching: {err}; vgpud "
                "removes it when it next reconciles"
            )
            self._fail(call, Status.INTERNAL, message)

    async def reconcile(self) -> None:
        """Bring the table in line with the node (`rules.plan_reconcile`): forget records of instances
        that are gone, revoke those whose slave claim is no longer prepared or whose Detach was cut
        short, finish an Attach that was cut short. Called once the runtime's list has arrived, when a
        container instance stops or goes, and when a claim is unprepared. Each repair is recorded
        (method Reconcile); a failed one is logged and tried again at the next call."""
        if not self.targets.synced:
            return
        async with self._lock:
            repairs = plan_reconcile(
                self.table.attachments,
                running=lambda cid: (found := self.targets.by_id(cid)) is not None and found.running,
                prepared=self.prepared,
            )
            for attachment, repair, why in repairs:
                with trio.CancelScope(shield=True):
                    await self._repair(attachment, repair, why)

    async def _repair(self, attachment: Attachment, repair: Repair, why: str) -> None:
        key = attachment.key
        with self.recorder.timed(
            COMPONENT,
            "Reconcile",
            pod_uid=key.target_pod_uid,
            container=key.container,
            pod_namespace=attachment.target_pod_namespace,
            pod_name=attachment.target_pod_name,
            claim_uid=attachment.claims[0].uid if attachment.claims else "",
        ) as call:
            call.detail = f"slave pod {key.slave_pod_uid}: {repair.value}: {why}"
            try:
                if repair is Repair.FORGET:
                    await self.table.remove(key)
                elif repair is Repair.REVOKE:
                    await self._revoke_and_remove(call, attachment, "reconcile")
                else:
                    await self.access.grant(attachment)
                    await self.table.put(replace(attachment, state=AttachState.ATTACHED))
            except (StoreError, ApplyError) as err:
                call.outcome, call.detail = Outcome.ERROR, f"{call.detail}: failed: {err}"
                log.warning("hot-plug: reconcile of %s: %s failed: %s", key, repair.value, err)
                return
            except GRPCError as err:  # _revoke_and_remove's refusal: recorded and logged by _fail
                log.debug("hot-plug: reconcile of %s: %s", key, err.message)
                return
            log.info("hot-plug: %s %s: %s", repair.value, key, why)

    async def list(self, message: pb.ListRequest) -> pb.ListResponse:
        return pb.ListResponse(attachments=[attachment_message(a) for a in self.table.sorted()])

    def debug_state(self) -> list[dict[str, Any]]:
        """The attachments, JSON-ready, for `vgpud debug state`."""
        return [attachment_message(a).to_dict() for a in self.table.sorted()]

    # -- helpers ----------------------------------------------------------------------------------

    def _timed(self, method: str, message: pb.AttachRequest | pb.DetachRequest) -> TimedCall:
        return self.recorder.timed(
            COMPONENT, method, pod_uid=message.target_pod_uid[:64], container=message.container_name[:64]
        )

    def _key(self, call: TimedCall, message: pb.AttachRequest | pb.DetachRequest) -> AttachKey:
        return self._decide(
            call, lambda: parse_key(message.target_pod_uid, message.container_name, message.slave_pod_uid)
        )

    def _decide(self, call: TimedCall, decide: Callable[[], T]) -> T:
        try:
            return decide()
        except Refusal as err:
            self._fail(call, err.status, err.message)

    def _fail(self, call: TimedCall, status: Status, message: str) -> NoReturn:
        """Record the call as refused (the caller's fault) or failed (vgpud's), log, raise GRPCError."""
        failed = status in FAILURES
        call.outcome = Outcome.ERROR if failed else Outcome.REJECTED
        call.detail = f"{status.name}: {message}"
        log.log(logging.WARNING if failed else logging.INFO, "hot-plug: %s: %s", status.name, message)
        raise GRPCError(status, message[:1024])

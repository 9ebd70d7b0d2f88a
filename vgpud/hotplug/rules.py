"""Whether an Attach or Detach may proceed, and what it changes (pure functions, no I/O).

device-mounter's model (seed §6): a "slave pod" holds a vGPU claim through normal scheduling, and its
devices are given to a running "target" container of another pod. vgpud decides from what it already
holds in memory: the prepared claims (the checkpoint and the claim watch, `vgpud.dra.claimindex`),
the containers the runtime reported through NRI, and its own attachment table. Every refusal is a
`Refusal` carrying the gRPC status the caller gets and a message naming the pod, container or claim:

| INVALID_ARGUMENT    | an empty, oversize or malformed pod UID or container name; target pod = slave pod |
| UNAVAILABLE         | the NRI plugin has not synchronized with the runtime yet (retry)                    |
| NOT_FOUND           | a target container the runtime has not reported; Detach of what is not attached    |
| FAILED_PRECONDITION | a target that is not running or not a vGPU container; a slave pod with no vGPU    |
|                     | claim prepared here (and reserved for it); a slave pod attached to another        |
|                     | container; a claim the target pod already holds itself                            |
| RESOURCE_EXHAUSTED  | the node already has `MAX_ATTACHMENTS` attachments                                 |

Attach is idempotent: the same (target pod, container, slave pod) attached to the same container
instance with the same claims is `ALREADY` (nothing changes); a restarted container (a new instance ID),
a changed claim set or a change left half done (`AttachState` not ATTACHED) is `REATTACH` (the grant is
made again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from grpclib.const import Status

from vgpud.containers.record import NodeContainer
from vgpud.containers.values import is_pod_uid
from vgpud.partition.layout import LayoutError, check_dns_label

#: attachments on one node; far above what a node's GPUs can be shared into, and it bounds the table
#: and its file
MAX_ATTACHMENTS = 1024
#: longest field accepted from a request before it is parsed (a pod UID is 36, a DNS label 63)
MAX_FIELD = 253


class Refusal(Exception):
    """A request refused on purpose: the gRPC status the caller gets, and why."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def message(self) -> str:
        return str(self)


@dataclass(frozen=True, order=True)
class AttachKey:
    """What a caller names: the target container (pod UID, container name) and the slave pod."""

    target_pod_uid: str
    container: str
    slave_pod_uid: str

    def __str__(self) -> str:
        return f"container {self.container} of pod {self.target_pod_uid} (slave pod {self.slave_pod_uid})"

    @property
    def target(self) -> str:
        return f"container {self.container} of pod {self.target_pod_uid}"


@dataclass(frozen=True, order=True)
class SlaveClaim:
    """A vGPU claim prepared on this node and reserved for the slave pod, with its devices."""

    namespace: str
    name: str
    uid: str
    #: the prepared devices' names (ResourceSlice device names)
    devices: tuple[str, ...] = ()
    #: the pods the claim is reserved for now (the target pod among them means it holds the claim)
    reserved_for: frozenset[str] = field(default=frozenset(), compare=False)

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name} ({self.uid})"


class AttachState(StrEnum):
    """Where an attachment's change stands. The record is written before the grant and before the
    revoke, so a vgpud that dies in between finds the change to finish (`vgpud.hotplug.reconcile`)."""

    ATTACHING = "attaching"  # recorded; the grant may or may not have been made
    ATTACHED = "attached"  # granted
    DETACHING = "detaching"  # a Detach began; the revoke may or may not have been made


@dataclass(frozen=True)
class Attachment:
    """One recorded attachment: the key, the container instance it was made for, and what it gave."""

    key: AttachKey
    container_id: str
    target_pod_namespace: str
    target_pod_name: str
    claims: tuple[SlaveClaim, ...]
    #: when vgpud recorded it, seconds since the epoch
    attached_at: float
    state: AttachState = AttachState.ATTACHED


class Decision(StrEnum):
    ATTACH = "attach"  # new: make the grant
    ALREADY = "already"  # the same attachment exists: change nothing
    REATTACH = "reattach"  # exists for an older container instance or other claims: make it again


@dataclass(frozen=True)
class AttachPlan:
    decision: Decision
    #: what the table holds after the call (the existing record for ALREADY)
    attachment: Attachment
    #: the record a REATTACH replaces
    previous: Attachment | None = None


def _field(value: str, what: str) -> str:
    if not value:
        raise Refusal(Status.INVALID_ARGUMENT, f"{what} is empty")
    if len(value) > MAX_FIELD:
        raise Refusal(
            Status.INVALID_ARGUMENT, f"{what} is {len(value)} characters long (at most {MAX_FIELD})"
        )
    return value


def parse_key(target_pod_uid: str, container_name: str, slave_pod_uid: str) -> AttachKey:
    """The request's three fields, validated (INVALID_ARGUMENT naming the bad one)."""
    for value, what in ((target_pod_uid, "target_pod_uid"), (slave_pod_uid, "slave_pod_uid")):
        if not is_pod_uid(_field(value, what)):
            raise Refusal(Status.INVALID_ARGUMENT, f"{what} {value!r} is not a pod UID (a lower-case UUID)")
    try:
        check_dns_label(_field(container_name, "container_name"), "container_name")
    except LayoutError as err:
        raise Refusal(Status.INVALID_ARGUMENT, str(err)) from None
    if target_pod_uid == slave_pod_uid:
        raise Refusal(
            Status.INVALID_ARGUMENT,
            f"target and slave are the same pod {target_pod_uid}: a pod's own claims reach its containers "
            "without an attachment",
        )
    return AttachKey(target_pod_uid, container_name, slave_pod_uid)


def check_target(key: AttachKey, target: NodeContainer | None, synced: bool) -> NodeContainer:
    """The running container instance to attach to."""
    if target is None:
        if not synced:
            raise Refusal(
                Status.UNAVAILABLE,
                f"{key.target}: vgpud has not synchronized with the runtime through NRI yet; retry",
            )
        raise Refusal(
            Status.NOT_FOUND, f"{key.target} is not a container the runtime on this node reported through NRI"
        )
    if not target.running:
        raise Refusal(
            Status.FAILED_PRECONDITION,
            f"{key.target} ({target.pod_namespace}/{target.pod_name}, instance {target.container_id}) "
            "is not running",
        )
    if not target.vgpu:
        raise Refusal(
            Status.FAILED_PRECONDITION,
            f"{key.target} ({target.pod_namespace}/{target.pod_name}) is not a vGPU container: no control "
            "library in it would enforce the slave's limits (give the target pod a vGPU claim of its own)",
        )
    return target


def check_slave_claims(key: AttachKey, claims: Iterable[SlaveClaim]) -> tuple[SlaveClaim, ...]:
    """The slave pod's vGPU claims prepared here, sorted; refused when it has none or when the target
    pod holds one of them itself (it has those devices already)."""
    found = tuple(sorted(claims))
    if not found:
        raise Refusal(
            Status.FAILED_PRECONDITION,
            f"slave pod {key.slave_pod_uid} has no vGPU claim prepared on this node and reserved for it",
        )
    for claim in found:
        if key.target_pod_uid in claim.reserved_for:
            raise Refusal(
                Status.FAILED_PRECONDITION,
                f"{claim} of slave pod {key.slave_pod_uid} is reserved for the target pod "
                f"{key.target_pod_uid} too: its containers hold the devices already",
            )
    return found


def plan_attach(
    key: AttachKey,
    *,
    target: NodeContainer | None,
    synced: bool,
    slave_claims: Iterable[SlaveClaim],
    attachments: Mapping[AttachKey, Attachment],
    now: float,
) -> AttachPlan:
    """Decide an Attach of a validated `key` against what vgpud knows now; Refusal when it may not."""
    container = check_target(key, target, synced)
    claims = check_slave_claims(key, slave_claims)
    for other in attachments.values():
        if other.key.slave_pod_uid == key.slave_pod_uid and other.key != key:
            raise Refusal(
                Status.FAILED_PRECONDITION,
                f"slave pod {key.slave_pod_uid} is attached to {other.key.target} already; detach it first",
            )
    previous = attachments.get(key)
    if previous is None and len(attachments) >= MAX_ATTACHMENTS:
        raise Refusal(
            Status.RESOURCE_EXHAUSTED,
            f"this node has {len(attachments)} attachments, the most it keeps; {key} is not attached",
        )
    attachment = Attachment(
        key=key,
        container_id=container.container_id,
        target_pod_namespace=container.pod_namespace,
        target_pod_name=container.pod_name,
        claims=claims,
        attached_at=now,
    )
    if previous is None:
        return AttachPlan(Decision.ATTACH, attachment)
    if (
        previous.state is AttachState.ATTACHED
        and previous.container_id == container.container_id
        and _same_claims(previous.claims, claims)
    ):
        return AttachPlan(Decision.ALREADY, previous)
    return AttachPlan(Decision.REATTACH, attachment, previous)


def _same_claims(a: Sequence[SlaveClaim], b: Sequence[SlaveClaim]) -> bool:
    return [(c.uid, c.devices) for c in a] == [(c.uid, c.devices) for c in b]


def plan_detach(key: AttachKey, attachments: Mapping[AttachKey, Attachment]) -> Attachment:
    """The attachment a Detach of a validated `key` removes; NOT_FOUND when there is none."""
    found = attachments.get(key)
    if found is None:
        raise Refusal(Status.NOT_FOUND, f"slave pod {key.slave_pod_uid} is not attached to {key.target}")
    return found


class Repair(StrEnum):
    """What `plan_reconcile` does with a record."""

    FORGET = "forget"  # the target instance is gone: its cgroup, and the grant in it, went with it
    REVOKE = "revoke"  # a Detach was cut short, or a slave claim is no longer prepared: revoke, remove
    GRANT = "grant"  # an Attach was cut short: grant (idempotent), then mark it attached


def plan_reconcile(
    attachments: Mapping[AttachKey, Attachment],
    *,
    running: Callable[[str], bool],
    prepared: Callable[[str], bool],
) -> list[tuple[Attachment, Repair, str]]:
    """The records to repair, in key order, each with why: `running(container_id)` says whether the
    runtime still runs that instance, `prepared(claim_uid)` whether this node still has that claim
    prepared. Records of running instances whose claims are all prepared and whose change finished
    are left alone."""
    repairs = []
    for key in sorted(attachments):
        a = attachments[key]
        gone = [c for c in a.claims if not prepared(c.uid)]
        if not running(a.container_id):
            repairs.append((a, Repair.FORGET, f"target instance {a.container_id} no longer runs"))
        elif a.state is AttachState.DETACHING:
            repairs.append((a, Repair.REVOKE, "a detach was cut short"))
        elif gone:
            names = ", ".join(str(c) for c in gone)
            repairs.append(
                (a, Repair.REVOKE, f"{names} of slave pod {key.slave_pod_uid} is no longer prepared")
            )
        elif a.state is AttachState.ATTACHING:
            repairs.append((a, Repair.GRANT, "an attach was cut short"))
    return repairs

"""The read side of the prepared claims: what the NRI plugin, the registry and the observability ask.

Built from the checkpoint (every PrepareCompleted entry) each time Prepare, Unprepare or the cleanup
saves it, and at start; never written by its readers. Reads are plain dict lookups on the Trio
thread, so a hook's admission check costs no I/O.

Two facts besides the checkpoint's: which pods each claim is reserved for now (the `reservedFor`
Prepare saw, kept current by `ClaimWatch` from a watch of the claims: a second pod may join a shared
claim after Prepare, and the kubelet does not prepare it again), and per-claim guards that make the
NRI plugin's "is it prepared?" and "make the directory" one step with respect to Unprepare.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from vgpud.dra.checkpoint import Checkpoint, ClaimEntry, PrepareState
from vgpud.logs import fields
from vgpud.partition.admission import Admission, Verdict
from vgpud.partition.assigner import Mode, PartitionRecord

log = logging.getLogger("vgpud.dra")

#: how long CreateContainer waits for the claim watch to name a pod the claim does not list yet
#: (the kubelet reads the claim, with the pod in reservedFor, before it creates containers; the watch
#: is normally ahead by far). Well inside the runtime's 2 s hook deadline.
RESERVATION_WAIT = 1.0


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str

    def log_fields(self) -> dict[str, Any]:
        """The `extra=` of a log line about this claim: its UID and namespace."""
        return fields(claim=self.uid, namespace=self.namespace)


@dataclass(frozen=True)
class ModeMismatch:
    """A prepared claim whose recorded mode is not the mode this process runs in."""

    claim: ClaimRef
    prepared: Mode
    current: Mode
    #: what it means for the claim's containers
    consequence: str


def reserved_pod_uids(status: Mapping[str, object]) -> frozenset[str]:
    """The pod UIDs of a claim status's `reservedFor` (a claim object's, or the one Prepare kept in
    the checkpoint entry); anything malformed in it is ignored, so it names no pod."""
    reserved = status.get("reservedFor")
    if not isinstance(reserved, list):
        return frozenset()
    return frozenset(
        r["uid"]
        for r in reserved
        if isinstance(r, Mapping) and r.get("resource", "pods") == "pods" and isinstance(r.get("uid"), str)
    )


def mismatch_consequence(prepared: Mode, current: Mode) -> str:
    if prepared is Mode.LAZY:
        return (
            "prepared in lazy mode, but this vgpud runs in eager mode without NRI: its new containers "
            "get no per-container directory and cannot register"
        )
    return (
        "prepared in eager mode: its CDI spec carries the partition mounts, so the NRI plugin leaves "
        "its containers alone"
    )


def describe_mismatches(mismatches: list[ModeMismatch]) -> str:
    """One line for logs and the health detail; "" when there is none."""
    return "; ".join(
        f"claim {m.claim.namespace}/{m.claim.name} ({m.claim.uid}) {m.consequence}" for m in mismatches
    )


class ClaimIndex:
    """The prepared claims by UID, by register UUID, their partition records, modes and reservations."""

    def __init__(self, mode: Mode = Mode.EAGER, *, reservation_wait: float = RESERVATION_WAIT) -> None:
        self.mode = mode
        self._reservation_wait = reservation_wait
        self._entries: dict[str, ClaimEntry] = {}
        self._vgpu_claims: frozenset[str] = frozenset()
        self._prepared: dict[str, ClaimRef] = {}
        self._records: dict[str, PartitionRecord] = {}
        self._by_register_uuid: dict[str, ClaimRef] = {}
        #: claim UID -> reserved pod UIDs, as the claim watch last saw them (overrides Prepare's view)
        self._watched: dict[str, frozenset[str]] = {}
        self._changed = trio.Event()
        self._guards: dict[str, trio.Lock] = {}
        self._guard_users: dict[str, int] = {}
        #: called (on the Trio thread) after every change of the prepared claims
        self.listeners: list[Callable[[], None]] = []

    # -- the NRI plugin ---------------------------------------------------------------------------

    def check(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        ref = self._prepared.get(claim_uid)
        if claim_uid not in self._vgpu_claims or ref is None or ref.namespace != namespace:
            return Admission(
                Verdict.UNPREPARED,
                f"claim {claim_uid} is not a vGPU claim of namespace {namespace} prepared on this node",
            )
        if pod_uid not in self.reserved_pods(claim_uid):
            return Admission(
                Verdict.NOT_RESERVED,
                f"claim {ref.namespace}/{ref.name} ({claim_uid}) is not reserved for pod {pod_uid}",
            )
        prepared = self.mode_of(claim_uid)
        if prepared is not self.mode and prepared is Mode.EAGER:
            return Admission(
                Verdict.OTHER_MODE,
                f"claim {ref.namespace}/{ref.name} ({claim_uid}) was "
                f"{mismatch_consequence(prepared, self.mode)}",
            )
        return Admission(Verdict.INJECT)

    async def admit(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        verdict = self.check(claim_uid, namespace, pod_uid)
        with trio.move_on_after(self._reservation_wait):
            while verdict.verdict is Verdict.NOT_RESERVED:
                await self._changed.wait()
                verdict = self.check(claim_uid, namespace, pod_uid)
        return verdict

    @asynccontextmanager
    async def guard(self, claim_uid: str) -> AsyncIterator[None]:
        lock = self._guards.setdefault(claim_uid, trio.Lock())
        self._guard_users[claim_uid] = self._guard_users.get(claim_uid, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._guard_users[claim_uid] -= 1
            if not self._guard_users[claim_uid]:
                del self._guard_users[claim_uid], self._guards[claim_uid]

    def guard_waiters(self, claim_uid: str) -> int:
        """Tasks waiting for the claim's guard (tests widen the race window with it)."""
        lock = self._guards.get(claim_uid)
        return lock.statistics().tasks_waiting if lock is not None else 0

    def is_vgpu_claim_prepared(self, claim_uid: str, namespace: str) -> bool:
        """A vGPU claim this node has prepared, of that namespace (claims are namespaced)."""
        ref = self._prepared.get(claim_uid)
        return claim_uid in self._vgpu_claims and ref is not None and ref.namespace == namespace

    # -- reservations (the claim watch) --------------------------------------------------------------

    def reserved_pods(self, claim_uid: str) -> frozenset[str]:
        watched = self._watched.get(claim_uid)
        if watched is not None:
            return watched
        entry = self._entries.get(claim_uid)
        return reserved_pod_uids(entry.status) if entry is not None else frozenset()

    def set_reserved(self, claim_uid: str, pod_uids: Iterable[str]) -> None:
        """The claim watch saw the claim's reservedFor (an empty set: the claim is gone)."""
        if claim_uid not in self._prepared:
            return
        self._watched[claim_uid] = frozenset(pod_uids)
        self._changed.set()
        self._changed = trio.Event()

    # -- modes ------------------------------------------------------------------------------------

    def mode_of(self, claim_uid: str) -> Mode | None:
        """The mode the claim was prepared in; an entry without one (an older vgpud's) counts as the
        current mode: that is the only mode the older vgpud could have been started in and still
        serve it now without a mismatch report, so it is the assumption that changes nothing."""
        entry = self._entries.get(claim_uid)
        if entry is None:
            return None
        return Mode(entry.mode) if entry.mode is not None else self.mode

    def mismatches(self) -> list[ModeMismatch]:
        """Every prepared vGPU claim recorded in a mode other than this process's, by claim UID."""
        found = []
        for uid in sorted(self._vgpu_claims):
            prepared = self.mode_of(uid)
            if prepared is not None and prepared is not self.mode:
                consequence = mismatch_consequence(prepared, self.mode)
                found.append(ModeMismatch(self._prepared[uid], prepared, self.mode, consequence))
        return found

    def unrecorded_modes(self) -> list[ClaimRef]:
        """Prepared claims whose entry has no mode (written by an older vgpud)."""
        return [self._prepared[uid] for uid, e in sorted(self._entries.items()) if e.mode is None]

    # -- the registry and the observability -----------------------------------------------------------

    def prepared_claim(self, claim_uid: str) -> ClaimRef | None:
        """The registry's lazy path: the name of a claim this node has prepared (PrepareCompleted)."""
        return self._prepared.get(claim_uid)

    def claim_for_register_uuid(self, register_uuid: str) -> ClaimRef | None:
        """The registry's eager path: the prepared claim whose partition got `register_uuid`. Every
        UUID this node minted is in a PrepareCompleted entry, so the checkpoint is the UUID index."""
        return self._by_register_uuid.get(register_uuid)

    def prepared_devices(self, claim_uid: str) -> tuple[str, ...]:
        """The device names Prepare gave a prepared claim (the hot-plug API names them); () when the
        claim is not prepared here."""
        entry = self._entries.get(claim_uid)
        return tuple(d.device for d in entry.prepared_devices) if entry is not None else ()

    def prepared_claim_uids(self) -> frozenset[str]:
        """Every claim in PrepareCompleted."""
        return frozenset(self._prepared)

    def vgpu_claim_namespaces(self) -> dict[str, str]:
        """The prepared claims with vGPU devices (those that have a claim directory) -> their namespace."""
        return {uid: self._prepared[uid].namespace for uid in self._vgpu_claims if uid in self._prepared}

    def register_uuids(self) -> dict[str, ClaimRef]:
        """Every register UUID a prepared claim's partition got -> that claim (eager client mode)."""
        return dict(self._by_register_uuid)

    def records(self) -> Mapping[str, tuple[ClaimRef, PartitionRecord]]:
        """Claim UID -> (claim, partition record) of every prepared claim whose record is readable."""
        return {uid: (self._prepared[uid], record) for uid, record in self._records.items()}

    # -- the writers: Prepare, Unprepare, the cleanup --------------------------------------------------

    def forget(self, claim_uid: str) -> None:
        """Unprepare, under the claim's guard: the claim is gone from now on, before its files go."""
        self._entries.pop(claim_uid, None)
        self._prepared.pop(claim_uid, None)
        self._watched.pop(claim_uid, None)
        self._vgpu_claims = self._vgpu_claims - {claim_uid}
        self._notify()

    def _notify(self) -> None:
        for listener in self.listeners:
            listener()

    def update(self, checkpoint: Checkpoint) -> None:
        """Re-index from a checkpoint just loaded or saved."""
        completed = {
            uid: entry for uid, entry in checkpoint.claims.items() if entry.state is PrepareState.COMPLETED
        }
        self._entries = completed
        self._vgpu_claims = frozenset(uid for uid, entry in completed.items() if entry.vgpu)
        self._prepared = {uid: ClaimRef(e.namespace, uid, e.name) for uid, e in completed.items()}
        self._watched = {uid: pods for uid, pods in self._watched.items() if uid in completed}
        by_uuid: dict[str, ClaimRef] = {}
        records: dict[str, PartitionRecord] = {}
        for uid, entry in completed.items():
            try:
                record = PartitionRecord.from_dict(entry.partition)
            except ValueError as err:
                log.warning("checkpoint: claim %s: register UUIDs not indexed: %s", uid, err)
                continue
            records[uid] = record
            for register_uuid in record.register_uuids.values():
                by_uuid[register_uuid] = self._prepared[uid]
        self._by_register_uuid = by_uuid
        self._records = records
        self._changed.set()
        self._changed = trio.Event()
        self._notify()

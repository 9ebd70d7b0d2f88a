"""What Prepare, Unprepare and the cleanup share: the node's DRA state and the steps all three take.

One `DraContext` per `vgpud run`: the API, the partition assigner, the node facts, the checkpoint
store (whose every save re-indexes the `ClaimIndex`), the CDI root, the node lock and the recorder.
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from vgpud.dra.cdi import remove_spec
from vgpud.dra.checkpoint import Checkpoint, CheckpointStore, PreparedDevice
from vgpud.dra.claimedits import NodeFacts, PrepareError
from vgpud.dra.claimindex import ClaimIndex, ClaimRef
from vgpud.dra.nodelock import NodeLockTimeout, node_lock
from vgpud.fsutil import remove_tree
from vgpud.kube import KubeApi
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventSink, Reason, pod_ref
from vgpud.partition.assigner import PartitionAssigner
from vgpud.partition.model import ClaimView
from vgpud.partition.nrionly import PrepareRefusal
from vgpud.recorder import HookCall, Outcome, Recorder, TimedCall

log = logging.getLogger("vgpud.dra")

NODE_LOCK_TIMEOUT = 10.0


@dataclass(frozen=True)
class PrepareOutcome:
    """One claim's entry in a NodePrepareResources reply: its devices, or why it failed."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class DraContext:
    kube: KubeApi
    assigner: PartitionAssigner
    facts: NodeFacts
    store: CheckpointStore
    cdi_root: Path
    lock_path: Path
    recorder: Recorder
    lock_timeout: float = NODE_LOCK_TIMEOUT
    #: the pods' Events: a claim refused (None: none written)
    events: EventSink | None = None
    index: ClaimIndex = field(init=False)
    #: claims Prepare refused because this node cannot serve their use, by reason (its value)
    refusals: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.index = ClaimIndex(self.assigner.mode)

    @property
    def driver(self) -> str:
        return self.facts.driver

    def node_lock(self) -> AbstractAsyncContextManager[None]:
        return node_lock(self.lock_path, timeout=self.lock_timeout)

    def timed(self, call: str, ref: ClaimRef) -> TimedCall:
        return self.recorder.timed("dra", call, claim_uid=ref.uid, pod_namespace=ref.namespace)

    def failed(self, call: str, ref: ClaimRef, err: PrepareError | PrepareRefusal) -> PrepareOutcome:
        """Log and record a claim that failed before any side effect; its reply entry (a refusal is
        also `refused`)."""
        log.warning("%s", err, extra=ref.log_fields())
        self.recorder.record(
            HookCall(
                component="dra",
                call=call,
                claim_uid=ref.uid,
                pod_namespace=ref.namespace,
                outcome=Outcome.ERROR,
                detail=str(err),
            )
        )
        return PrepareOutcome(error=str(err))

    def refused(self, err: PrepareRefusal, claim: ClaimView) -> None:
        """A use this node cannot serve: counted by its reason, and a VGPUClaimRefused Event on each
        pod the claim is reserved for (the kubelet's own FailedPrepareDynamicResources Event says only
        that Prepare failed; this one says why, and what to do)."""
        self.refusals[err.reason.value] += 1
        if self.events is None:
            return
        for pod in claim.reserved_for:
            ref = pod_ref(claim.namespace, pod.name, pod.uid)
            self.events.record(ref, EventType.WARNING, Reason.VGPU_CLAIM_REFUSED, str(err))

    async def remove_artifacts(self, claim_uid: str) -> None:
        """Remove everything Prepare may have created for the claim: its directory and CDI spec (in
        one worker-thread hop)."""
        paths = [Path(path) for path in self.assigner.unprepare(claim_uid, {}).paths]
        await trio.to_thread.run_sync(self._remove_files, paths, claim_uid)

    def _remove_files(self, paths: list[Path], claim_uid: str) -> None:
        for path in paths:
            remove_tree(path)
        remove_spec(self.cdi_root, self.driver, claim_uid)

    async def try_remove_artifacts(self, ref: ClaimRef) -> str:
        """A rollback that cannot fail the batch: "" when everything went, else what could not be
        removed and why (the caller keeps the claim's checkpoint entry so a later pass retries)."""
        try:
            await self.remove_artifacts(ref.uid)
        except (OSError, ValueError) as err:  # ValueError: a claim UID that names no directory
            log.error(
                "claim %s/%s (%s): rollback failed: %s",
                ref.namespace,
                ref.name,
                ref.uid,
                err,
                extra=ref.log_fields(),
            )
            return f"rollback failed: {err}"
        return ""

    async def load(self) -> Checkpoint:
        return await trio.to_thread.run_sync(self.store.load)

    async def save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Persist (fsync: in a thread, so hooks on the event loop never wait on the disk) and index."""
        await trio.to_thread.run_sync(self.store.save, checkpoint)
        self.index.update(checkpoint)
        return checkpoint


def state_error(err: Exception) -> str:
    """The reply text when the node lock or the checkpoint fails a whole batch."""
    return f"node busy: {err}" if isinstance(err, NodeLockTimeout) else f"checkpoint: {err}"

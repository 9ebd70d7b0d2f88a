"""The read side of the prepared claims: what the NRI plugin, the registry and the observability ask.

Built from the checkpoint (every PrepareCompleted entry) each time Prepare, Unprepare or the cleanup
saves it, and at start; never written by its readers. Reads are plain dict lookups on the Trio
thread, so a hook's admission check costs no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from vgpud.dra.checkpoint import Checkpoint, PrepareState
from vgpud.partition.assigner import PartitionRecord

log = logging.getLogger("vgpud.dra")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str


class ClaimIndex:
    """The prepared claims by UID, by register UUID, and their partition records."""

    def __init__(self) -> None:
        self._vgpu_claims: frozenset[str] = frozenset()
        self._prepared: dict[str, ClaimRef] = {}
        self._records: dict[str, PartitionRecord] = {}
        self._by_register_uuid: dict[str, ClaimRef] = {}

    def is_vgpu_claim_prepared(self, claim_uid: str, namespace: str) -> bool:
        """The NRI plugin's anti-spoof check: is this a vGPU claim this node has prepared, of the pod's
        own namespace? (Claims are namespaced: no pod can legitimately use another namespace's claim.)"""
        ref = self._prepared.get(claim_uid)
        return claim_uid in self._vgpu_claims and ref is not None and ref.namespace == namespace

    def prepared_claim(self, claim_uid: str) -> ClaimRef | None:
        """The registry's lazy path: the name of a claim this node has prepared (PrepareCompleted)."""
        return self._prepared.get(claim_uid)

    def claim_for_register_uuid(self, register_uuid: str) -> ClaimRef | None:
        """The registry's eager path: the prepared claim whose partition got `register_uuid`. Every
        UUID this node minted is in a PrepareCompleted entry, so the checkpoint is the UUID index."""
        return self._by_register_uuid.get(register_uuid)

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

    def update(self, checkpoint: Checkpoint) -> None:
        """Re-index from a checkpoint just loaded or saved."""
        completed = {
            uid: entry for uid, entry in checkpoint.claims.items() if entry.state is PrepareState.COMPLETED
        }
        self._vgpu_claims = frozenset(uid for uid, entry in completed.items() if entry.vgpu)
        self._prepared = {uid: ClaimRef(e.namespace, uid, e.name) for uid, e in completed.items()}
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

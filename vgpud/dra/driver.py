"""Prepare and Unprepare of vGPU claims: the state machine behind the DRA node service.

Per claim (vgpu-manager-contracts.md "Prepare"): read the claim from the API (its UID must match and it
must be allocated), then under the node-wide lock: PrepareCompleted -> the recorded devices; refuse
devices already prepared for another claim; PrepareStarted -> roll back first; record PrepareStarted;
create the claim's directories, annotations and CDI spec; record PrepareCompleted. A failure after
PrepareStarted rolls back at once, so a refused claim leaves nothing behind; a crash leaves
PrepareStarted, which the next Prepare or the periodic cleanup rolls back.

Every per-claim failure is a message in that claim's reply entry, never a whole-call error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from vgpud.dra.cdi import remove_spec, write_spec
from vgpud.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ClaimEntry,
    PreparedDevice,
    PrepareState,
)
from vgpud.dra.claimedits import NodeFacts, PrepareError, build_claim_spec, gpu_for
from vgpud.dra.nodelock import NodeLockTimeout, node_lock
from vgpud.fsutil import remove_tree
from vgpud.kube import KubeApi, KubeError, NotFound
from vgpud.partition.assigner import (
    Mode,
    PartitionAssigner,
    PartitionConflict,
    PartitionError,
    PartitionRecord,
    PrepareResult,
)
from vgpud.partition.model import (
    ClaimView,
    ContainerRef,
    ModelError,
    PodView,
    claim_consumers,
    parse_claim,
    parse_pod,
)
from vgpud.partition.pidsfile import PidsFileError, reset_pids_file
from vgpud.recorder import HookCall, Outcome, Recorder, TimedCall

log = logging.getLogger("vgpud.dra")

NODE_LOCK_TIMEOUT = 10.0
CLEANUP_INTERVAL = 600.0


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepareResources."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class ClaimPartitions:
    """A prepared claim's partitions as Prepare recorded them, with the containers that use each now
    (from the claim's reserved pods in the API) and the conflicts among them (bug-2, eager mode)."""

    claim: ClaimRef
    record: PartitionRecord
    #: partition key -> the containers whose requests went to it; a conflicting container is in several
    containers: Mapping[str, tuple[ContainerRef, ...]] = field(default_factory=dict, hash=False)
    conflicts: tuple[PartitionConflict, ...] = ()
    #: why the claim or its pods could not be read (then `containers` and `conflicts` are empty)
    error: str = ""


class DraDriver:
    """One per `vgpud run`; `prepare`/`unprepare` are called by the v1 and v1beta1 services alike."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        assigner: PartitionAssigner,
        facts: NodeFacts,
        store: CheckpointStore,
        cdi_root: Path,
        lock_path: Path,
        recorder: Recorder,
        lock_timeout: float = NODE_LOCK_TIMEOUT,
    ) -> None:
        self._kube = kube
        self._assigner = assigner
        self._facts = facts
        self._store = store
        self._cdi_root = cdi_root
        self._lock_path = lock_path
        self._recorder = recorder
        self._lock_timeout = lock_timeout
        self._vgpu_claims: frozenset[str] = frozenset()
        self._prepared: dict[str, ClaimRef] = {}
        self._records: dict[str, PartitionRecord] = {}
        self._by_register_uuid: dict[str, ClaimRef] = {}

    @property
    def driver(self) -> str:
        return self._facts.driver

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

    # Read-only views for the debug state, the metrics and the drift self-check

    def prepared_claim_uids(self) -> frozenset[str]:
        """Every claim in PrepareCompleted."""
        return frozenset(self._prepared)

    def vgpu_claim_namespaces(self) -> dict[str, str]:
        """The prepared claims with vGPU devices (those that have a claim directory) -> their namespace."""
        return {uid: self._prepared[uid].namespace for uid in self._vgpu_claims if uid in self._prepared}

    def register_uuids(self) -> dict[str, ClaimRef]:
        """Every register UUID a prepared claim's partition got -> that claim (eager client mode)."""
        return dict(self._by_register_uuid)

    async def claim_partitions(self, *, min_partitions: int = 1) -> list[ClaimPartitions]:
        """The prepared claims whose record has at least `min_partitions` partitions, each with the
        containers that use its partitions now and the conflicts among them. Reads each claim and its
        reserved pods from the API (eager mode only: lazy records have no partitions)."""
        found = []
        for uid, record in sorted(self._records.items()):
            ref = self._prepared.get(uid)
            if ref is None or len(set(record.request_partitions.values())) < min_partitions:
                continue
            try:
                claim, pods = await self._read_claim(ref)
            except PrepareError as err:
                found.append(ClaimPartitions(ref, record, error=str(err)))
                continue
            by_key: dict[str, list[ContainerRef]] = {}
            for container, requests in claim_consumers(claim, pods).items():
                for key in sorted(
                    {record.request_partitions[r] for r in requests if r in record.request_partitions}
                ):
                    by_key.setdefault(key, []).append(container)
            conflicts = self._assigner.conflicts(record, claim, pods)
            found.append(ClaimPartitions(ref, record, {k: tuple(v) for k, v in by_key.items()}, conflicts))
        return found

    async def load(self) -> Checkpoint:
        """Read the checkpoint at start (a corrupt one is quarantined by the store) and index it."""
        checkpoint = await self._load()
        self._index(checkpoint)
        log.info(
            "checkpoint: %d claims (%d prepared vGPU claims)", len(checkpoint.claims), len(self._vgpu_claims)
        )
        return checkpoint

    # ---------------------------------------------------------------------------------------------
    # Prepare

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        fetched: list[tuple[ClaimRef, ClaimView, list[PodView]]] = []
        for ref in claims:  # API reads before the lock, as the Go helper does
            try:
                fetched.append((ref, *await self._read_claim(ref)))
            except PrepareError as err:
                outcomes[ref.uid] = self._failed("Prepare", ref, err)
        if fetched:
            try:
                async with node_lock(self._lock_path, timeout=self._lock_timeout):
                    await self._prepare_locked(fetched, outcomes)
            except (NodeLockTimeout, CheckpointError) as err:
                for ref, _, _ in fetched:
                    if ref.uid not in outcomes:
                        outcomes[ref.uid] = self._failed("Prepare", ref, PrepareError(_state_error(err)))
        return outcomes

    async def _prepare_locked(
        self, fetched: list[tuple[ClaimRef, ClaimView, list[PodView]]], outcomes: dict[str, PrepareOutcome]
    ) -> None:
        """Two checkpoint writes per call, not per claim: every claim to prepare is marked
        PrepareStarted before any side effect, and the results are recorded together at the end."""
        checkpoint = await self._load()
        todo = []
        for ref, claim, pods in fetched:
            entry = checkpoint.claims.get(ref.uid)
            if entry is not None and entry.state is PrepareState.COMPLETED:
                with self._timed("Prepare", ref):
                    outcomes[ref.uid] = PrepareOutcome(devices=entry.prepared_devices)
                continue
            try:
                self._check_devices(claim, checkpoint)
            except PrepareError as err:
                outcomes[ref.uid] = self._failed("Prepare", ref, err)
                continue
            if entry is not None:
                log.warning("claim %s/%s: rolling back an interrupted Prepare", ref.namespace, ref.name)
                await self._remove_artifacts(ref.uid)
            started = ClaimEntry(
                state=PrepareState.STARTED,
                name=claim.name,
                namespace=claim.namespace,
                vgpu=bool(claim.devices),
            )
            checkpoint = checkpoint.with_claim(ref.uid, started)
            todo.append((ref, claim, pods))
        if not todo:
            return
        # A cancellation (the kubelet's deadline) from here on leaves PrepareStarted entries: the next
        # Prepare or the periodic cleanup rolls them back.
        checkpoint = await self._save(checkpoint)
        for ref, claim, pods in todo:
            with self._timed("Prepare", ref) as call:
                try:
                    completed = await self._materialize(claim, pods)
                except (PrepareError, PartitionError, PidsFileError, OSError, KubeError, ValueError) as err:
                    await self._remove_artifacts(ref.uid)
                    checkpoint = checkpoint.without_claim(ref.uid)
                    message = f"claim {ref.namespace}/{ref.name}: {err}"
                    call.outcome, call.detail = Outcome.ERROR, message
                    log.warning("%s", message)
                    outcomes[ref.uid] = PrepareOutcome(error=message)
                    continue
                checkpoint = checkpoint.with_claim(ref.uid, completed)
                outcomes[ref.uid] = PrepareOutcome(devices=completed.prepared_devices)
        await self._save(checkpoint)

    async def _materialize(self, claim: ClaimView, pods: list[PodView]) -> ClaimEntry:
        """The side effects of one Prepare: directories, claim annotations, the CDI spec."""
        result = self._assigner.prepare(claim, pods)
        spec, devices = build_claim_spec(self._facts, claim, result)
        await trio.to_thread.run_sync(self._create_directories, result)
        if result.annotations:
            await self._kube.patch_resource_claim_annotations(
                claim.namespace, claim.name, dict(result.annotations), uid=claim.uid
            )
        await trio.to_thread.run_sync(write_spec, self._cdi_root, self.driver, claim.uid, spec)
        log.info(
            "claim %s/%s (%s) prepared: %s",
            claim.namespace,
            claim.name,
            claim.uid,
            ", ".join(f"{d.device}/{d.share_id or '-'}" for d in devices) or "no vGPU devices",
        )
        return ClaimEntry(
            state=PrepareState.COMPLETED,
            name=claim.name,
            namespace=claim.namespace,
            prepared_devices=devices,
            partition=result.record.to_dict(),
            vgpu=bool(devices),
        )

    async def _read_claim(self, ref: ClaimRef) -> tuple[ClaimView, list[PodView]]:
        if not (ref.namespace and ref.name and ref.uid):
            raise PrepareError(f"claim reference {ref} lacks a namespace, name or UID")
        try:
            obj = await self._kube.get_resource_claim(ref.namespace, ref.name)
        except NotFound:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} not found") from None
        except KubeError as err:
            raise PrepareError(f"claim {ref.namespace}/{ref.name}: API error: {err}") from None
        uid = obj.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(
                f"claim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} "
                "(it was deleted and re-created)"
            )
        try:
            claim = parse_claim(obj, self.driver)
        except ModelError as err:
            raise PrepareError(str(err)) from None
        if not claim.allocated:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
        pods = await self._reserved_pods(claim) if self._assigner.mode is Mode.EAGER else []
        return claim, pods

    async def _reserved_pods(self, claim: ClaimView) -> list[PodView]:
        """The pods the claim is reserved for that still exist with the reserved UID (eager only)."""
        pods = []
        for reserved in claim.reserved_for:
            try:
                obj = await self._kube.get_pod(claim.namespace, reserved.name)
            except NotFound:
                continue
            except KubeError as err:
                raise PrepareError(f"pod {claim.namespace}/{reserved.name}: API error: {err}") from None
            try:
                pod = parse_pod(obj)
            except ModelError as err:
                raise PrepareError(str(err)) from None
            if pod.uid == reserved.uid:
                pods.append(pod)
        return pods

    def _check_devices(self, claim: ClaimView, checkpoint: Checkpoint) -> None:
        """Every result is a GPU of this node and not already prepared for another claim."""
        for device in claim.devices:
            if device.admin_access:
                raise PrepareError(
                    f"claim {claim.namespace}/{claim.name}: adminAccess is not supported "
                    f"for vGPU device {device.device}"
                )
            gpu_for(self._facts, device)
            for uid, other in checkpoint.claims.items():
                if uid == claim.uid:
                    continue
                for prepared in other.prepared_devices:
                    same_share = prepared.share_id == device.share_id
                    if prepared.device == device.device and prepared.pool == device.pool and same_share:
                        raise PrepareError(
                            f"device {device.device} (share {device.share_id or '-'}) is already prepared "
                            f"for claim {other.namespace}/{other.name} ({uid})"
                        )

    def _create_directories(self, result: PrepareResult) -> None:
        """A fresh claim dir, then each partition dir with an empty pids.config (blocking)."""
        claim_dir = Path(result.claim_dir)
        remove_tree(claim_dir)
        claim_dir.mkdir(parents=True, mode=0o755)
        for paths in result.partition_dirs:
            for directory in paths.directories:
                Path(directory).mkdir(parents=True, exist_ok=True, mode=0o755)
            reset_pids_file(Path(paths.config))

    # ---------------------------------------------------------------------------------------------
    # Unprepare

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        annotations = {ref.uid: await self._current_annotations(ref) for ref in claims}
        errors: dict[str, str] = {}
        try:
            async with node_lock(self._lock_path, timeout=self._lock_timeout):
                checkpoint = await self._load()
                for ref in claims:
                    with self._timed("Unprepare", ref):
                        await self._strip_annotations(ref, annotations[ref.uid])
                        await self._remove_artifacts(ref.uid)
                        checkpoint = checkpoint.without_claim(ref.uid)
                        errors[ref.uid] = ""
                        log.info("claim %s/%s (%s) unprepared", ref.namespace, ref.name, ref.uid)
                await self._save(checkpoint)
        except (NodeLockTimeout, CheckpointError) as err:
            for ref in claims:
                errors[ref.uid] = self._failed("Unprepare", ref, PrepareError(_state_error(err))).error
        return errors

    async def _current_annotations(self, ref: ClaimRef) -> dict[str, str]:
        """The claim's annotations if it still exists with this UID and this mode writes any."""
        if self._assigner.mode is not Mode.EAGER or not self._facts.client_mode:
            return {}
        try:
            obj = await self._kube.get_resource_claim(ref.namespace, ref.name)
        except KubeError:
            return {}  # gone (or unreachable): nothing to strip that anyone will read
        meta = obj.get("metadata", {})
        return dict(meta.get("annotations") or {}) if meta.get("uid") == ref.uid else {}

    async def _strip_annotations(self, ref: ClaimRef, annotations: dict[str, str]) -> None:
        cleanup = self._assigner.unprepare(ref.uid, annotations)
        if not cleanup.annotations_to_remove:
            return
        try:
            await self._kube.patch_resource_claim_annotations(
                ref.namespace, ref.name, dict.fromkeys(cleanup.annotations_to_remove), uid=ref.uid
            )
        except KubeError as err:  # the claim is going away; its annotations go with it
            log.info("claim %s/%s: register annotations not removed: %s", ref.namespace, ref.name, err)

    # ---------------------------------------------------------------------------------------------
    # Cleanup of interrupted Prepares

    async def cleanup_stale(self) -> int:
        """Roll back PrepareStarted claims whose API object is gone or has a new UID."""
        checkpoint = await self._load()
        stale = []
        for uid, entry in checkpoint.claims.items():
            if entry.state is not PrepareState.STARTED:
                continue
            try:
                obj = await self._kube.get_resource_claim(entry.namespace, entry.name)
            except NotFound:
                stale.append(ClaimRef(entry.namespace, uid, entry.name))
                continue
            if obj.get("metadata", {}).get("uid") != uid:
                stale.append(ClaimRef(entry.namespace, uid, entry.name))
        if not stale:
            return 0
        async with node_lock(self._lock_path, timeout=self._lock_timeout):
            checkpoint = await self._load()
            for ref in stale:
                entry = checkpoint.claims.get(ref.uid)
                if entry is not None and entry.state is PrepareState.STARTED:  # re-check under the lock
                    with self._timed("Cleanup", ref):
                        await self._remove_artifacts(ref.uid)
                        checkpoint = checkpoint.without_claim(ref.uid)
            await self._save(checkpoint)
        log.info("cleanup: rolled back %d interrupted Prepare(s)", len(stale))
        return len(stale)

    async def run_cleanup(self, ready: Callable[[], None], interval: float = CLEANUP_INTERVAL) -> None:
        """Supervised component: a pass at start, then every `interval` seconds."""
        ready()
        while True:
            await self.cleanup_stale()
            await trio.sleep(interval)

    # ---------------------------------------------------------------------------------------------
    # Shared

    def _timed(self, call: str, ref: ClaimRef) -> TimedCall:
        return self._recorder.timed("dra", call, claim_uid=ref.uid, pod_namespace=ref.namespace)

    def _failed(self, call: str, ref: ClaimRef, err: PrepareError) -> PrepareOutcome:
        """Log and record a claim that failed before any side effect; its reply entry."""
        log.warning("%s", err)
        self._recorder.record(
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

    async def _remove_artifacts(self, claim_uid: str) -> None:
        """Remove everything Prepare may have created for the claim: its directory and CDI spec."""
        for path in self._assigner.unprepare(claim_uid, {}).paths:
            await trio.to_thread.run_sync(remove_tree, Path(path))
        await trio.to_thread.run_sync(remove_spec, self._cdi_root, self.driver, claim_uid)

    async def _load(self) -> Checkpoint:
        return await trio.to_thread.run_sync(self._store.load)

    async def _save(self, checkpoint: Checkpoint) -> Checkpoint:
        """Persist (fsync: in a thread, so hooks on the event loop never wait on the disk) and index."""
        await trio.to_thread.run_sync(self._store.save, checkpoint)
        self._index(checkpoint)
        return checkpoint

    def _index(self, checkpoint: Checkpoint) -> None:
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


def _state_error(err: Exception) -> str:
    """The reply text when the node lock or the checkpoint fails a whole batch."""
    return f"node busy: {err}" if isinstance(err, NodeLockTimeout) else f"checkpoint: {err}"

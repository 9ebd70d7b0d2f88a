"""Register-call resolution: which directory gets pids.config, and is the caller allowed to write it.

One attempt (`Resolver.attempt`) gathers what the partition assigner needs (eager: the claim that
carries the register UUID and its reserved pods; lazy: the container's record, `vgpud.containers`), lets
it pick the target directory and candidate containers, and then accepts the first candidate the caller
really is (`vgpud.registry.identity`). Pods and claims come from watch-fed caches
(`vgpud.kube.informer`: this node's pods, every claim), never from an API call, so a register call costs
the API server nothing.

`Resolver.resolve` retries for up to 60 s, because what it waits for lags the caller by design: the
container store is rebuilt by the NRI plugin's first Synchronize after a restart, and the pod status
says Running only after the kubelet's next relist. A failure that only a changed pod or claim can turn
around (ObjectsPending, and the caches not synced yet) waits until the watch delivers a change of an
object the attempt read; one about this node's own facts (the container store, a directory, the cgroup
tree, which nothing announces) is re-checked every 40 ms, which reads local files only. Only a target
that can never exist (TargetNotFound: NOT_FOUND) and a caller that can never be the target (another pod,
no pod: PERMISSION_DENIED) end the wait early, as in the reference.

Where a candidate's pod object comes from: the eager path has the claim's reserved pods; the lazy path
reads the claim the container's record names (the checkpoint gives its name) and the pod in its
`reservedFor` with the requested UID. A device-plugin-fallback target (a pod vgpud did not inject) has
no claim, so its pod object is not consulted: there the caller must run in the requested pod (kernel
fact), the directory must already exist (vgpud never creates it), and the container name is taken from
the request; a process can thus write only PIDs of its own container, into a directory of its own pod.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import trio

from vgpud.containers.store import ContainerStore
from vgpud.kube import JsonObject
from vgpud.kube.informer import Informer, Key
from vgpud.partition.assigner import (
    Candidate,
    Mode,
    ObjectsPending,
    PartitionAssigner,
    RegisterQuery,
    ResolveError,
    ResolveFacts,
    Target,
    TargetNotFound,
)
from vgpud.partition.layout import LayoutError
from vgpud.partition.model import ClaimView, ModelError, parse_claim, parse_pod
from vgpud.registry.identity import Caller, NotTheCaller, WrongPod, verify_caller
from vgpud.registry.request import CallerRefused, ResolveTimeout, TargetGone

log = logging.getLogger("vgpud.registry")

POLL_INTERVAL = 0.04
RESOLVE_TIMEOUT = 60.0


# --------------------------------------------------------------------------------------------------
# Resolution


class ClaimKey(Protocol):
    """A claim by name and UID (`vgpud.dra.claimindex.ClaimRef` is one)."""

    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def name(self) -> str: ...


class ClaimIndex(Protocol):
    """What the registry asks the DRA driver's checkpoint (`vgpud.dra.claimindex.ClaimIndex` is one)."""

    def claim_for_register_uuid(self, register_uuid: str) -> ClaimKey | None:
        """The prepared claim whose partition got this register UUID (eager client mode)."""
        ...

    def prepared_claim(self, claim_uid: str) -> ClaimKey | None:
        """The claim with this UID if this node has prepared it."""
        ...

    def prepared_claim_uids(self) -> frozenset[str]:
        """Every claim this node has prepared."""
        ...

    def mode_of(self, claim_uid: str) -> Mode | None:
        """The partition mode the claim was prepared in (None: not prepared here)."""
        ...


@dataclass(frozen=True)
class Resolved:
    target: Target
    candidate: Candidate
    #: the container's host PIDs, ascending, the caller's among them
    pids: tuple[int, ...]


@dataclass
class _Gathered:
    facts: ResolveFacts
    #: pod UID -> pod object, for the pods the facts came with
    pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)


class Reads:
    """The cache entries one attempt looked at, with the version it saw (None: absent), so the wait
    after a failure subscribes to exactly those and notices a change that came before it did."""

    def __init__(self) -> None:
        self._seen: list[tuple[Informer, Key, str | None]] = []

    def get(self, cache: Informer, namespace: str, name: str) -> JsonObject | None:
        obj = cache.get(namespace, name)
        self._seen.append((cache, (namespace, name), _version(obj)))
        return obj

    def changed(self) -> bool:
        return any(_version(cache.get(*key)) != seen for cache, key, seen in self._seen)

    def subscribe(self, event: trio.Event) -> None:
        for cache, key, _ in self._seen:
            cache.subscribe(key, event)

    def unsubscribe(self, event: trio.Event) -> None:
        for cache, key, _ in self._seen:
            cache.unsubscribe(key, event)

    def __bool__(self) -> bool:
        return bool(self._seen)


def _version(obj: JsonObject | None) -> str | None:
    return None if obj is None else str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Resolver:
    def __init__(
        self,
        *,
        assigner: PartitionAssigner,
        pods: Informer,
        claim_objects: Informer,
        claims: ClaimIndex,
        containers: ContainerStore | None,
        cgroup_root: Path,
        driver_name: str,
        interval: float = POLL_INTERVAL,
        timeout: float = RESOLVE_TIMEOUT,
        other_assigner: PartitionAssigner | None = None,
    ) -> None:
        self.assigner = assigner
        #: the other mode's assigner, for claims prepared in it before a restart changed the mode
        self.other_assigner = other_assigner
        #: this node's pods and every claim, watch-fed (`vgpud.kube.informer`)
        self.pods = pods
        self.claim_objects = claim_objects
        self.claims = claims
        self.containers = containers
        self.cgroup_root = cgroup_root
        self.driver_name = driver_name
        self.interval = interval
        self.timeout = timeout

    @property
    def synced(self) -> bool:
        """Both caches have listed once."""
        return self.pods.synced and self.claim_objects.synced

    async def resolve(self, query: RegisterQuery, caller: Caller) -> Resolved:
        """Attempt at once, then again when an object it read changes (ObjectsPending) or at the next
        point of the `interval` grid (anything else), until `timeout` has passed."""
        if caller.membership is None or caller.membership.container_id is None:
            raise CallerRefused(f"caller {caller.describe()} is not a process of any pod's container")
        last: ResolveError | None = None
        with trio.move_on_after(self.timeout):
            start = trio.current_time()
            attempt = 0
            while True:
                reads = Reads()
                try:
                    if not self.synced:
                        raise _NotSynced("the pod and claim caches have not listed from the API server yet")
                    return await self.attempt(query, caller, reads)
                except TargetNotFound as err:
                    raise TargetGone(str(err)) from None
                except ResolveError as err:
                    last = err
                # the next grid point still ahead: a slow attempt skips points, never runs back to back
                elapsed = trio.current_time() - start
                attempt = max(attempt + 1, math.floor(elapsed / self.interval) + 1)
                await self._wait(last, reads, start + attempt * self.interval)
        reason = f"; last attempt: {last}" if last is not None else ""
        raise ResolveTimeout(
            f"no target for the caller after {self.timeout:g}s{reason}",
            mismatch=isinstance(last, NotTheCaller),
        )

    async def _wait(self, failure: ResolveError, reads: Reads, grid_point: float) -> None:
        """Until a change of an object the attempt read (or the caches' first list); for a failure
        about this node's own facts also until `grid_point`."""
        changed = trio.Event()
        caches = [cache for cache in (self.pods, self.claim_objects) if not cache.synced]
        reads.subscribe(changed)
        for cache in caches:
            cache.subscribe_synced(changed)
        try:
            if reads.changed():  # between the read and now (an attempt may await)
                return
            pending = isinstance(failure, ObjectsPending) and (bool(reads) or bool(caches))
            with trio.move_on_at(math.inf if pending else grid_point):
                await changed.wait()
        finally:
            reads.unsubscribe(changed)
            for cache in caches:
                cache.unsubscribe_synced(changed)

    async def attempt(self, query: RegisterQuery, caller: Caller, reads: Reads) -> Resolved:
        """One resolution from the caches as they are; ResolveError (retry), TargetNotFound or
        CallerRefused (final). `reads` collects the cache entries it looked at."""
        assigner, gathered = self._gather(query, reads)
        target = assigner.resolve(query, gathered.facts)
        assert caller.membership is not None
        mine = [c for c in target.candidates if c.pod_uid == caller.membership.pod_uid]
        if not mine:
            raise CallerRefused(
                f"caller {caller.describe()} may not register {_describe_target(target)}: "
                "it belongs to another pod"
            )
        pods = gathered.pods
        if assigner.mode is Mode.LAZY and target.claim_uid is not None:
            pods = self._pods_of_claim(target.claim_uid, caller.membership.pod_uid, reads)
        last: ResolveError | None = None
        for candidate in mine:
            pod = pods.get(candidate.pod_uid)
            if pod is None and target.claim_uid is not None:  # a prepared container: its pod decides
                last = ObjectsPending(
                    f"pod {candidate.pod_uid} is not among the claim's reserved pods on this node (yet)"
                )
                continue
            try:
                pids = verify_caller(caller, candidate, pod, self.cgroup_root)
            except WrongPod as err:
                raise CallerRefused(str(err)) from None
            except TargetNotFound:
                raise
            except ResolveError as err:
                last = err
                continue
            if not _is_dir(target.config_dir):  # made by Prepare, NRI or the device plugin; never here
                raise ResolveError(f"directory {target.config_dir} does not exist (yet)")
            return Resolved(target, candidate, pids)
        assert last is not None
        raise last

    # ---------------------------------------------------------------------------------------------
    # Facts

    def _gather(self, query: RegisterQuery, reads: Reads) -> tuple[PartitionAssigner, _Gathered]:
        """The assigner that decides (the claim's recorded mode where it is known) and its facts."""
        other = self.other_assigner
        if other is not None and other.mode is Mode.EAGER:
            ref = self.claims.claim_for_register_uuid(query.register_uuid) if query.register_uuid else None
            if ref is not None and self.claims.mode_of(ref.uid) is Mode.EAGER:
                return other, self._gather_eager(query, reads)
        if other is not None and other.mode is Mode.LAZY and query.pod_uid:
            claim_uid = self._lazy_claim_of(query)
            if claim_uid is not None:
                return other, _Gathered(ResolveFacts(cached_claim_uid=claim_uid, cache_synced=True))
        if self.assigner.mode is Mode.LAZY:
            store = self.containers
            entry = store.injected(query.pod_uid, query.container) if store is not None else None
            synced = store.synced if store is not None else True
            return self.assigner, _Gathered(
                ResolveFacts(cached_claim_uid=entry.claim_uid if entry else None, cache_synced=synced)
            )
        return self.assigner, self._gather_eager(query, reads)

    def _lazy_claim_of(self, query: RegisterQuery) -> str | None:
        """Eager mode, after a restart from lazy: the claim, prepared lazily, under which the NRI plugin
        of the previous run made this container's directory (no container store to ask now: the disk
        says)."""
        for claim_uid in sorted(self.claims.prepared_claim_uids()):
            if self.claims.mode_of(claim_uid) is not Mode.LAZY:
                continue
            try:
                base = self.assigner.layout.container_partition(
                    claim_uid, query.pod_uid, query.container
                ).base
            except LayoutError:
                return None
            if _is_dir(base):
                return claim_uid
        return None

    def _gather_eager(self, query: RegisterQuery, reads: Reads) -> _Gathered:
        ref = self.claims.claim_for_register_uuid(query.register_uuid) if query.register_uuid else None
        if ref is None:
            return _Gathered(ResolveFacts())
        claim = self._read_claim(ref, reads)
        if claim is None:
            return _Gathered(ResolveFacts())
        pods = self._reserved_pods(claim, reads)
        views = []
        for obj in pods.values():
            try:
                views.append(parse_pod(obj))
            except ModelError as err:
                raise ObjectsPending(str(err)) from None
        return _Gathered(ResolveFacts(claim=claim, pods=tuple(views)), pods)

    def _read_claim(self, ref: ClaimKey, reads: Reads) -> ClaimView | None:
        """The claim if the cache has it with the prepared UID. A prepared claim the cache lacks is
        not deleted (its pods hold it) but not seen yet: ObjectsPending."""
        obj = reads.get(self.claim_objects, ref.namespace, ref.name)
        if obj is None:
            raise ObjectsPending(f"claim {ref.namespace}/{ref.name} is not in the claim cache (yet)")
        if (obj.get("metadata") or {}).get("uid") != ref.uid:
            return None
        try:
            return parse_claim(obj, self.driver_name)
        except ModelError as err:
            raise ObjectsPending(str(err)) from None

    def _reserved_pods(
        self, claim: ClaimView, reads: Reads, only: str | None = None
    ) -> dict[str, Mapping[str, Any]]:
        """Pod UID -> pod object of the claim's reserved pods that the node's pod cache has with the
        reserved UID (pods of other nodes are never in it)."""
        found: dict[str, Mapping[str, Any]] = {}
        for reserved in claim.reserved_for:
            if only is not None and reserved.uid != only:
                continue
            obj = reads.get(self.pods, claim.namespace, reserved.name)
            if obj is not None and (obj.get("metadata") or {}).get("uid") == reserved.uid:
                found[reserved.uid] = obj
        return found

    def _pods_of_claim(self, claim_uid: str, pod_uid: str, reads: Reads) -> dict[str, Mapping[str, Any]]:
        """Lazy path: the pod `pod_uid` through the claim the container's record named; TargetNotFound
        when the claim is no longer prepared or was re-created, or the pod is no longer reserved (it will not
        come back)."""
        ref = self.claims.prepared_claim(claim_uid)
        if ref is None:
            raise TargetNotFound(f"claim {claim_uid} is not prepared on this node")
        claim = self._read_claim(ref, reads)
        if claim is None:
            raise TargetNotFound(f"claim {ref.namespace}/{ref.name} ({claim_uid}) no longer exists")
        if all(reserved.uid != pod_uid for reserved in claim.reserved_for):
            raise TargetNotFound(f"pod {pod_uid} no longer uses claim {ref.namespace}/{ref.name}")
        return self._reserved_pods(claim, reads, only=pod_uid)


class _NotSynced(ObjectsPending):
    """The caches have not listed yet: every object is unknown."""


def _is_dir(path: PurePosixPath) -> bool:
    return Path(path).is_dir()


def _describe_target(target: Target) -> str:
    who = ", ".join(f"{c.pod_uid}/{c.container}" for c in target.candidates)
    return f"{target.config_dir} (containers {who})"

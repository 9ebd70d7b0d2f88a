"""Eager (DRA-only) partitions: decided at Prepare from the claim's reservedFor snapshot (seed §5).

Containers and the vGPU requests they reference form a bipartite graph; each connected component
is one partition: one directory, one register UUID, shared by the containers in it (an init
container and the app container after it). The key scheme is the reference's, so directories and
claim annotations written by either implementation are read by the other:

- one container:  `pod-<sha256(podUID)[:12]>-<kind>/<name>`
- several:        `cg-<sha256("<c1>,<c2>,...|<r1>,<r2>,...")[:12]>` over sorted node names
- no consumer:    the sanitized request name (a fallback partition)

Because the snapshot can be partial, `candidates_by_key` maps every key a Prepare could have minted
for a container (its real key and the fallback key of each request it uses) back to it. What this
mode cannot fix is bug-2: a container that appears only after Prepare and references requests that
went to different partitions gets several directories and several UUIDs; `conflicts` reports it.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpud.partition.assigner import (
    Candidate,
    Cleanup,
    ContainerContext,
    DeviceEdits,
    InjectionPlan,
    Mode,
    ObjectsPending,
    PartitionConflict,
    PartitionError,
    PartitionRecord,
    PrepareResult,
    RegisterQuery,
    ResolveError,
    ResolveFacts,
    Target,
    TargetNotFound,
    claim_cleanup,
    device_plugin_target,
    is_register_uuid,
    register_annotation_key,
    register_annotations,
    require_pod_query,
)
from vgpud.partition.layout import (
    ENV_CLAIM_UID,
    ENV_REGISTER_UUID,
    Layout,
    LayoutError,
    partition_mounts,
)
from vgpud.partition.model import ClaimView, ContainerRef, PodView, claim_consumers
from vgpud.partition.nrionly import claim_across_pods


@dataclass(frozen=True)
class Partition:
    key: str
    #: sorted by node name; empty for a fallback partition
    containers: tuple[ContainerRef, ...]
    requests: tuple[str, ...]
    fallback: bool = False


@dataclass(frozen=True)
class PartitionInfo:
    partitions: Mapping[str, Partition] = field(hash=False)
    #: every allocated vGPU request -> its partition key (real or fallback)
    request_to_partition: Mapping[str, str] = field(hash=False)
    #: every plausible key -> the containers it may refer to (sorted by node name)
    candidates_by_key: Mapping[str, tuple[ContainerRef, ...]] = field(hash=False)

    @property
    def fallback(self) -> bool:
        """True when no container of the snapshot consumes any request (all keys are fallbacks)."""
        return all(p.fallback for p in self.partitions.values())


# --------------------------------------------------------------------------------------------------
# Keys


def short_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:12]


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def fallback_key(request: str) -> str:
    """The key of a request nobody consumes yet: its name with every other character as '-'."""
    return _UNSAFE.sub("-", request) or "unknown"


def partition_key(containers: Iterable[ContainerRef], requests: Iterable[str]) -> str:
    """The reference's key of a component: the same inputs give the same key on every node and run."""
    nodes = sorted(c.node for c in containers)
    if len(nodes) == 1:
        pod_uid, _, rest = nodes[0].partition("/")
        return f"pod-{short_hash(pod_uid)}-{rest}"
    return "cg-" + short_hash(",".join(nodes) + "|" + ",".join(sorted(requests)))


# --------------------------------------------------------------------------------------------------
# The graph


def _components(edges: Mapping[ContainerRef, Sequence[str]]) -> list[tuple[set[ContainerRef], set[str]]]:
    """Connected components of the bipartite container/request graph, by depth-first search."""
    users: dict[str, set[ContainerRef]] = {}
    for container, requests in edges.items():
        for request in requests:
            users.setdefault(request, set()).add(container)
    seen: set[ContainerRef] = set()
    found = []
    for start in edges:
        if start in seen:
            continue
        containers, requests_seen, stack = {start}, set[str](), [start]
        seen.add(start)
        while stack:
            for request in edges[stack.pop()]:
                if request in requests_seen:
                    continue
                requests_seen.add(request)
                for other in users[request] - seen:
                    seen.add(other)
                    containers.add(other)
                    stack.append(other)
        found.append((containers, requests_seen))
    return found


def _sorted_refs(refs: Iterable[ContainerRef]) -> tuple[ContainerRef, ...]:
    return tuple(sorted(set(refs), key=lambda ref: ref.node))


def resolve_partitions(claim: ClaimView, pods: Iterable[PodView]) -> PartitionInfo:
    """Partition the claim's vGPU requests among the containers of its reserved pods."""
    consumers = claim_consumers(claim, pods)
    partitions: dict[str, Partition] = {}

    def add(partition: Partition) -> None:
        if partition.key in partitions:
            raise PartitionError(
                f"claim {claim.namespace}/{claim.name}: partition key {partition.key!r} "
                "is minted twice (a request name equals a generated key)"
            )
        partitions[partition.key] = partition

    for containers, requests in _components(consumers):
        add(Partition(partition_key(containers, requests), _sorted_refs(containers), tuple(sorted(requests))))
    consumed = {r for p in partitions.values() for r in p.requests}
    for request in claim.requests:
        if request not in consumed:
            add(Partition(fallback_key(request), (), (request,), fallback=True))

    request_to_partition = {r: p.key for p in partitions.values() for r in p.requests}
    candidates: dict[str, set[ContainerRef]] = {}
    for container, requests in consumers.items():
        candidates.setdefault(request_to_partition[requests[0]], set()).add(container)
        for request in requests:
            candidates.setdefault(fallback_key(request), set()).add(container)
    return PartitionInfo(
        partitions=dict(sorted(partitions.items())),
        request_to_partition=dict(sorted(request_to_partition.items())),
        candidates_by_key={key: _sorted_refs(refs) for key, refs in sorted(candidates.items())},
    )


# --------------------------------------------------------------------------------------------------
# Register UUIDs


def new_register_uuid() -> str:
    return str(uuid.uuid4())


def mint_register_uuids(
    keys: Iterable[str], annotations: Mapping[str, str], driver: str, new_uuid: Callable[[], str]
) -> dict[str, str]:
    """One UUID per partition key, reusing the one a previous Prepare recorded on the claim."""
    recorded: dict[str, str] = {}
    for register_uuid, key in sorted(register_annotations(annotations, driver).items()):
        recorded.setdefault(key, register_uuid)
    minted = {}
    for key in sorted(keys):
        value = recorded.get(key) or new_uuid()
        if not is_register_uuid(value):
            raise ValueError(f"new_uuid returned {value!r}, not a lower-case UUID")
        minted[key] = value
    return minted


# --------------------------------------------------------------------------------------------------
# The assigner


def _conflict_reason(
    ref: ContainerRef,
    requests: Sequence[str],
    keys: Sequence[str],
    uuids: Sequence[str],
    destinations: Sequence[str],
) -> str:
    text = (
        f"container {ref.node} references requests {', '.join(requests)}, which Prepare put into "
        f"{len(keys)} partitions ({', '.join(keys)}); its CDI devices mount "
        f"{', '.join(destinations)} once per partition, so the destinations collide"
    )
    if uuids:
        text += (
            f", and {ENV_REGISTER_UUID} is set to {len(uuids)} values ({', '.join(uuids)}) of which "
            "one survives, so only that partition's pids.config is ever written"
        )
    return text + " (bug-2)"


class EagerAssigner:
    """DRA-only mode: partitions at Prepare; register UUIDs in client mode."""

    mode = Mode.EAGER

    def __init__(
        self,
        layout: Layout,
        *,
        driver: str,
        client_mode: bool,
        new_uuid: Callable[[], str] = new_register_uuid,
    ) -> None:
        self.layout = layout
        self.driver = driver
        self.client_mode = client_mode
        self.new_uuid = new_uuid

    def prepare(self, claim: ClaimView, pods: Sequence[PodView]) -> PrepareResult:
        """Refuses (`NriOnlyUse`) a vGPU claim reserved for several pods. A container that also uses
        another vGPU claim is refused by the DRA side, which can look that claim up
        (`vgpud.dra.nrionly`)."""
        if (refused := claim_across_pods(claim, pods, self.driver)) is not None:
            raise refused
        info = resolve_partitions(claim, pods)
        uuids = (
            mint_register_uuids(info.partitions, claim.annotations, self.driver, self.new_uuid)
            if self.client_mode
            else {}
        )
        paths = {key: self.layout.partition(claim.uid, key) for key in info.partitions}
        annotations = {key: {register_annotation_key(self.driver, u): key} for key, u in uuids.items()}
        devices = []
        for device in claim.devices:
            key = info.request_to_partition[device.request]
            env = {ENV_REGISTER_UUID: uuids[key]} if key in uuids else {}
            devices.append(
                DeviceEdits(
                    device, env, partition_mounts(self.layout, paths[key]), annotations.get(key, {}), key
                )
            )
        to_add = {
            name: key
            for per_key in annotations.values()
            for name, key in per_key.items()
            if claim.annotations.get(name) != key
        }
        return PrepareResult(
            claim_uid=claim.uid,
            claim_dir=self.layout.claim_dir(claim.uid),
            claim_env={ENV_CLAIM_UID: ""},
            devices=tuple(devices),
            annotations=dict(sorted(to_add.items())),
            partition_dirs=tuple(paths.values()),
            record=PartitionRecord(dict(info.request_to_partition), uuids),
        )

    def inject(self, context: ContainerContext) -> InjectionPlan | None:
        """Nothing: without NRI the CDI devices carry every edit."""
        return None

    def resolve(self, query: RegisterQuery, facts: ResolveFacts) -> Target:
        if query.register_uuid:
            try:
                return self._by_uuid(query.register_uuid, facts)
            except ResolveError:
                if not (query.pod_uid and query.container):
                    raise
        require_pod_query(query)
        return device_plugin_target(self.layout, query)

    def _by_uuid(self, register_uuid: str, facts: ResolveFacts) -> Target:
        claim = facts.claim
        if claim is None:
            raise TargetNotFound(f"no claim carries register UUID {register_uuid}")
        key = register_annotations(claim.annotations, self.driver).get(register_uuid)
        if not key:
            raise ObjectsPending(
                f"claim {claim.namespace}/{claim.name} has no annotation {self.driver}/{register_uuid}"
            )
        candidates = resolve_partitions(claim, facts.pods).candidates_by_key.get(key, ())
        if not candidates:
            raise ObjectsPending(
                f"partition {key!r} of claim {claim.namespace}/{claim.name} has no "
                "container among the reserved pods (yet)"
            )
        try:
            config_dir = self.layout.partition(claim.uid, key).config
        except LayoutError as err:
            raise TargetNotFound(str(err)) from None
        return Target(
            config_dir=config_dir,
            candidates=tuple(Candidate.of(c) for c in candidates),
            claim_uid=claim.uid,
            partition_key=key,
        )

    def conflicts(
        self, record: PartitionRecord, claim: ClaimView, pods: Sequence[PodView]
    ) -> tuple[PartitionConflict, ...]:
        found = []
        for ref, requests in claim_consumers(claim, pods).items():
            keys = sorted({record.request_partitions[r] for r in requests if r in record.request_partitions})
            if len(keys) < 2:
                continue
            uuids = [record.register_uuids[k] for k in keys if k in record.register_uuids]
            destinations = [
                m.container_path
                for m in partition_mounts(self.layout, self.layout.partition(claim.uid, keys[0]))
            ]
            found.append(
                PartitionConflict(
                    ref, tuple(keys), _conflict_reason(ref, requests, keys, uuids, destinations)
                )
            )
        return tuple(found)

    def unprepare(self, claim_uid: str, annotations: Mapping[str, str]) -> Cleanup:
        return claim_cleanup(self.layout, claim_uid, annotations, self.driver)

    def remove_container(self, claim_uid: str, pod_uid: str, container: str) -> Cleanup:
        """Nothing: a partition directory may be shared; Unprepare removes it with the claim."""
        return Cleanup()

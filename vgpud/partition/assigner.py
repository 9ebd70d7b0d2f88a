"""The `PartitionAssigner` interface and the values it hands to its four users (seed §3.2, §9).

- DRA Prepare: `prepare` -> per CDI device the mounts, env and claim annotations, the directories to
  create and a `PartitionRecord` for the checkpoint.
- NRI CreateContainer: `inject` -> the per-container mounts and env (lazy only).
- registry: `resolve` -> which directory a register call writes pids.config into, and who may call.
- Unprepare / RemoveContainer: `unprepare` / `remove_container` -> what to delete.

Eager (DRA-only) and lazy (NRI) implement it; callers never branch on the mode. Everything here is
a pure value; the callers do the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any, Protocol

from vgpud.partition.layout import Layout, LayoutError, Mount, PartitionPaths
from vgpud.partition.model import AllocatedDevice, ClaimView, ContainerRef, PodView


class Mode(StrEnum):
    EAGER = "eager"
    LAZY = "lazy"


class PartitionError(Exception):
    """Base of the errors an assigner raises."""


class ClaimRefused(PartitionError):
    """Prepare cannot serve this claim in this mode (e.g. eager and reserved for several pods)."""


class ResolveError(PartitionError):
    """A register call cannot be resolved now; the registry retries until its deadline."""


class TargetNotFound(ResolveError):
    """A register call can never be resolved; the registry stops polling at once."""


class ObjectsPending(ResolveError):
    """Only a change of an API object (the claim, a pod) can resolve this: the registry retries when
    its watch delivers one, not on a timer."""


# --------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class DeviceEdits:
    """What Prepare adds to one CDI device (one allocation result) beyond the per-device limits."""

    device: AllocatedDevice
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    mounts: tuple[Mount, ...] = ()
    #: claim annotations this device's partition needs (eager client mode: `<driver>/<uuid>: <key>`)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    partition_key: str | None = None


@dataclass(frozen=True)
class PartitionRecord:
    """What Prepare decided, kept in the checkpoint: request -> partition key, key -> register UUID."""

    request_partitions: Mapping[str, str] = field(default_factory=dict, hash=False)
    register_uuids: Mapping[str, str] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {
            "requestPartitions": dict(sorted(self.request_partitions.items())),
            "registerUUIDs": dict(sorted(self.register_uuids.items())),
        }

    @classmethod
    def from_dict(cls, obj: Any) -> PartitionRecord:
        """The inverse of `to_dict`; ValueError when a checkpoint entry is not one."""
        if not isinstance(obj, Mapping):
            raise ValueError("partition record: expected an object")
        parts = []
        for name in ("requestPartitions", "registerUUIDs"):
            value = obj.get(name) or {}
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError(f"partition record: {name} must map strings to strings")
            parts.append(dict(value))
        return cls(*parts)


@dataclass(frozen=True)
class PrepareResult:
    claim_uid: str
    #: `claims/<claimUID>`, (re)created empty at Prepare and removed at Unprepare
    claim_dir: PurePosixPath
    #: claim-common env that depends on the mode (MANAGER_VGPU_CLAIM_UID)
    claim_env: Mapping[str, str] = field(hash=False)
    #: one entry per vGPU allocation result, in result order
    devices: tuple[DeviceEdits, ...]
    #: annotations to add to the claim (only those not already on it)
    annotations: Mapping[str, str] = field(hash=False)
    #: partition directories to create now, each with a fresh pids.config (eager only)
    partition_dirs: tuple[PartitionPaths, ...]
    record: PartitionRecord


@dataclass(frozen=True)
class ContainerContext:
    """What the NRI plugin knows at CreateContainer; the claim UID is already validated as prepared."""

    claim_uid: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    container: str


@dataclass(frozen=True)
class Candidate:
    """A container that may be the caller of a register request."""

    pod_uid: str
    container: str

    @classmethod
    def of(cls, ref: ContainerRef) -> Candidate:
        return cls(ref.pod_uid, ref.name)


@dataclass(frozen=True)
class Target:
    """Where a register call's pids.config goes, and which containers may make that call."""

    config_dir: PurePosixPath
    candidates: tuple[Candidate, ...]
    claim_uid: str | None = None
    partition_key: str | None = None


@dataclass(frozen=True)
class InjectionPlan:
    """NRI CreateContainer: create `paths`, reset pids.config, add `mounts` and `env`."""

    target: Target
    paths: PartitionPaths
    env: Mapping[str, str] = field(hash=False)
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class RegisterQuery:
    """The register call as it arrives (untrusted): `register_uuid`, or `pod_uid` + `container`."""

    register_uuid: str = ""
    pod_uid: str = ""
    container: str = ""


@dataclass(frozen=True)
class ResolveFacts:
    """What vgpud knows when resolving: eager reads the claim, lazy the NRI cache."""

    #: the claim whose annotations carry the register UUID (the informer's UUID index)
    claim: ClaimView | None = None
    #: the pods that claim is reserved for
    pods: tuple[PodView, ...] = ()
    #: the NRI cache entry for (pod_uid, container): its claim UID
    cached_claim_uid: str | None = None
    #: whether the NRI cache has been rebuilt by a first Synchronize
    cache_synced: bool = False


@dataclass(frozen=True)
class Cleanup:
    """Directories to remove recursively and claim annotations to strip."""

    paths: tuple[PurePosixPath, ...] = ()
    annotations_to_remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionConflict:
    """A container whose devices come from more than one partition (bug-2); the metric counts these."""

    container: ContainerRef
    partitions: tuple[str, ...]
    reason: str


# --------------------------------------------------------------------------------------------------
# The interface


class PartitionAssigner(Protocol):
    mode: Mode
    layout: Layout

    def prepare(self, claim: ClaimView, pods: Sequence[PodView]) -> PrepareResult:
        """Prepare time: the CDI edits of each vGPU device of `claim`, given its reserved `pods`."""
        ...

    def inject(self, context: ContainerContext) -> InjectionPlan | None:
        """CreateContainer time: the per-container edits, or None when the CDI edits are all."""
        ...

    def resolve(self, query: RegisterQuery, facts: ResolveFacts) -> Target:
        """Register time: the target directory; ResolveError (retry) or TargetNotFound (give up)."""
        ...

    def conflicts(
        self, record: PartitionRecord, claim: ClaimView, pods: Sequence[PodView]
    ) -> tuple[PartitionConflict, ...]:
        """Containers that now reference requests Prepare put into different partitions."""
        ...

    def unprepare(self, claim_uid: str, annotations: Mapping[str, str]) -> Cleanup: ...

    def remove_container(self, claim_uid: str, pod_uid: str, container: str) -> Cleanup: ...


# --------------------------------------------------------------------------------------------------
# Shared by both assigners

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_register_uuid(value: str) -> bool:
    return bool(_UUID.fullmatch(value))


def register_annotation_key(driver: str, register_uuid: str) -> str:
    """`<driver>/<uuid>`: the claim annotation whose value is the UUID's partition key."""
    if not is_register_uuid(register_uuid):
        raise ValueError(f"register UUID {register_uuid!r} is not a lower-case UUID")
    return f"{driver}/{register_uuid}"


def register_annotations(annotations: Mapping[str, str], driver: str) -> dict[str, str]:
    """UUID -> partition key from the claim's `<driver>/<uuid>` annotations.

    Only UUID-shaped names count, so another `<driver>/...` annotation is never read (or stripped)
    as one of ours.
    """
    prefix = f"{driver}/"
    return {
        key[len(prefix) :]: value
        for key, value in annotations.items()
        if key.startswith(prefix) and is_register_uuid(key[len(prefix) :])
    }


def claim_cleanup(layout: Layout, claim_uid: str, annotations: Mapping[str, str], driver: str) -> Cleanup:
    """Unprepare in either mode: the whole claim dir, and any register annotations (a node that
    switched modes may have left some)."""
    return Cleanup(
        paths=(layout.claim_dir(claim_uid),),
        annotations_to_remove=tuple(
            sorted(f"{driver}/{u}" for u in register_annotations(annotations, driver))
        ),
    )


def device_plugin_target(layout: Layout, query: RegisterQuery) -> Target:
    """A pod-UID register call for a container vgpud did not inject: the device-plugin directory."""
    try:
        config_dir = layout.device_plugin_config_dir(query.pod_uid, query.container)
    except LayoutError as err:
        raise TargetNotFound(f"register request names no valid container: {err}") from None
    return Target(config_dir=config_dir, candidates=(Candidate(query.pod_uid, query.container),))


def require_pod_query(query: RegisterQuery) -> None:
    if not (query.pod_uid and query.container):
        raise TargetNotFound("a register request needs register_uuid, or pod_uid and container_name")

"""What a container ends up with: a model of kubelet + CDI + NRI, for the interface tests.

The kubelet hands a container the CDI devices of the requests it references; CDI applies each
device's env and mounts in turn (a later value of an env var wins, two mounts on one destination both
happen and the last one shadows the first); then the NRI plugin, when the env marks a claim UID, adds
its adjustment. Collisions are recorded, not resolved: they are what bug-2 is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpud.partition.assigner import (
    ContainerContext,
    DeviceEdits,
    InjectionPlan,
    PartitionAssigner,
    PrepareResult,
    RegisterQuery,
    ResolveFacts,
)
from vgpud.partition.edits import device_env
from vgpud.partition.layout import (
    CONT_CONFIG_DIR,
    ENV_CLAIM_UID,
    ENV_CONTAINER_NAME,
    ENV_POD_UID,
    ENV_REGISTER_UUID,
    Mount,
)
from vgpud.partition.model import ClaimView, PodView, container_requests

TOTAL_MEMORY = 16 << 30


def gpu_index(device_name: str) -> int:
    """Devices are named vgpu-<minor>; the mock host's NVML index equals the minor."""
    return int(device_name.rsplit("-", 1)[1])


def gpu_uuid(device_name: str) -> str:
    return f"GPU-{gpu_index(device_name):08d}-0000-4000-8000-000000000000"


@dataclass
class ContainerView:
    env: dict[str, str] = field(default_factory=dict)
    env_collisions: dict[str, list[str]] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    mount_collisions: dict[str, list[str]] = field(default_factory=dict)
    devices: list[DeviceEdits] = field(default_factory=list)
    injection: InjectionPlan | None = None

    def apply(self, env: Mapping[str, str], mounts: Sequence[Mount]) -> None:
        for name, value in env.items():
            if name in self.env and self.env[name] != value:
                self.env_collisions.setdefault(name, [self.env[name]]).append(value)
            self.env[name] = value
        for mount in mounts:
            if mount in self.mounts:
                continue
            clash = [m for m in self.mounts if m.container_path == mount.container_path]
            if clash:
                self.mount_collisions.setdefault(mount.container_path, [clash[0].host_path]).append(
                    mount.host_path
                )
            self.mounts.append(mount)

    def mounts_at(self, container_path: object) -> list[Mount]:
        return [m for m in self.mounts if m.container_path == str(container_path)]

    @property
    def config_mounts(self) -> list[Mount]:
        return self.mounts_at(CONT_CONFIG_DIR)

    def register_query(self) -> RegisterQuery:
        """What the library sends: everything its env gives it."""
        return RegisterQuery(
            register_uuid=self.env.get(ENV_REGISTER_UUID, ""),
            pod_uid=self.env.get(ENV_POD_UID, ""),
            container=self.env.get(ENV_CONTAINER_NAME, ""),
        )


def start_container(
    assigner: PartitionAssigner, prepared: PrepareResult, claim: ClaimView, pod: PodView, name: str
) -> ContainerView:
    """Create container `name` of `pod` after `prepared` (Prepare of `claim`)."""
    view = ContainerView()
    spec = pod.container(name)
    assert spec is not None, name
    requests = container_requests(claim, pod).get(spec.ref, ())
    view.devices = [d for d in prepared.devices if d.device.request in requests]
    for edits in view.devices:
        limits = device_env(
            gpu_index(edits.device.device),
            gpu_uuid(edits.device.device),
            total_memory=TOTAL_MEMORY,
            consumed_capacity=edits.device.consumed_capacity,
        )
        view.apply({**prepared.claim_env, **limits, **edits.env}, edits.mounts)
    if view.env.get(ENV_CLAIM_UID):
        view.injection = assigner.inject(
            ContainerContext(
                claim_uid=view.env[ENV_CLAIM_UID],
                pod_uid=pod.uid,
                pod_name=pod.name,
                pod_namespace=pod.namespace,
                container=name,
            )
        )
        if view.injection is not None:
            view.apply(view.injection.env, view.injection.mounts)
    return view


def resolve_facts(claim: ClaimView, pods: Sequence[PodView], view: ContainerView) -> ResolveFacts:
    """What vgpud would know at register time: the claim (eager) or the NRI cache entry (lazy)."""
    cached = view.injection.target.claim_uid if view.injection is not None else None
    return ResolveFacts(claim=claim, pods=tuple(pods), cached_claim_uid=cached, cache_synced=True)

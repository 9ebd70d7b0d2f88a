"""Lazy (NRI) assignment: one directory per (claim, pod, container), decided at CreateContainer.

Seed §12.2-§12.3: no graph, no keys to alias, no register UUIDs, no claim annotations. Prepare only
marks the container's env with the claim UID (MANAGER_VGPU_CLAIM_UID) so the NRI plugin can tell
which claim a new container belongs to; the plugin creates `claims/<claimUID>/<podUID>_<container>/`
and mounts it. A container that references several requests gets one directory and one set of
mounts, so bug-2 cannot happen. This is safe because no two concurrent containers share a vGPU
request (the webhook's invariant, seed §12.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpud.partition.assigner import (
    Candidate,
    Cleanup,
    ContainerContext,
    DeviceEdits,
    InjectionPlan,
    Mode,
    PartitionConflict,
    PartitionRecord,
    PrepareResult,
    RegisterQuery,
    ResolveError,
    ResolveFacts,
    Target,
    TargetNotFound,
    claim_cleanup,
    device_plugin_target,
    require_pod_query,
)
from vgpud.partition.layout import (
    ENV_CLAIM_UID,
    ENV_CONTAINER_NAME,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_REGISTER_UUID,
    Layout,
    LayoutError,
    Mount,
    PartitionPaths,
    container_dir_name,
    partition_mounts,
)
from vgpud.partition.model import ClaimView, PodView


class LazyAssigner:
    """NRI mode: per-container directories; the library registers by pod UID + container name."""

    mode = Mode.LAZY

    def __init__(self, layout: Layout, *, driver: str) -> None:
        self.layout = layout
        self.driver = driver

    def prepare(self, claim: ClaimView, pods: Sequence[PodView]) -> PrepareResult:
        """Only the claim UID marker; partition mounts and UUIDs are skipped (seed §12.4)."""
        return PrepareResult(
            claim_uid=claim.uid,
            claim_dir=self.layout.claim_dir(claim.uid),
            claim_env={ENV_CLAIM_UID: claim.uid},
            devices=tuple(DeviceEdits(device) for device in claim.devices),
            annotations={},
            partition_dirs=(),
            record=PartitionRecord(),
        )

    def paths(self, claim_uid: str, pod_uid: str, container: str) -> PartitionPaths:
        return self.layout.container_partition(claim_uid, pod_uid, container)

    def _target(self, claim_uid: str, pod_uid: str, container: str) -> tuple[Target, PartitionPaths]:
        paths = self.paths(claim_uid, pod_uid, container)
        target = Target(
            config_dir=paths.config,
            candidates=(Candidate(pod_uid, container),),
            claim_uid=claim_uid,
            partition_key=container_dir_name(pod_uid, container),
        )
        return target, paths

    def inject(self, context: ContainerContext) -> InjectionPlan:
        target, paths = self._target(context.claim_uid, context.pod_uid, context.container)
        env, mounts = self.injection(context, paths)
        return InjectionPlan(target=target, paths=paths, env=env, mounts=mounts)

    def injection(
        self, context: ContainerContext, paths: PartitionPaths
    ) -> tuple[dict[str, str], tuple[Mount, ...]]:
        """The env and mounts `inject` gives the container whose directory is `paths` (a Synchronize
        checks running containers against them without building the registry's target)."""
        env = {
            ENV_POD_NAME: context.pod_name,
            ENV_POD_NAMESPACE: context.pod_namespace,
            ENV_POD_UID: context.pod_uid,
            ENV_CONTAINER_NAME: context.container,
            # blank whatever the image or a stale CDI spec set: the library must register by pod UID
            ENV_REGISTER_UUID: "",
        }
        return env, partition_mounts(self.layout, paths)

    def resolve(self, query: RegisterQuery, facts: ResolveFacts) -> Target:
        """The NRI cache decides (seed §12.8): hit -> the container's directory; miss before the first
        Synchronize -> retry; miss after -> not a container we injected: the device-plugin directory.
        A register UUID means nothing here (none is minted) unless pod UID + container come with it.
        """
        if query.register_uuid and not (query.pod_uid and query.container):
            raise TargetNotFound(f"register UUID {query.register_uuid}: NRI mode mints no register UUIDs")
        require_pod_query(query)
        if facts.cached_claim_uid:
            try:
                return self._target(facts.cached_claim_uid, query.pod_uid, query.container)[0]
            except LayoutError as err:
                raise TargetNotFound(str(err)) from None
        if not facts.cache_synced:
            raise ResolveError("the NRI cache is not synchronized yet")
        return device_plugin_target(self.layout, query)

    def conflicts(
        self, record: PartitionRecord, claim: ClaimView, pods: Sequence[PodView]
    ) -> tuple[PartitionConflict, ...]:
        """None by construction: every container has exactly one directory."""
        return ()

    def unprepare(self, claim_uid: str, annotations: Mapping[str, str]) -> Cleanup:
        return claim_cleanup(self.layout, claim_uid, annotations, self.driver)

    def remove_container(self, claim_uid: str, pod_uid: str, container: str) -> Cleanup:
        """The container's own directory (DESIGN §5; the reference only drops the cache entry)."""
        return Cleanup(paths=(self.paths(claim_uid, pod_uid, container).base,))

"""What a Synchronize finds of the containers with a vGPU claim UID in their env (seed §12.8).

The container env is the durable fact (`MANAGER_VGPU_CLAIM_UID` survives in the persisted OCI spec), so
after every reconnect each such container is validated again exactly as CreateContainer would: a
claim this node prepared, reserved for its pod, a layout-valid directory. A valid live one whose
mounts and env lack the injection (created while vgpud was down, or after the runtime dropped the
plugin for a missed deadline) is MISSING, not INJECTED; one that does not validate is REFUSED and
counted. One pass of string work per container: a node reports thousands.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import NamedTuple

from vgpud.containers.record import Injection, NodeContainer
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventSink, Reason, pod_ref
from vgpud.logs import pod_fields
from vgpud.nri.sync import SyncContainer, SyncPod
from vgpud.nri.verify import missing_injection
from vgpud.partition.admission import Admission, Verdict
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import LayoutError, PartitionPaths
from vgpud.partition.lazy import LazyAssigner

log = logging.getLogger("vgpud.nri")

#: how many of `NodeContainer`'s fields the runtime reports (the rest are `ClaimFacts`)
RUNTIME_FIELDS = NodeContainer._fields.index("claim_uid")

#: per-container warnings one Synchronize logs; beyond that only the count in its summary line
SYNC_WARNINGS_SHOWN = 10

#: (claim UID, pod namespace, pod UID) -> the admission verdict (`ClaimAdmission.check`)
AdmissionCheck = Callable[[str, str, str], Admission]
#: told each container that does not validate, and why
InvalidListener = Callable[[SyncContainer, str], None]


class ClaimFacts(NamedTuple):
    """The vGPU fields of one container's record: `NodeContainer`'s fields after RUNTIME_FIELDS, in
    its order (a test holds them in step)."""

    claim_uid: str
    injection: Injection
    directory: PurePosixPath | None = None
    missing: tuple[str, ...] = ()


def claim_facts(
    pods: dict[str, SyncPod],
    claimed: list[SyncContainer],
    *,
    assigner: LazyAssigner,
    check: AdmissionCheck,
    invalid: InvalidListener,
) -> dict[str, ClaimFacts]:
    """Container ID -> its vGPU fields, for each claimed container whose pod the runtime reported (a
    container without one has no pod UID to be found by: left out, and told to `invalid`)."""
    found: dict[str, ClaimFacts] = {}
    layout = assigner.layout
    refused = _RefusedFacts()
    for container in claimed:
        claim_uid = container.claim_uid
        pod = pods.get(container.pod_sandbox_id)
        if pod is None:
            invalid(container, f"its pod sandbox {container.pod_sandbox_id} was not reported")
            continue
        verdict = check(claim_uid, pod.namespace, pod.uid)
        try:
            base = layout.container_dir_text(claim_uid, pod.uid, container.name)
        except LayoutError as err:
            found[container.id] = refused[claim_uid]
            invalid(container, str(err))
            continue
        # a pod that joined the claim after Prepare, before the claim watch of this run has
        # listed: its directory proves an earlier admission (a refused pod never gets one)
        joined = verdict.verdict is Verdict.NOT_RESERVED and os.path.isdir(base)
        if not (verdict.inject or joined):
            found[container.id] = refused[claim_uid]
            invalid(container, verdict.reason)
            continue
        found[container.id] = _valid_facts(assigner, container, pod, PartitionPaths.of(base))
    return found


class _RefusedFacts(dict[str, ClaimFacts]):
    """Claim UID -> the facts of a container refused under it: one immutable tuple per claim, not
    one per container (a node may report thousands)."""

    def __missing__(self, claim_uid: str) -> ClaimFacts:
        facts = self[claim_uid] = ClaimFacts(claim_uid, Injection.REFUSED)
        return facts


def _valid_facts(
    assigner: LazyAssigner, container: SyncContainer, pod: SyncPod, paths: PartitionPaths
) -> ClaimFacts:
    """A container valid here: INJECTED, or MISSING with what of its injection it lacks. An exited
    container runs nothing that could register: only live ones are checked, against the injection
    (built only for them: most of the per-container time)."""
    missing: tuple[str, ...] = ()
    if not container.stopped:
        ctx = ContainerContext(container.claim_uid, pod.uid, pod.name, pod.namespace, container.name)
        env, mounts = assigner.injection(ctx, paths)
        missing = missing_injection(mounts, env, container.mounts, container.env)
    state = Injection.MISSING if missing else Injection.INJECTED
    return ClaimFacts(container.claim_uid, state, paths.base, missing)


def warn_not_injected(
    found_now: Sequence[NodeContainer], warned: set[str], events: EventSink | None = None
) -> set[str]:
    """One WARNING line per container found without its injection (once, not per Synchronize: `warned`
    are the IDs already told, the result those to remember), for the first SYNC_WARNINGS_SHOWN new
    ones, then one line with how many more: a node may have thousands, and every one is in the debug
    state and the metric. Each new one is also a VGPUNotInjected Event on its pod (what the pod's
    owner sees; the recorder's spam filter bounds them per pod)."""
    new = [found for found in found_now if found.container_id not in warned]
    if events is not None:
        for found in new:
            events.record(
                pod_ref(found.pod_namespace, found.pod_name, found.pod_uid),
                EventType.WARNING,
                Reason.VGPU_NOT_INJECTED,
                f"container {found.name} runs without its vGPU injection (missing "
                f"{', '.join(found.missing)}): it was created while vgpud was away, and the runtime "
                "cannot evict it: recreate the pod",
            )
    for found in new[:SYNC_WARNINGS_SHOWN]:
        log.warning(
            "NRI: container %s (%s) of pod %s/%s runs without its vGPU injection (missing %s): it "
            "was created while vgpud was away; the runtime cannot evict it, recreate its pod",
            found.name,
            found.container_id,
            found.pod_namespace,
            found.pod_name,
            ", ".join(found.missing),
            extra=pod_fields(
                found.pod_namespace, found.pod_name, container=found.name, claim=found.claim_uid
            ),
        )
    if len(new) > SYNC_WARNINGS_SHOWN:
        log.warning(
            "NRI: %d more containers run without their vGPU injection (not listed here): "
            "`vgpud debug state` lists every one under nri.not_injected",
            len(new) - SYNC_WARNINGS_SHOWN,
        )
    return {found.container_id for found in found_now}

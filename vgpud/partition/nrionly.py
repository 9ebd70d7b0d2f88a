"""The uses of a vGPU claim a node's mode cannot serve, as Prepare refuses them (pure): those only an
NRI node can serve, on an eager node, and one no node can serve, on an NRI node.

The webhook lifts two rules only for claims that select NRI nodes (`vgpud.relaxations`); an eager
node's Prepare refuses such a use anyway, in case a claim got there (allocated by hand, or a webhook
with the relaxation on and no selector check). Eager partitions are decided per claim at Prepare:

- `Relaxation.CLAIM_ACROSS_PODS`: a vGPU claim reserved for more than one pod; its partitions would
  span pods, whose containers come and go independently of the one Prepare;
- `Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER`: a container of a reserved pod that uses this claim's
  vGPU devices also uses another vGPU claim's (allocated to the same driver): each claim's CDI spec
  mounts its own partition at the same destinations, and its env replaces the other's.

The rules need the reserved pods and, for the second, the other claims those containers use; the
lookups are the caller's (`vgpud.dra.gather`, `vgpud.dra.nrionly`): `other_claims` says which,
`multiple_claims` judges.

An NRI (lazy) node serves both relaxations but one use of the first: a container whose vGPU claims
have devices on the same GPU (`claims_share_a_gpu`, `RefusalReason.CLAIMS_SHARE_A_GPU`). The limits a
container gets are named per GPU host index (`vgpud.partition.edits`), and containerd applies the
claims' CDI env replace-by-name, so one value per name (the later claim's) reaches the container and
vgpud's NRI hook: the earlier claim's share of that GPU would go unenforced (docs/decisions.md). Only
a claim with a neighbour (another vGPU claim of its namespace on one of its GPUs: `gpu_claims`,
`gpu_neighbours`) can be refused so: an NRI Prepare reads the reserved pods of no other claim.

`use_refusal` is the one verdict Prepare asks for, from the facts it gathered once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from vgpud.partition.assigner import ClaimRefused, Mode
from vgpud.partition.model import ClaimView, ContainerRef, PodView, claim_consumers, container_requests
from vgpud.relaxations import Relaxation, nri_selector


class RefusalReason(StrEnum):
    """Why a Prepare refused a vGPU claim: the `reason` label of vgpud_prepare_refusals_total (the
    one place these values are spelled)."""

    #: eager mode: a container uses more than one vGPU claim
    MULTIPLE_CLAIMS_PER_CONTAINER = Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER.value
    #: eager mode: a vGPU claim is reserved for more than one pod
    CLAIM_ACROSS_PODS = Relaxation.CLAIM_ACROSS_PODS.value
    #: NRI mode: a container's vGPU claims have devices on the same GPU
    CLAIMS_SHARE_A_GPU = "vgpu-claims-share-a-gpu"


class PrepareRefusal(ClaimRefused):
    """A claim whose use this node cannot serve, refused by Prepare before any side effect; `reason`
    is the label it is counted under."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NriOnlyUse(PrepareRefusal):
    """A claim whose use needs NRI mode, refused by an eager Prepare; `relaxation` names the rule."""

    def __init__(self, relaxation: Relaxation, message: str) -> None:
        super().__init__(RefusalReason(relaxation.value), message)
        self.relaxation = relaxation


def fix(driver: str) -> str:
    """What the message tells the user to do."""
    return f"needs a node in NRI mode: select devices with {nri_selector(driver)}"


@dataclass(frozen=True)
class OtherClaim:
    """A claim a container uses besides the one being prepared: what must be looked up."""

    pod: PodView
    container: ContainerRef
    #: the pod's name for it (spec.resourceClaims[].name)
    pod_claim: str
    #: the ResourceClaim's name; None while a template's claim is not generated yet
    claim_name: str | None


def _consumers(claim: ClaimView, pods: Sequence[PodView]) -> list[tuple[PodView, ContainerRef]]:
    """The containers of the claim's reserved pods that use its vGPU devices, in node-name order."""
    by_uid = {pod.uid: pod for pod in pods}
    return [(by_uid[ref.pod_uid], ref) for ref in claim_consumers(claim, pods)]


def claim_across_pods(claim: ClaimView, pods: Sequence[PodView], driver: str) -> NriOnlyUse | None:
    """The refusal of a vGPU claim reserved for more than one pod, or None."""
    if not claim.devices or len(claim.reserved_for) <= 1:
        return None
    names = ", ".join(sorted(f"{claim.namespace}/{r.name}" for r in claim.reserved_for))
    users = ", ".join(f"{pod.name}/{ref.name}" for pod, ref in _consumers(claim, pods))
    used = f" (containers {users} use it)" if users else ""
    return NriOnlyUse(
        Relaxation.CLAIM_ACROSS_PODS,
        f"claim {claim.namespace}/{claim.name} is reserved for {len(claim.reserved_for)} pods "
        f"({names}){used}: a vGPU claim used across pods ({Relaxation.CLAIM_ACROSS_PODS}) "
        f"{fix(driver)} (an eager node's partitions cannot span pods safely)",
    )


def other_claims(claim: ClaimView, pods: Sequence[PodView]) -> list[OtherClaim]:
    """Every other claim a container using this claim's vGPU devices references, per container, in
    container then spec order (a claim referenced by several such containers appears for each)."""
    found = []
    for pod, ref in _consumers(claim, pods):
        container = pod.container(ref.name)
        assert container is not None  # claim_consumers found it in this pod
        seen: set[str] = set()
        for claim_ref in container.claims:
            name = pod.claim_names.get(claim_ref.name)
            if name == claim.name or claim_ref.name in seen:
                continue
            seen.add(claim_ref.name)
            found.append(OtherClaim(pod, ref, claim_ref.name, name))
    return found


def multiple_claims(
    claim: ClaimView, uses: Sequence[OtherClaim], others: Mapping[str, ClaimView], driver: str
) -> NriOnlyUse | None:
    """The refusal of a container that uses this claim's vGPU devices and another claim's, or None.
    `uses` is `other_claims`; `others` holds each of their claims by name (the caller looked every one
    up: a claim it could not read is its error, never an accept)."""
    for use in uses:
        if use.claim_name is None:
            continue  # the caller refuses to judge before every claim exists
        other = others[use.claim_name]
        if not other.devices or use.container not in container_requests(other, use.pod):
            continue
        return NriOnlyUse(
            Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER,
            f"claim {claim.namespace}/{claim.name}: container {use.container.name} of pod "
            f"{use.pod.namespace}/{use.pod.name} also uses vGPU claim {other.namespace}/{other.name} "
            f"(pod claim {use.pod_claim}): several vGPU claims in one container "
            f"({Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER}) {fix(driver)} (on an eager node their "
            "partitions would mount at the same paths)",
        )
    return None


def claims_share_a_gpu(
    claim: ClaimView,
    uses: Sequence[OtherClaim],
    others: Mapping[str, ClaimView],
    driver: str,
    gpu_names: Mapping[str, str] | None = None,
) -> PrepareRefusal | None:
    """NRI mode: the refusal of a container whose vGPU requests of this claim and of another claim of
    `driver` have devices on the same GPU (same pool and device: one DRA device per GPU), or None.
    `uses` is `other_claims`; `others` holds the claims the caller looked up by name (one not there
    is not judged: the caller decides which could share a GPU). Only the requests the container
    references count, on either side. `gpu_names` describes a device name in the message."""
    for use in uses:
        other = others.get(use.claim_name) if use.claim_name is not None else None
        if other is None or not other.devices:
            continue
        theirs = container_requests(other, use.pod).get(use.container, ())
        ours = container_requests(claim, use.pod).get(use.container, ())
        mine = {(d.pool, d.device) for d in claim.devices if d.request in ours}
        shared = sorted(mine & {(d.pool, d.device) for d in other.devices if d.request in theirs})
        if not shared:
            continue
        device = shared[0][1]
        gpu = (gpu_names or {}).get(device, device)
        return PrepareRefusal(
            RefusalReason.CLAIMS_SHARE_A_GPU,
            f"claim {claim.namespace}/{claim.name}: container {use.container.name} of pod "
            f"{use.pod.namespace}/{use.pod.name} also uses vGPU claim {other.namespace}/{other.name} "
            f"(pod claim {use.pod_claim}) on the same GPU {gpu} ({RefusalReason.CLAIMS_SHARE_A_GPU}): "
            "a container gets one limit per GPU (the per-GPU env names are applied replace-by-name), "
            "so the later claim's limits would replace the earlier's; give the requests different "
            f"GPUs (a CEL selector on device.attributes['{driver}'].minor or .uuid) or use one request "
            "with the summed capacity",
        )
    return None


def use_refusal(
    claim: ClaimView,
    pods: Sequence[PodView],
    others: Mapping[str, ClaimView],
    *,
    mode: Mode,
    neighbours: Collection[str],
    driver: str,
    gpu_names: Mapping[str, str] | None = None,
) -> PrepareRefusal | None:
    """Why a node in `mode` refuses this vGPU claim's use, or None, from what Prepare read: its
    reserved `pods` and the `others` claims the rule needs, by name. Eager: a container that also uses
    another vGPU claim (`others` holds every claim `other_claims` names). NRI: a container whose vGPU
    claims share a GPU, judged only against the claim's `neighbours` (names; none: nothing to judge).
    A claim reserved for several pods is the eager assigner's refusal (`claim_across_pods`)."""
    if not claim.devices:
        return None
    if mode is Mode.EAGER:
        return multiple_claims(claim, other_claims(claim, pods), others, driver)
    if not neighbours:
        return None
    uses = [use for use in other_claims(claim, pods) if use.claim_name in neighbours]
    return claims_share_a_gpu(claim, uses, others, driver, gpu_names)


@dataclass(frozen=True)
class PreparedClaim:
    """A vGPU claim this node prepared before (the claim index's view): the devices it has here."""

    uid: str
    namespace: str
    name: str
    devices: tuple[str, ...]


#: (namespace, device) -> claim UID -> (claim name, its view when it is in the call, else None)
GpuClaims = dict[tuple[str, str], dict[str, tuple[str, ClaimView | None]]]


def _local_devices(claim: ClaimView, node: str) -> set[str]:
    return {d.device for d in claim.devices if d.pool == node}


def gpu_claims(batch: Iterable[ClaimView], prepared: Iterable[PreparedClaim], node: str) -> GpuClaims:
    """NRI mode: the vGPU claims on each GPU of `node`, by namespace, built once per
    NodePrepareResources call: those prepared here before (no view: to be read) and those of the call
    (`batch`, read already). The kubelet sends every unprepared claim of a pod in one call, so of two
    claims one container uses, the later one to arrive finds the other here, whichever order they
    come in."""
    on: GpuClaims = {}
    for other in prepared:
        for device in other.devices:
            on.setdefault((other.namespace, device), {})[other.uid] = (other.name, None)
    for claim in batch:
        for device in _local_devices(claim, node):
            on.setdefault((claim.namespace, device), {})[claim.uid] = (claim.name, claim)
    return on


def gpu_neighbours(claim: ClaimView, on: GpuClaims, node: str) -> dict[str, ClaimView | None]:
    """The other claims of the claim's namespace with a device on one of its GPUs (`gpu_claims`), by
    name (a view of the call, else None). Empty in the common case, and then no pod is read."""
    found: dict[str, ClaimView | None] = {}
    for device in sorted(_local_devices(claim, node)):
        for uid, (name, view) in on.get((claim.namespace, device), {}).items():
            if uid != claim.uid and found.get(name) is None:
                found[name] = view
    return found

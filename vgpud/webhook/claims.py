"""What the admission rules read: which of a pod's claims and requests are vGPU ones, whether they
select NRI nodes, and which container uses which vGPU request (the rules: vgpud.webhook.rules).

Which claims are vGPU claims is decided from the spec, because at pod CREATE nothing is allocated yet:
a request is a vGPU request when its device class (`exactly.deviceClassName`, a `firstAvailable`
alternative's, or v1beta1's top-level `deviceClassName`) is one of `Policy.vgpu_classes`; for a claim
already allocated, the requests allocated to our driver count too.

Pure functions over API dicts (no I/O), like the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from vgpud.partition.model import ClaimView, ContainerRef, ModelError, PodView, parse_claim, parse_pod
from vgpud.relaxations import Relaxation
from vgpud.webhook.nrinodes import spec_selects_nri_nodes

DEFAULT_VGPU_CLASSES = frozenset({"vgpu-manager"})
#: pods in these phases run no container any more; unless still reserved they hold no request
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class RuleInputError(ValueError):
    """An object the rules cannot read; the message names the object and the field."""


class ApiObjectError(RuleInputError):
    """An object the API server returned (a pod of the namespace) that the rules cannot read."""


@dataclass(frozen=True)
class Policy:
    """What the rules need to know about the cluster."""

    driver: str
    vgpu_classes: frozenset[str] = DEFAULT_VGPU_CLASSES
    #: vGPU DeviceClasses that select only NRI nodes' devices (a request of one selects NRI nodes)
    nri_classes: frozenset[str] = frozenset()
    #: the rules lifted for claims that select NRI nodes (each by its own switch)
    relaxations: frozenset[Relaxation] = frozenset()


# --------------------------------------------------------------------------------------------------
# Which claims and requests are vGPU ones


def _entries(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a list field, ignoring what is not one (the API server validated the shape)."""
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def vgpu_requests_in_spec(spec: Any, classes: frozenset[str]) -> frozenset[str]:
    """Names of the requests of a claim spec that ask for a vGPU device class: resource.k8s.io v1 and
    v1beta2 (`exactly`, `firstAvailable`) and v1beta1 (`deviceClassName` on the request itself)."""
    found = set()
    for request in _entries(_field(spec, "devices", "requests")):
        name = request.get("name")
        direct = (_field(request, "exactly", "deviceClassName"), request.get("deviceClassName"))
        alternatives = (sub.get("deviceClassName") for sub in _entries(request.get("firstAvailable")))
        if isinstance(name, str) and any(
            isinstance(c, str) and c in classes for c in (*direct, *alternatives)
        ):
            found.add(name)
    return frozenset(found)


def claim_view(claim: Any, driver: str) -> ClaimView:
    """The claim as vgpud.partition.model reads it; RuleInputError when it cannot."""
    try:
        return parse_claim(claim, driver)
    except ModelError as err:
        raise RuleInputError(str(err)) from None


def pod_view(pod: Any) -> PodView:
    """The pod as vgpud.partition.model reads it; RuleInputError when it cannot."""
    try:
        return parse_pod(pod)
    except ModelError as err:
        raise RuleInputError(str(err)) from None


def namespace_pod(obj: Any) -> tuple[PodView, str | None]:
    """A pod of the namespace as the API server returned it, and its phase; ApiObjectError when a
    field does not have Kubernetes' type (such an answer is not trusted to say who holds what)."""
    try:
        view = parse_pod(obj)
    except ModelError as err:
        raise ApiObjectError(str(err)) from None
    phase = _field(obj, "status", "phase")
    if phase is not None and not isinstance(phase, str):
        raise ApiObjectError(
            f"Pod {pod_label(view)}: status.phase: expected a string, got {type(phase).__name__}"
        )
    return view, phase


def claim_vgpu_requests(claim: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    """The vGPU requests of a ResourceClaim: by device class, plus those allocated to our driver."""
    by_class = vgpu_requests_in_spec(claim.get("spec"), policy.vgpu_classes)
    if _field(claim, "status", "allocation") is None:
        return by_class
    return by_class | frozenset(claim_view(claim, policy.driver).requests)


def template_vgpu_requests(template: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    """The vGPU requests of the claims a ResourceClaimTemplate generates."""
    return vgpu_requests_in_spec(_field(template, "spec", "spec"), policy.vgpu_classes)


def is_vgpu_claim(claim: Mapping[str, Any], policy: Policy) -> bool:
    return bool(claim_vgpu_requests(claim, policy))


def claim_selects_nri_nodes(claim: Mapping[str, Any], policy: Policy) -> bool:
    """Whether every vGPU request of a ResourceClaim selects NRI nodes (in its spec)."""
    requests = claim_vgpu_requests(claim, policy)
    return spec_selects_nri_nodes(claim.get("spec"), requests, policy.driver, policy.nri_classes)


def template_selects_nri_nodes(template: Mapping[str, Any], policy: Policy) -> bool:
    """Whether every vGPU request of the claims a ResourceClaimTemplate generates selects NRI nodes."""
    spec = _field(template, "spec", "spec")
    requests = vgpu_requests_in_spec(spec, policy.vgpu_classes)
    return spec_selects_nri_nodes(spec, requests, policy.driver, policy.nri_classes)


@dataclass(frozen=True)
class PodClaims:
    """Where a pod's claims come from: pod claim name -> ResourceClaim or ResourceClaimTemplate name."""

    named: Mapping[str, str]
    templates: Mapping[str, str]


def pod_claims(pod: Mapping[str, Any]) -> PodClaims:
    """The claims a pod references, for the server to look up; RuleInputError for a malformed pod."""
    pod_view(pod)  # checks exactly one of resourceClaimName / resourceClaimTemplateName per entry
    return parsed_pod_claims(pod)


def parsed_pod_claims(pod: Mapping[str, Any]) -> PodClaims:
    """`pod_claims` of a pod already parsed."""
    named: dict[str, str] = {}
    templates: dict[str, str] = {}
    for entry in _entries(_field(pod, "spec", "resourceClaims")):
        if entry.get("resourceClaimName"):
            named[entry["name"]] = entry["resourceClaimName"]
        else:
            templates[entry["name"]] = entry["resourceClaimTemplateName"]
    return PodClaims(named, templates)


# --------------------------------------------------------------------------------------------------
# Who uses which vGPU request


class ClaimId(NamedTuple):
    """A claim as the rules tell it apart and the messages name it: a ResourceClaim, or a pod's entry a
    template will generate."""

    name: str
    template: str | None = None

    def __str__(self) -> str:
        if self.template is None:
            return f'"{self.name}"'
        return f'"{self.name}" (generated from template "{self.template}")'


class Use(NamedTuple):
    """One container's use of one vGPU request of one claim (a tuple: thousands are made per pod)."""

    container: ContainerRef
    claim: ClaimId
    request: str


def pod_label(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def pod_uses(pod: PodView, vgpu: Mapping[str, tuple[ClaimId, frozenset[str]]]) -> list[Use]:
    """Uses by the pod's containers, in container order; `vgpu`: pod claim name -> (claim, its vGPU
    requests). A reference without `request` uses every vGPU request of the claim; one naming a request
    that is not a vGPU request uses nothing."""
    uses: list[Use] = []
    for container in pod.containers:
        seen: set[tuple[ClaimId, str]] = set()
        for ref in container.claims:
            if ref.name not in vgpu:
                continue
            claim, requests = vgpu[ref.name]
            if ref.request is None:
                chosen = sorted(requests)
            else:
                main = ref.request.partition("/")[0]  # a firstAvailable subrequest folds into its request
                chosen = [main] if main in requests else []
            for request in chosen:
                if (claim, request) not in seen:
                    seen.add((claim, request))
                    uses.append(Use(container.ref, claim, request))
    return uses


def other_pods(
    pod: PodView, pods: Sequence[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]
) -> list[PodView]:
    """The namespace's other pods that can hold a request: reserved ones first (in reservedFor order),
    then those that have not finished. ApiObjectError for one that cannot be read (the API server
    validates every pod it stores, so such a pod means its answer cannot be trusted)."""
    reserved: dict[str, None] = {}
    for claim in claims:
        for ref in _entries(_field(claim, "status", "reservedFor")):
            if ref.get("resource") == "pods" and not ref.get("apiGroup") and isinstance(ref.get("uid"), str):
                reserved[ref["uid"]] = None
    views: dict[str, PodView] = {}
    for obj in pods:
        other, phase = namespace_pod(obj)
        if other.namespace != pod.namespace or other.name == pod.name or other.uid == pod.uid:
            continue
        if other.uid in reserved or phase not in FINISHED_PHASES:
            views[other.uid] = other
    first = [views.pop(uid) for uid in reserved if uid in views]
    return first + list(views.values())

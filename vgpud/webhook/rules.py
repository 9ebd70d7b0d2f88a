"""The admission rules that keep "no two concurrent containers share a vGPU request" true (seed §12.2).

Per-container directories (NRI mode) are safe only under that invariant, and eager partitions assume
it too; these rules are what enforces it ("Webhook rules" in reference/vgpu-manager-contracts.md):

1. A container uses at most one vGPU claim (several requests of it are fine). On an eager node a
   container with two claims gets two CDI devices whose register identities and mounts collide; on an
   NRI node it gets one directory whatever it references (seed §5.4), so
   `Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER` lifts the rule when every vGPU claim of the container
   selects NRI nodes.
2. Per vGPU request of a claim, within a pod: at most one app container; at most one sidecar (an init
   container with restartPolicy Always), and then the sidecar is its only user; any number of plain init
   containers (they run one after another, before the apps).
3. A plain init container shares the requests of one claim with at most one app container (otherwise
   the eager partition graph joins two concurrent apps into one directory through it).
4. Across pods: a vGPU request of a claim that one pod uses is used by no other pod (always: it is the
   invariant itself).
5. Across pods: a vGPU claim whose vGPU requests one pod uses is used by no other pod. An eager node
   cannot prepare such a claim (its partitions cannot span pods); an NRI node can, so
   `Relaxation.CLAIM_ACROSS_PODS` lifts the rule for a claim that selects NRI nodes (rule 4 still holds).

A relaxation applies only when its switch is on (`Policy.relaxations`) and the claims involved select
NRI nodes (vgpud.webhook.nrinodes), so the scheduler itself keeps the relaxed pod off eager nodes; a
denial of a relaxable rule says which switch lifts it, or which claim does not select NRI nodes and
how to make it.

Pure functions over API dicts (no I/O): the server looks up what they need (the pod's named claims and
claim templates, the pods of the namespace) and hands it in. Which claims are vGPU claims is decided
from the spec, because at pod CREATE nothing is allocated yet: a request is a vGPU request when its
device class (`exactly.deviceClassName`, a `firstAvailable` alternative's, or v1beta1's top-level
`deviceClassName`) is one of `Policy.vgpu_classes`; for a claim already allocated, the requests
allocated to our driver count too. When a claim's status changes (the scheduler reserving it for a
pod), rules 2-5 are checked again against what is really allocated, over every reserved pod.

Every rule yields `Violation`s whose message names the pod, the container, the claim and the request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property, partial
from typing import Any, NamedTuple

from vgpud.partition.model import (
    ClaimView,
    ContainerKind,
    ContainerRef,
    ModelError,
    PodView,
    container_requests,
    parse_claim,
    parse_pod,
)
from vgpud.relaxations import Relaxation, nri_selector
from vgpud.webhook.nrinodes import spec_selects_nri_nodes

DEFAULT_VGPU_CLASSES = frozenset({"vgpu-manager"})
#: pods in these phases run no container any more; unless still reserved they hold no request
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class RuleInputError(ValueError):
    """An object the rules cannot read; the message names the object and the field."""


class ApiObjectError(RuleInputError):
    """An object the API server returned (a pod of the namespace) that the rules cannot read."""


class Rule(StrEnum):
    ONE_CLAIM_PER_CONTAINER = "one-vgpu-claim-per-container"
    ONE_APP_PER_REQUEST = "one-app-per-request"
    ONE_SIDECAR_PER_REQUEST = "one-sidecar-per-request"
    SIDECAR_ONLY_USER = "sidecar-only-user"
    INIT_SHARES_WITH_ONE_APP = "init-shares-with-one-app"
    ONE_POD_PER_REQUEST = "one-pod-per-request"
    ONE_POD_PER_CLAIM = "one-pod-per-vgpu-claim"


#: the webhook's switch of each relaxation (`vgpud webhook` flags; the environment variable is the
#: flag's name in capitals)
SWITCHES: Mapping[Relaxation, str] = {
    Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER: "--allow-multiple-vgpu-claims-per-container",
    Relaxation.CLAIM_ACROSS_PODS: "--allow-vgpu-claims-across-pods",
}


@dataclass(frozen=True)
class Policy:
    """What the rules need to know about the cluster."""

    driver: str
    vgpu_classes: frozenset[str] = DEFAULT_VGPU_CLASSES
    #: vGPU DeviceClasses that select only NRI nodes' devices (a request of one selects NRI nodes)
    nri_classes: frozenset[str] = frozenset()
    #: the rules lifted for claims that select NRI nodes (each by its own switch)
    relaxations: frozenset[Relaxation] = frozenset()


@dataclass(frozen=True)
class Violation:
    """One broken rule. `claim` is the ResourceClaim name, or the pod's claim entry name for a claim
    a template will generate; `request` lists the requests concerned (comma-separated when several).
    The message is written when first read: a large pod breaks thousands of times, and the answer
    shows only the first few (`summary`)."""

    pod: str  # namespace/name
    container: str
    claim: str
    request: str
    rule: Rule
    describe: Callable[[], str] = field(repr=False, compare=False)

    @cached_property
    def message(self) -> str:
        return self.describe()

    @property
    def key(self) -> tuple[str, str, str, str, Rule]:
        """Identity without the message: the same breach before and after an update."""
        return (self.pod, self.container, self.claim, self.request, self.rule)

    def __str__(self) -> str:
        return self.message


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


def _claim_view(claim: Any, driver: str) -> ClaimView:
    try:
        return parse_claim(claim, driver)
    except ModelError as err:
        raise RuleInputError(str(err)) from None


def _pod_view(pod: Any) -> PodView:
    try:
        return parse_pod(pod)
    except ModelError as err:
        raise RuleInputError(str(err)) from None


def _namespace_pod(obj: Any) -> tuple[PodView, str | None]:
    """A pod of the namespace as the API server returned it, and its phase; ApiObjectError when a
    field does not have Kubernetes' type (such an answer is not trusted to say who holds what)."""
    try:
        view = parse_pod(obj)
    except ModelError as err:
        raise ApiObjectError(str(err)) from None
    phase = _field(obj, "status", "phase")
    if phase is not None and not isinstance(phase, str):
        raise ApiObjectError(
            f"Pod {_label(view)}: status.phase: expected a string, got {type(phase).__name__}"
        )
    return view, phase


def claim_vgpu_requests(claim: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    """The vGPU requests of a ResourceClaim: by device class, plus those allocated to our driver."""
    by_class = vgpu_requests_in_spec(claim.get("spec"), policy.vgpu_classes)
    if _field(claim, "status", "allocation") is None:
        return by_class
    return by_class | frozenset(_claim_view(claim, policy.driver).requests)


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
    _pod_view(pod)  # checks exactly one of resourceClaimName / resourceClaimTemplateName per entry
    return _sources(pod)


def _sources(pod: Mapping[str, Any]) -> PodClaims:
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


class _Claim(NamedTuple):
    """A claim as the messages name it: a ResourceClaim, or a pod's entry a template will generate."""

    name: str
    template: str | None = None

    def __str__(self) -> str:
        if self.template is None:
            return f'"{self.name}"'
        return f'"{self.name}" (generated from template "{self.template}")'


class _Use(NamedTuple):
    """One container's use of one vGPU request of one claim (a tuple: thousands are made per pod)."""

    container: ContainerRef
    claim: _Claim
    request: str


def _role(ref: ContainerRef) -> str:
    role = "sidecar" if ref.sidecar else str(ref.kind)
    return f'{role} container "{ref.name}"'


def _label(pod: PodView) -> str:
    return f"{pod.namespace}/{pod.name}"


def _uses(pod: PodView, vgpu: Mapping[str, tuple[_Claim, frozenset[str]]]) -> list[_Use]:
    """Uses by the pod's containers, in container order; `vgpu`: pod claim name -> (claim, its vGPU
    requests). A reference without `request` uses every vGPU request of the claim; one naming a request
    that is not a vGPU request uses nothing."""
    uses: list[_Use] = []
    for container in pod.containers:
        seen: set[tuple[_Claim, str]] = set()
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
                    uses.append(_Use(container.ref, claim, request))
    return uses


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _requests_text(requests: Sequence[str]) -> str:
    return f"request{'s' if len(requests) > 1 else ''} {_quoted(requests)}"


# --------------------------------------------------------------------------------------------------
# The rules


def _lifted_text(relaxation: Relaxation) -> str:
    """What a denial of a relaxable rule adds while the relaxation's switch is off."""
    return f"the webhook's switch {SWITCHES[relaxation]} lifts this for claims that select NRI nodes"


def _outside_text(policy: Policy, outside: Sequence[_Claim]) -> str:
    """What a denial of a relaxed rule adds: the claims that do not select NRI nodes, and the fix."""
    many = len(outside) > 1
    claims = f"claim{'s' if many else ''} {', '.join(str(claim) for claim in outside)}"
    classes = sorted(policy.nri_classes)
    if classes:
        by_class = f"the NRI DeviceClass{'es' if len(classes) > 1 else ''} {_quoted(classes)}"
    else:
        by_class = "a DeviceClass for NRI nodes (the webhook has none: --nri-device-classes)"
    return (
        f'{claims} {"do" if many else "does"} not: add the selector "{nri_selector(policy.driver)}" '
        f"to each of {'their' if many else 'its'} vGPU requests, or request {by_class}"
    )


def _one_claim_per_container(
    pod: str, uses: Sequence[_Use], policy: Policy, nri: frozenset[_Claim]
) -> list[Violation]:
    """Rule 1; with its relaxation on, only for containers with a claim that does not select NRI
    nodes (`nri`: the claims that do)."""
    relaxed = Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER in policy.relaxations
    by_container: dict[ContainerRef, dict[_Claim, list[str]]] = {}
    for use in uses:
        by_container.setdefault(use.container, {}).setdefault(use.claim, []).append(use.request)
    out = []
    for ref, claims in by_container.items():
        if len(claims) < 2:
            continue
        outside = [claim for claim in claims if claim not in nri]
        if relaxed and not outside:
            continue
        out.append(
            Violation(
                pod,
                ref.name,
                ", ".join(claim.name for claim in claims),
                ", ".join(r for reqs in claims.values() for r in reqs),
                Rule.ONE_CLAIM_PER_CONTAINER,
                partial(_claims_text, pod, ref, claims, policy, outside if relaxed else None),
            )
        )
    return out


def _claims_text(
    pod: str,
    ref: ContainerRef,
    claims: Mapping[_Claim, list[str]],
    policy: Policy,
    outside: Sequence[_Claim] | None,
) -> str:
    details = ", ".join(f"claim {claim} ({_requests_text(reqs)})" for claim, reqs in claims.items())
    if outside is None:
        why = "a container may use at most one vGPU claim; " + _lifted_text(
            Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER
        )
    else:
        why = "a container may use several vGPU claims only when each selects NRI nodes, and " + (
            _outside_text(policy, outside)
        )
    return f"pod {pod}: {_role(ref)} uses {len(claims)} vGPU claims ({details}); {why}"


#: app containers a rule 3 message names (the rest are counted as "more than")
_NAMED_APPS = 3

_WHY = {
    Rule.ONE_APP_PER_REQUEST: "a vGPU request may be used by at most one app container",
    Rule.ONE_SIDECAR_PER_REQUEST: "a vGPU request may be used by at most one sidecar container",
    Rule.SIDECAR_ONLY_USER: "a sidecar container must be the only user of its vGPU request",
    Rule.ONE_POD_PER_REQUEST: "a vGPU request may be used by one pod only",
}


def _shared(pod: str, use: _Use, holder: ContainerRef, holder_pod: str | None, rule: Rule) -> Violation:
    """`use` shares its request with `holder` (of `holder_pod` when another pod's) against `rule`."""
    return Violation(
        pod,
        use.container.name,
        use.claim.name,
        use.request,
        rule,
        partial(_shared_text, pod, use, holder, holder_pod, rule),
    )


def _shared_text(pod: str, use: _Use, holder: ContainerRef, holder_pod: str | None, rule: Rule) -> str:
    where = _role(holder) if holder_pod is None else f"{_role(holder)} of pod {holder_pod}"
    return (
        f'pod {pod}: {_role(use.container)} uses request "{use.request}" of vGPU claim {use.claim}, '
        f"which {where} also uses; {_WHY[rule]}"
    )


def _per_request(pod: str, uses: Sequence[_Use]) -> list[Violation]:
    """Rules 2 and 3 within one pod."""
    users: dict[tuple[_Claim, str], list[ContainerRef]] = {}
    for use in uses:
        users.setdefault((use.claim, use.request), []).append(use.container)
    out: list[Violation] = []
    for (claim, request), refs in users.items():
        apps = [r for r in refs if r.kind is ContainerKind.APP]
        sidecars = [r for r in refs if r.sidecar]
        for extra in apps[1:]:
            out.append(_shared(pod, _Use(extra, claim, request), apps[0], None, Rule.ONE_APP_PER_REQUEST))
        for extra in sidecars[1:]:
            out.append(
                _shared(pod, _Use(extra, claim, request), sidecars[0], None, Rule.ONE_SIDECAR_PER_REQUEST)
            )
        if sidecars:
            for other in (r for r in refs if not r.sidecar):
                out.append(
                    _shared(pod, _Use(other, claim, request), sidecars[0], None, Rule.SIDECAR_ONLY_USER)
                )
    out += _init_shares_with_one_app(pod, users)
    return out


def _init_shares_with_one_app(
    pod: str, users: Mapping[tuple[_Claim, str], list[ContainerRef]]
) -> list[Violation]:
    """Rule 3, linear in the uses: for each plain init container, the first few app containers it shares
    a claim's requests with (`_shared_apps`), enough to know it breaks the rule and to name them."""
    # containers by name (unique in a pod, and a str's hash is cached: a ContainerRef's is not)
    apps_of: dict[tuple[_Claim, str], list[ContainerRef]] = {}
    app_uses: dict[tuple[str, _Claim], set[str]] = {}  # (app name, claim) -> its requests
    inits: dict[tuple[str, _Claim], tuple[ContainerRef, list[str]]] = {}  # -> (init, its requests)
    for (claim, request), refs in users.items():
        apps_of[(claim, request)] = apps = [r for r in refs if r.kind is ContainerKind.APP]
        for app in apps:
            app_uses.setdefault((app.name, claim), set()).add(request)
        for init in (r for r in refs if r.kind is ContainerKind.INIT and not r.sidecar):
            inits.setdefault((init.name, claim), (init, []))[1].append(request)
    out = []
    # what an init container shares depends only on its claim and requests: worked out once for each
    shares: dict[tuple[_Claim, tuple[str, ...]], tuple[dict[ContainerRef, list[str]], bool, str] | None] = {}
    for (_, claim), (init, requests) in inits.items():
        key = (claim, tuple(requests))
        if key not in shares:
            shares[key] = _shared_apps(claim, requests, apps_of, app_uses)
        if (share := shares[key]) is None:
            continue
        named, more, shared = share
        out.append(
            Violation(
                pod,
                init.name,
                claim.name,
                shared,
                Rule.INIT_SHARES_WITH_ONE_APP,
                partial(_init_text, pod, init, claim, named, more),
            )
        )
    return out


def _shared_apps(
    claim: _Claim,
    requests: list[str],
    apps_of: Mapping[tuple[_Claim, str], list[ContainerRef]],
    app_uses: Mapping[tuple[str, _Claim], set[str]],
) -> tuple[dict[ContainerRef, list[str]], bool, str] | None:
    """The app containers an init container using `requests` of `claim` shares them with: the first
    `_NAMED_APPS` with their requests, whether there are more, and the shared requests; None for
    fewer than two apps. It looks at no more than `_NAMED_APPS` + 1 distinct apps per request."""
    found: dict[str, ContainerRef] = {}  # the first distinct apps, in order, one past those named
    for request in requests:
        for app in apps_of[(claim, request)]:
            if len(found) > _NAMED_APPS:
                break
            found.setdefault(app.name, app)
    if len(found) < 2:
        return None
    named = {
        app: [r for r in requests if r in app_uses[(name, claim)]]
        for name, app in list(found.items())[:_NAMED_APPS]
    }
    return named, len(found) > _NAMED_APPS, ", ".join(sorted(r for r in requests if apps_of[(claim, r)]))


def _init_text(
    pod: str, init: ContainerRef, claim: _Claim, named: Mapping[ContainerRef, list[str]], more: bool
) -> str:
    details = ", ".join(f'"{app.name}" ({_requests_text(requests)})' for app, requests in named.items())
    count = f"more than {_NAMED_APPS}" if more else str(len(named))
    return (
        f"pod {pod}: {_role(init)} shares vGPU claim {claim} with {count} app containers "
        f"({details}{', ...' if more else ''}); an init container may share vGPU requests with at most one "
        "app container"
    )


@dataclass
class _Holders:
    """What pods hold across the namespace, first come: each vGPU request (the pod and its container),
    each vGPU claim (the pod and its first use)."""

    requests: dict[tuple[_Claim, str], tuple[str, ContainerRef]] = field(default_factory=dict)
    claims: dict[_Claim, tuple[str, _Use]] = field(default_factory=dict)


def _across_pods(
    pod: str, uses: Sequence[_Use], held: _Holders, policy: Policy, nri: frozenset[_Claim]
) -> list[Violation]:
    """Rules 4 and 5: the uses of `pod` against what other pods already hold; then `pod` holds its own.
    A use of a request another pod holds breaks rule 4 (and only it: no relaxation lifts that); a use
    of another request of a claim another pod holds breaks rule 5, unless its relaxation is on and the
    claim is one of `nri` (those that select NRI nodes)."""
    relaxed = Relaxation.CLAIM_ACROSS_PODS in policy.relaxations
    out = []
    for use in uses:
        holder = held.requests.get((use.claim, use.request))
        if holder is not None and holder[0] != pod:
            out.append(_shared(pod, use, holder[1], holder[0], Rule.ONE_POD_PER_REQUEST))
            continue
        claim_holder = held.claims.get(use.claim)
        if claim_holder is None or claim_holder[0] == pod or (relaxed and use.claim in nri):
            continue
        outside = [use.claim] if relaxed else None
        out.append(
            Violation(
                pod,
                use.container.name,
                use.claim.name,
                use.request,
                Rule.ONE_POD_PER_CLAIM,
                partial(_claim_shared_text, pod, use, claim_holder, policy, outside),
            )
        )
    for use in uses:
        held.requests.setdefault((use.claim, use.request), (pod, use.container))
        held.claims.setdefault(use.claim, (pod, use))
    return out


def _claim_shared_text(
    pod: str, use: _Use, held_by: tuple[str, _Use], policy: Policy, outside: Sequence[_Claim] | None
) -> str:
    holder_pod, holder = held_by
    if outside is None:
        why = "a vGPU claim may be used by one pod only; " + _lifted_text(Relaxation.CLAIM_ACROSS_PODS)
    else:
        why = "several pods may use one vGPU claim only when it selects NRI nodes, and " + (
            _outside_text(policy, outside)
        )
    return (
        f'pod {pod}: {_role(use.container)} uses request "{use.request}" of vGPU claim {use.claim}, '
        f'whose request "{holder.request}" {_role(holder.container)} of pod {holder_pod} uses; {why}'
    )


# --------------------------------------------------------------------------------------------------
# Entry points, one per kind of review


def uses_named_vgpu_claim(claims: Mapping[str, Mapping[str, Any]], policy: Policy) -> bool:
    """Whether any of these ResourceClaims is a vGPU claim: only then rules 4 and 5 need the
    namespace's pods."""
    return any(claim_vgpu_requests(claim, policy) for claim in claims.values())


def check_pod(
    pod: Mapping[str, Any],
    claims: Mapping[str, Mapping[str, Any]],
    templates: Mapping[str, Mapping[str, Any]],
    namespace_pods: Sequence[Mapping[str, Any]],
    policy: Policy,
) -> list[Violation]:
    """Rules 1-5 for a pod being created.

    `claims` / `templates`: the ResourceClaims and ResourceClaimTemplates the pod names, by name (one
    that does not exist is left out and constrains nothing here; the reservation check catches it
    later). `namespace_pods`: the other pods of the namespace (rules 4 and 5), needed only when
    `uses_named_vgpu_claim`; a pod counts while it has not finished, or while a claim is reserved for it.
    """
    view = _pod_view(pod)
    sources = _sources(pod)
    vgpu: dict[str, tuple[_Claim, frozenset[str]]] = {}
    nri: set[_Claim] = set()  # the vGPU claims that select NRI nodes
    named_requests: dict[str, frozenset[str]] = {}
    for pod_claim, name in sources.named.items():
        if name in claims and (requests := claim_vgpu_requests(claims[name], policy)):
            vgpu[pod_claim] = (_Claim(name), requests)
            named_requests[name] = requests
            if claim_selects_nri_nodes(claims[name], policy):
                nri.add(_Claim(name))
    for pod_claim, template in sources.templates.items():
        if template in templates and (requests := template_vgpu_requests(templates[template], policy)):
            vgpu[pod_claim] = (_Claim(pod_claim, template), requests)
            if template_selects_nri_nodes(templates[template], policy):
                nri.add(_Claim(pod_claim, template))
    if not vgpu:
        return []
    label = _label(view)
    uses = _uses(view, vgpu)
    out = _one_claim_per_container(label, uses, policy, frozenset(nri))
    out += _per_request(label, uses)
    if named_requests:
        held = _Holders()
        for other in _other_pods(view, namespace_pods, claims.values()):
            other_vgpu = {
                pod_claim: (_Claim(name), named_requests[name])
                for pod_claim, name in other.claim_names.items()
                if name in named_requests
            }
            _across_pods(_label(other), _uses(other, other_vgpu), held, policy, frozenset(nri))
        out += _across_pods(label, uses, held, policy, frozenset(nri))
    return out


def _other_pods(
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
        other, phase = _namespace_pod(obj)
        if other.namespace != pod.namespace or other.name == pod.name or other.uid == pod.uid:
            continue
        if other.uid in reserved or phase not in FINISHED_PHASES:
            views[other.uid] = other
    first = [views.pop(uid) for uid in reserved if uid in views]
    return first + list(views.values())


def check_claim(claim: Mapping[str, Any], policy: Policy) -> list[Violation]:
    """ResourceClaim CREATE and UPDATE: a claim alone breaks no rule (the pods using it do), but a vGPU
    claim must be one the node daemon can read; RuleInputError says why not."""
    if claim_vgpu_requests(claim, policy):
        _claim_view(claim, policy.driver)
    return []


def check_claim_status(
    claim: Mapping[str, Any],
    old_claim: Mapping[str, Any] | None,
    namespace_pods: Sequence[Mapping[str, Any]],
    policy: Policy,
) -> list[Violation]:
    """resourceclaims/status UPDATE: rules 2-5 against the requests allocated to our driver, over every
    pod the claim is reserved for (in reservedFor order; a later pod breaks rule 4 or 5, not an earlier
    one).

    Only breaches the update brings are returned: one already there before (`old_claim`) is not, so the
    controllers that release reservations and deallocate are never blocked by an older state.
    """
    new = _reservation_violations(claim, namespace_pods, policy)
    if not new or old_claim is None:
        return new
    try:
        before = {v.key for v in _reservation_violations(old_claim, namespace_pods, policy)}
    except RuleInputError:
        before = set()
    return [v for v in new if v.key not in before]


def _reservation_violations(
    claim: Mapping[str, Any], namespace_pods: Sequence[Mapping[str, Any]], policy: Policy
) -> list[Violation]:
    view = _claim_view(claim, policy.driver)
    if not view.requests or not view.reserved_for:
        return []
    by_uid: dict[str, PodView] = {}
    for obj in namespace_pods:
        pod, _ = _namespace_pod(obj)
        if view.reserves(pod):
            by_uid[pod.uid] = pod
    claim_ref = _Claim(view.name)
    nri = frozenset({claim_ref} if claim_selects_nri_nodes(claim, policy) else ())
    out: list[Violation] = []
    held = _Holders()
    for reserved in view.reserved_for:
        pod = by_uid.pop(reserved.uid, None)
        if pod is None:
            continue  # gone: it holds nothing any more
        uses = [
            _Use(ref, claim_ref, request)
            for ref, requests in container_requests(view, pod).items()
            for request in requests
        ]
        out += _per_request(_label(pod), uses)
        out += _across_pods(_label(pod), uses, held, policy, nri)
    return out


def summary(violations: Sequence[Violation], limit: int = 5) -> str:
    """One message for the API server to show: the first `limit` violations, then how many more."""
    text = "; ".join(v.message for v in violations[:limit])
    if len(violations) > limit:
        text += f"; and {len(violations) - limit} more"
    return text

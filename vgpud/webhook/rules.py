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
claim templates, the namespace's pods that can hold their requests) and hands it in; what they read of
them, and which claims and requests are vGPU ones: vgpud.webhook.claims. When a claim's status changes
(the scheduler reserving it for a pod), rules 2-5 are checked again against what is really allocated,
over every reserved pod.

Every rule yields `Violation`s (vgpud.webhook.violations) whose message names the pod, the container,
the claim and the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from vgpud.partition.model import ContainerKind, ContainerRef, PodView, container_requests
from vgpud.relaxations import Relaxation
from vgpud.webhook.claims import (
    ClaimId,
    Policy,
    RuleInputError,
    Use,
    claim_selects_nri_nodes,
    claim_vgpu_requests,
    claim_view,
    namespace_pod,
    other_pods,
    parsed_pod_claims,
    pod_label,
    pod_uses,
    pod_view,
    template_selects_nri_nodes,
    template_vgpu_requests,
)
from vgpud.webhook.violations import (
    NAMED_APPS,
    Rule,
    Violation,
    claim_shared_text,
    claims_text,
    init_text,
    shared_text,
)

# --------------------------------------------------------------------------------------------------
# The rules


def _one_claim_per_container(
    pod: str, uses: Sequence[Use], policy: Policy, nri: frozenset[ClaimId]
) -> list[Violation]:
    """Rule 1; with its relaxation on, only for containers with a claim that does not select NRI
    nodes (`nri`: the claims that do)."""
    relaxed = Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER in policy.relaxations
    by_container: dict[ContainerRef, dict[ClaimId, list[str]]] = {}
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
                partial(claims_text, pod, ref, claims, policy, outside if relaxed else None),
            )
        )
    return out


def _shared(pod: str, use: Use, holder: ContainerRef, holder_pod: str | None, rule: Rule) -> Violation:
    """`use` shares its request with `holder` (of `holder_pod` when another pod's) against `rule`."""
    return Violation(
        pod,
        use.container.name,
        use.claim.name,
        use.request,
        rule,
        partial(shared_text, pod, use, holder, holder_pod, rule),
    )


def _per_request(pod: str, uses: Sequence[Use]) -> list[Violation]:
    """Rules 2 and 3 within one pod."""
    users: dict[tuple[ClaimId, str], list[ContainerRef]] = {}
    for use in uses:
        users.setdefault((use.claim, use.request), []).append(use.container)
    out: list[Violation] = []
    for (claim, request), refs in users.items():
        apps = [r for r in refs if r.kind is ContainerKind.APP]
        sidecars = [r for r in refs if r.sidecar]
        for extra in apps[1:]:
            out.append(_shared(pod, Use(extra, claim, request), apps[0], None, Rule.ONE_APP_PER_REQUEST))
        for extra in sidecars[1:]:
            out.append(
                _shared(pod, Use(extra, claim, request), sidecars[0], None, Rule.ONE_SIDECAR_PER_REQUEST)
            )
        if sidecars:
            for other in (r for r in refs if not r.sidecar):
                out.append(
                    _shared(pod, Use(other, claim, request), sidecars[0], None, Rule.SIDECAR_ONLY_USER)
                )
    out += _init_shares_with_one_app(pod, users)
    return out


def _init_shares_with_one_app(
    pod: str, users: Mapping[tuple[ClaimId, str], list[ContainerRef]]
) -> list[Violation]:
    """Rule 3, linear in the uses: for each plain init container, the first few app containers it shares
    a claim's requests with (`_shared_apps`), enough to know it breaks the rule and to name them."""
    # containers by name (unique in a pod, and a str's hash is cached: a ContainerRef's is not)
    apps_of: dict[tuple[ClaimId, str], list[ContainerRef]] = {}
    app_uses: dict[tuple[str, ClaimId], set[str]] = {}  # (app name, claim) -> its requests
    inits: dict[tuple[str, ClaimId], tuple[ContainerRef, list[str]]] = {}  # -> (init, its requests)
    for (claim, request), refs in users.items():
        apps_of[(claim, request)] = apps = [r for r in refs if r.kind is ContainerKind.APP]
        for app in apps:
            app_uses.setdefault((app.name, claim), set()).add(request)
        for init in (r for r in refs if r.kind is ContainerKind.INIT and not r.sidecar):
            inits.setdefault((init.name, claim), (init, []))[1].append(request)
    out = []
    # what an init container shares depends only on its claim and requests: worked out once for each
    shares: dict[tuple[ClaimId, tuple[str, ...]], tuple[dict[ContainerRef, list[str]], bool, str] | None] = {}
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
                partial(init_text, pod, init, claim, named, more),
            )
        )
    return out


def _shared_apps(
    claim: ClaimId,
    requests: list[str],
    apps_of: Mapping[tuple[ClaimId, str], list[ContainerRef]],
    app_uses: Mapping[tuple[str, ClaimId], set[str]],
) -> tuple[dict[ContainerRef, list[str]], bool, str] | None:
    """The app containers an init container using `requests` of `claim` shares them with: the first
    `NAMED_APPS` with their requests, whether there are more, and the shared requests; None for
    fewer than two apps. It looks at no more than `NAMED_APPS` + 1 distinct apps per request."""
    found: dict[str, ContainerRef] = {}  # the first distinct apps, in order, one past those named
    for request in requests:
        for app in apps_of[(claim, request)]:
            if len(found) > NAMED_APPS:
                break
            found.setdefault(app.name, app)
    if len(found) < 2:
        return None
    named = {
        app: [r for r in requests if r in app_uses[(name, claim)]]
        for name, app in list(found.items())[:NAMED_APPS]
    }
    return named, len(found) > NAMED_APPS, ", ".join(sorted(r for r in requests if apps_of[(claim, r)]))


@dataclass
class _Holders:
    """What pods hold across the namespace, first come: each vGPU request (the pod and its container),
    each vGPU claim (the pod and its first use)."""

    requests: dict[tuple[ClaimId, str], tuple[str, ContainerRef]] = field(default_factory=dict)
    claims: dict[ClaimId, tuple[str, Use]] = field(default_factory=dict)


def _across_pods(
    pod: str, uses: Sequence[Use], held: _Holders, policy: Policy, nri: frozenset[ClaimId]
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
                partial(claim_shared_text, pod, use, claim_holder, policy, outside),
            )
        )
    for use in uses:
        held.requests.setdefault((use.claim, use.request), (pod, use.container))
        held.claims.setdefault(use.claim, (pod, use))
    return out


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
    Only a pod that names one of the pod's vGPU claims can hold one of their requests, so the list's
    pods less any others (in the list's order) give the same answer: the webhook's pod cache hands in
    just those (vgpud.webhook.podcache).
    """
    view = pod_view(pod)
    sources = parsed_pod_claims(pod)
    vgpu: dict[str, tuple[ClaimId, frozenset[str]]] = {}
    nri: set[ClaimId] = set()  # the vGPU claims that select NRI nodes
    named_requests: dict[str, frozenset[str]] = {}
    for pod_claim, name in sources.named.items():
        if name in claims and (requests := claim_vgpu_requests(claims[name], policy)):
            vgpu[pod_claim] = (ClaimId(name), requests)
            named_requests[name] = requests
            if claim_selects_nri_nodes(claims[name], policy):
                nri.add(ClaimId(name))
    for pod_claim, template in sources.templates.items():
        if template in templates and (requests := template_vgpu_requests(templates[template], policy)):
            vgpu[pod_claim] = (ClaimId(pod_claim, template), requests)
            if template_selects_nri_nodes(templates[template], policy):
                nri.add(ClaimId(pod_claim, template))
    if not vgpu:
        return []
    label = pod_label(view)
    uses = pod_uses(view, vgpu)
    out = _one_claim_per_container(label, uses, policy, frozenset(nri))
    out += _per_request(label, uses)
    if named_requests:
        held = _Holders()
        for other in other_pods(view, namespace_pods, claims.values()):
            other_vgpu = {
                pod_claim: (ClaimId(name), named_requests[name])
                for pod_claim, name in other.claim_names.items()
                if name in named_requests
            }
            _across_pods(pod_label(other), pod_uses(other, other_vgpu), held, policy, frozenset(nri))
        out += _across_pods(label, uses, held, policy, frozenset(nri))
    return out


def check_claim(claim: Mapping[str, Any], policy: Policy) -> list[Violation]:
    """ResourceClaim CREATE and UPDATE: a claim alone breaks no rule (the pods using it do), but a vGPU
    claim must be one the node daemon can read; RuleInputError says why not."""
    if claim_vgpu_requests(claim, policy):
        claim_view(claim, policy.driver)
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
    controllers that release reservations and deallocate are never blocked by an older state. Of
    `namespace_pods` only those either claim is reserved for are read: any list that holds them does.
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
    view = claim_view(claim, policy.driver)
    if not view.requests or not view.reserved_for:
        return []
    by_uid: dict[str, PodView] = {}
    for obj in namespace_pods:
        pod, _ = namespace_pod(obj)
        if view.reserves(pod):
            by_uid[pod.uid] = pod
    claim_ref = ClaimId(view.name)
    nri = frozenset({claim_ref} if claim_selects_nri_nodes(claim, policy) else ())
    out: list[Violation] = []
    held = _Holders()
    for reserved in view.reserved_for:
        pod = by_uid.pop(reserved.uid, None)
        if pod is None:
            continue  # gone: it holds nothing any more
        uses = [
            Use(ref, claim_ref, request)
            for ref, requests in container_requests(view, pod).items()
            for request in requests
        ]
        out += _per_request(pod_label(pod), uses)
        out += _across_pods(pod_label(pod), uses, held, policy, nri)
    return out

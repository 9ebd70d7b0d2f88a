"""The violations of the admission rules: which rule is broken (`Rule`), by which container, claim and
request (`Violation`), and the message that says so, written only when first read; `summary` is what a
denial shows. The rules themselves: vgpud.webhook.rules.

A denial of a relaxable rule says which switch lifts it (`SWITCHES`), or which claim does not select
NRI nodes and how to make it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from vgpud.partition.model import ContainerRef
from vgpud.relaxations import Relaxation, nri_selector, nri_selector_optional
from vgpud.webhook.claims import ClaimId, Policy, Use


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


def summary(violations: Sequence[Violation], limit: int = 5) -> str:
    """One message for the API server to show: the first `limit` violations, then how many more."""
    text = "; ".join(v.message for v in violations[:limit])
    if len(violations) > limit:
        text += f"; and {len(violations) - limit} more"
    return text


# --------------------------------------------------------------------------------------------------
# The messages


def _role(ref: ContainerRef) -> str:
    role = "sidecar" if ref.sidecar else str(ref.kind)
    return f'{role} container "{ref.name}"'


def _quoted(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _requests_text(requests: Sequence[str]) -> str:
    return f"request{'s' if len(requests) > 1 else ''} {_quoted(requests)}"


def _lifted_text(relaxation: Relaxation) -> str:
    """What a denial of a relaxable rule adds while the relaxation's switch is off."""
    return f"the webhook's switch {SWITCHES[relaxation]} lifts this for claims that select NRI nodes"


def _outside_text(policy: Policy, outside: Sequence[ClaimId]) -> str:
    """What a denial of a relaxed rule adds: the claims that do not select NRI nodes, and the fix."""
    many = len(outside) > 1
    claims = f"claim{'s' if many else ''} {', '.join(str(claim) for claim in outside)}"
    classes = sorted(policy.nri_classes)
    if classes:
        by_class = f"the NRI DeviceClass{'es' if len(classes) > 1 else ''} {_quoted(classes)}"
    else:
        by_class = "a DeviceClass for NRI nodes (the webhook has none: --nri-device-classes)"
    return (
        f'{claims} {"do" if many else "does"} not: add the selector "{nri_selector(policy.driver)}" (or, '
        "while some nodes run a vgpud that does not publish nriMode, "
        f'"{nri_selector_optional(policy.driver)}") to each of {"their" if many else "its"} vGPU requests, '
        f"or request {by_class}"
    )


def claims_text(
    pod: str,
    ref: ContainerRef,
    claims: Mapping[ClaimId, list[str]],
    policy: Policy,
    outside: Sequence[ClaimId] | None,
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
NAMED_APPS = 3

_WHY = {
    Rule.ONE_APP_PER_REQUEST: "a vGPU request may be used by at most one app container",
    Rule.ONE_SIDECAR_PER_REQUEST: "a vGPU request may be used by at most one sidecar container",
    Rule.SIDECAR_ONLY_USER: "a sidecar container must be the only user of its vGPU request",
    Rule.ONE_POD_PER_REQUEST: "a vGPU request may be used by one pod only",
}


def shared_text(pod: str, use: Use, holder: ContainerRef, holder_pod: str | None, rule: Rule) -> str:
    where = _role(holder) if holder_pod is None else f"{_role(holder)} of pod {holder_pod}"
    return (
        f'pod {pod}: {_role(use.container)} uses request "{use.request}" of vGPU claim {use.claim}, '
        f"which {where} also uses; {_WHY[rule]}"
    )


def init_text(
    pod: str, init: ContainerRef, claim: ClaimId, named: Mapping[ContainerRef, list[str]], more: bool
) -> str:
    details = ", ".join(f'"{app.name}" ({_requests_text(requests)})' for app, requests in named.items())
    count = f"more than {NAMED_APPS}" if more else str(len(named))
    return (
        f"pod {pod}: {_role(init)} shares vGPU claim {claim} with {count} app containers "
        f"({details}{', ...' if more else ''}); an init container may share vGPU requests with at most one "
        "app container"
    )


def claim_shared_text(
    pod: str, use: Use, held_by: tuple[str, Use], policy: Policy, outside: Sequence[ClaimId] | None
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

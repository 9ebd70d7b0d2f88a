"""The two relaxations, allowed and denied: switch off / on x the claims select NRI nodes or not x
named claim / template / firstAvailable / NRI DeviceClass, at pod CREATE and at reservation; and the
denials' messages (the switch that lifts the rule, or the claims that do not select and the fix); both
selector forms (plain, and CEL's optional one for a roll from a vgpud without nriMode)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from tests import objects as o
from tests.unit.webhook.builders import (
    NRI_CLASS,
    POD3_UID,
    RELAXED,
    allocated,
    finished,
    nri_request,
    spec_claim,
    template,
)
from vgpud.relaxations import Relaxation, nri_selector, nri_selector_optional
from vgpud.webhook.claims import Policy, claim_selects_nri_nodes, template_selects_nri_nodes
from vgpud.webhook.rules import check_claim_status, check_pod
from vgpud.webhook.violations import Rule, summary

c, ref = o.container, o.ref

#: the chart's classes and no relaxation: the default
OFF = replace(RELAXED, relaxations=frozenset())
ONLY_MULTIPLE = replace(RELAXED, relaxations=frozenset({Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER}))
ONLY_ACROSS = replace(RELAXED, relaxations=frozenset({Relaxation.CLAIM_ACROSS_PODS}))


def nri_alternatives(name: str) -> dict[str, Any]:
    """A firstAvailable request whose every alternative selects NRI nodes (selector, NRI class)."""
    selector = nri_request("x")["exactly"]["selectors"]
    return {
        "name": name,
        "firstAvailable": [
            {"name": "big", "deviceClassName": "vgpu-manager", "selectors": selector},
            {"name": "small", "deviceClassName": NRI_CLASS},
        ],
    }


def mixed_alternatives(name: str) -> dict[str, Any]:
    """A firstAvailable request with one alternative that does not select NRI nodes."""
    return {
        **nri_alternatives(name),
        "firstAvailable": [
            *nri_alternatives(name)["firstAvailable"][:1],
            {"name": "any", "deviceClassName": "vgpu-manager"},
        ],
    }


CLAIMS = {
    claim["metadata"]["name"]: claim
    for claim in (
        spec_claim("sel", nri_request("r0"), nri_request("r1")),  # by its own selector
        spec_claim("cls", o.exactly("r0", NRI_CLASS), o.exactly("r1", NRI_CLASS)),  # by the NRI class
        spec_claim("fa", nri_alternatives("r0"), nri_alternatives("r1")),
        spec_claim("sel-nic", nri_request("r0"), o.exactly("eth", "dranet")),  # the NIC needs none
        spec_claim("plain", o.exactly("r0"), o.exactly("r1")),
        spec_claim("half", nri_request("r0"), o.exactly("r1")),  # one vGPU request without
        spec_claim("fa-half", mixed_alternatives("r0"), nri_alternatives("r1")),
        spec_claim(
            "beta", {"name": "r0", "deviceClassName": NRI_CLASS}, {"name": "r1", "deviceClassName": NRI_CLASS}
        ),
    )
}
TEMPLATES = {
    "nri-template": template("nri-template", nri_request("r0"), o.exactly("r1", NRI_CLASS)),
    "plain-template": template("plain-template", o.exactly("r0")),
}
SELECTING = ("sel", "cls", "fa", "sel-nic", "beta")
NOT_SELECTING = ("plain", "half", "fa-half")


@pytest.mark.parametrize("name", SELECTING + NOT_SELECTING)
def test_which_claims_select_nri_nodes(name: str) -> None:
    assert claim_selects_nri_nodes(CLAIMS[name], RELAXED) is (name in SELECTING)


def test_which_templates_select_nri_nodes() -> None:
    assert template_selects_nri_nodes(TEMPLATES["nri-template"], RELAXED)
    assert not template_selects_nri_nodes(TEMPLATES["plain-template"], RELAXED)


def test_an_allocated_request_the_spec_does_not_select_keeps_the_claim_off() -> None:
    """A claim allocated to our driver on a request of another class counts that request as vGPU: it
    must select NRI nodes too."""
    odd = allocated(
        spec_claim("odd", nri_request("r0"), o.exactly("r1", "odd-class")),
        results=[o.result("r0"), o.result("r1")],
    )
    assert not claim_selects_nri_nodes(odd, RELAXED)


# --------------------------------------------------------------------------------------------------
# Rule 1: one vGPU claim per container


def two_claims(first: str, second: str) -> dict[str, Any]:
    """One app container using two vGPU claims; a name ending in -template is a template claim."""
    claims = {k: v for k, v in (("one", first), ("two", second)) if not v.endswith("-template")}
    templates = {k: None for k, v in (("one", first), ("two", second)) if v.endswith("-template")}
    out = o.pod(
        "new",
        POD3_UID,
        containers=[c("a", ref("one", "r0"), ref("two", "r0"))],
        claims=claims,
        templates=templates,
    )
    for entry in out["spec"]["resourceClaims"]:  # the template names as given
        if "resourceClaimTemplateName" in entry:
            entry["resourceClaimTemplateName"] = first if entry["name"] == "one" else second
    return out


@dataclass
class Case:
    id: str
    pod: dict[str, Any]
    policy: Policy
    #: (rule, container, claim, request) of each violation, in order; empty: allowed
    expect: list[tuple[Rule, str, str, str]] = field(default_factory=list)
    others: list[dict[str, Any]] = field(default_factory=list)


def rule1(first: str, second: str) -> tuple[Rule, str, str, str]:
    name = {"nri-template": "one", "plain-template": "two"}
    return (
        Rule.ONE_CLAIM_PER_CONTAINER,
        "a",
        f"{name.get(first, first)}, {name.get(second, second)}",
        "r0, r0",
    )


RULE1 = [
    Case("off: two selecting claims", two_claims("sel", "cls"), OFF, [rule1("sel", "cls")]),
    Case("off: two plain claims", two_claims("plain", "half"), OFF, [rule1("plain", "half")]),
    Case("off: the other switch on", two_claims("sel", "cls"), ONLY_ACROSS, [rule1("sel", "cls")]),
    Case("on: selector and NRI class", two_claims("sel", "cls"), ONLY_MULTIPLE),
    Case("on: firstAvailable and v1beta1", two_claims("fa", "beta"), RELAXED),
    Case("on: a named claim and a template", two_claims("sel-nic", "nri-template"), RELAXED),
    Case("on: one claim plain", two_claims("sel", "plain"), RELAXED, [rule1("sel", "plain")]),
    Case("on: one claim half", two_claims("half", "sel"), RELAXED, [rule1("half", "sel")]),
    Case(
        "on: one firstAvailable alternative not",
        two_claims("fa", "fa-half"),
        RELAXED,
        [rule1("fa", "fa-half")],
    ),
    Case(
        "on: a plain template", two_claims("sel", "plain-template"), RELAXED, [rule1("sel", "plain-template")]
    ),
    Case(
        "on: the other rules still hold",
        o.pod(
            "new",
            POD3_UID,
            containers=[c("a", ref("one", "r0"), ref("two")), c("b", ref("one", "r0"))],
            claims={"one": "sel", "two": "cls"},
        ),
        RELAXED,
        [(Rule.ONE_APP_PER_REQUEST, "b", "sel", "r0")],
    ),
]


# --------------------------------------------------------------------------------------------------
# Rule 5: one pod per vGPU claim


def uses(claim: str, request: str | None, *, name: str = "new", uid: str = POD3_UID) -> dict[str, Any]:
    return o.pod(
        name, uid, containers=[c("a" if name == "new" else "x", ref("gpu", request))], claims={"gpu": claim}
    )


def holder(claim: str, request: str | None = "r0") -> dict[str, Any]:
    return uses(claim, request, name="other", uid=o.POD2_UID)


def rule5(claim: str, request: str = "r1") -> tuple[Rule, str, str, str]:
    return (Rule.ONE_POD_PER_CLAIM, "a", claim, request)


RULE5 = [
    Case("off: selecting claim", uses("sel", "r1"), OFF, [rule5("sel")], [holder("sel")]),
    Case("off: plain claim", uses("plain", "r1"), OFF, [rule5("plain")], [holder("plain")]),
    Case("off: the other switch on", uses("cls", "r1"), ONLY_MULTIPLE, [rule5("cls")], [holder("cls")]),
    Case("on: selector", uses("sel", "r1"), ONLY_ACROSS, others=[holder("sel")]),
    Case("on: NRI class", uses("cls", "r1"), RELAXED, others=[holder("cls")]),
    Case("on: firstAvailable", uses("fa", "r1"), RELAXED, others=[holder("fa")]),
    Case("on: v1beta1", uses("beta", "r1"), RELAXED, others=[holder("beta")]),
    Case("on: plain claim", uses("plain", "r1"), RELAXED, [rule5("plain")], [holder("plain")]),
    Case("on: one request without", uses("half", "r1"), RELAXED, [rule5("half")], [holder("half")]),
    Case(
        "on: one alternative without", uses("fa-half", "r1"), RELAXED, [rule5("fa-half")], [holder("fa-half")]
    ),
    Case(
        "on: the same request is rule 4, which no switch lifts",
        uses("sel", "r0"),
        RELAXED,
        [(Rule.ONE_POD_PER_REQUEST, "a", "sel", "r0")],
        [holder("sel")],
    ),
    Case(
        "off: the whole claim against one request: rule 4 on it, rule 5 on the other",
        uses("plain", None),
        OFF,
        [(Rule.ONE_POD_PER_REQUEST, "a", "plain", "r0"), rule5("plain")],
        [holder("plain")],
    ),
    Case("off: the holder has finished", uses("plain", "r1"), OFF, others=[finished(holder("plain"))]),
    Case(
        "off: the other pod uses only the claim's NIC request",
        uses("sel-nic", "r0"),
        OFF,
        others=[holder("sel-nic", "eth")],
    ),
]


@pytest.mark.parametrize("case", RULE1 + RULE5, ids=lambda case: case.id)
def test_relaxation_table(case: Case) -> None:
    violations = check_pod(case.pod, CLAIMS, TEMPLATES, case.others, case.policy)
    assert [(v.rule, v.container, v.claim, v.request) for v in violations] == case.expect


# --------------------------------------------------------------------------------------------------
# Rule 5 at reservation (resourceclaims/status)

A, B, B_SAME = ("a", o.POD1_UID, "r0"), ("b", o.POD2_UID, "r1"), ("b", o.POD2_UID, "r0")


def reserved(claim: str, *pods: dict[str, Any]) -> dict[str, Any]:
    return allocated(CLAIMS[claim], results=[o.result("r0"), o.result("r1")], reserved_for=o.reserved(*pods))


#: (id, claim, policy, reserved pods (name, uid, request used), (rule, pod, request) of each violation)
STATUS = [
    ("off", "sel", OFF, (A, B), [(Rule.ONE_POD_PER_CLAIM, "default/b", "r1")]),
    ("on, selecting", "sel", RELAXED, (A, B), []),
    ("on, NRI class", "cls", RELAXED, (A, B), []),
    ("on, not selecting", "plain", RELAXED, (A, B), [(Rule.ONE_POD_PER_CLAIM, "default/b", "r1")]),
    ("on, half", "half", RELAXED, (A, B), [(Rule.ONE_POD_PER_CLAIM, "default/b", "r1")]),
    ("on, one request", "sel", RELAXED, (A, B_SAME), [(Rule.ONE_POD_PER_REQUEST, "default/b", "r0")]),
    ("off, reserved for one pod", "plain", OFF, (A,), []),
]


@pytest.mark.parametrize(
    ("claim", "policy", "pods", "expect"), [s[1:] for s in STATUS], ids=[s[0] for s in STATUS]
)
def test_reservation_table(
    claim: str, policy: Policy, pods: tuple[tuple[str, str, str], ...], expect: list[tuple[Rule, str, str]]
) -> None:
    objs = [uses(claim, request, name=name, uid=uid) for name, uid, request in pods]
    violations = check_claim_status(reserved(claim, *objs), reserved(claim, objs[0]), objs, policy)
    assert [(v.rule, v.pod, v.request) for v in violations] == expect


def test_a_reservation_breach_already_there_is_not_the_updates() -> None:
    """Switching the relaxation off leaves claims reserved for several pods; their controllers' later
    updates (releasing a pod) are not blocked by that older state."""
    pods = [uses("sel", request, name=name, uid=uid) for name, uid, request in (A, B)]
    both = reserved("sel", *pods)
    assert check_claim_status(both, both, pods, OFF) == []
    assert check_claim_status(reserved("sel", pods[0]), both, pods, OFF) == []


# --------------------------------------------------------------------------------------------------
# Messages


def message(pod: dict[str, Any], policy: Policy, others: tuple[dict[str, Any], ...] = ()) -> str:
    return summary(check_pod(pod, CLAIMS, TEMPLATES, others, policy))


SELECTOR = "device.attributes['manager.nvidia.com'].nriMode == true"
OPTIONAL = "device.attributes['manager.nvidia.com'].?nriMode.orValue(false)"
#: the fix a denial names: both selector forms
ADD = (
    f'add the selector "{SELECTOR}" (or, while some nodes run a vgpud that does not publish nriMode, '
    f'"{OPTIONAL}")'
)


def test_rule_1_switch_off_names_the_switch() -> None:
    assert message(two_claims("sel", "cls"), OFF) == (
        'pod default/new: app container "a" uses 2 vGPU claims (claim "sel" (request "r0"), claim "cls" '
        '(request "r0")); a container may use at most one vGPU claim; the webhook\'s switch '
        "--allow-multiple-vgpu-claims-per-container lifts this for claims that select NRI nodes"
    )


def test_rule_1_switch_on_names_the_claims_that_do_not_select_and_the_fix() -> None:
    assert message(two_claims("plain", "sel"), RELAXED) == (
        'pod default/new: app container "a" uses 2 vGPU claims (claim "plain" (request "r0"), claim "sel" '
        '(request "r0")); a container may use several vGPU claims only when each selects NRI nodes, and '
        f'claim "plain" does not: {ADD} to each of its vGPU requests, or request '
        'the NRI DeviceClass "vgpu-manager-nri"'
    )
    assert message(two_claims("half", "plain-template"), RELAXED) == (
        'pod default/new: app container "a" uses 2 vGPU claims (claim "half" (request "r0"), claim "two" '
        '(generated from template "plain-template") (request "r0")); a container may use several vGPU '
        'claims only when each selects NRI nodes, and claims "half", "two" (generated from template '
        f'"plain-template") do not: {ADD} to each of their vGPU requests, or '
        'request the NRI DeviceClass "vgpu-manager-nri"'
    )


def test_rule_5_switch_off_names_the_switch() -> None:
    assert message(uses("sel", "r1"), OFF, (holder("sel"),)) == (
        'pod default/new: app container "a" uses request "r1" of vGPU claim "sel", whose request "r0" app '
        'container "x" of pod default/other uses; a vGPU claim may be used by one pod only; the webhook\'s '
        "switch --allow-vgpu-claims-across-pods lifts this for claims that select NRI nodes"
    )


def test_rule_5_switch_on_names_the_claim_and_the_fix() -> None:
    assert message(uses("plain", "r1"), RELAXED, (holder("plain"),)) == (
        'pod default/new: app container "a" uses request "r1" of vGPU claim "plain", whose request "r0" app '
        'container "x" of pod default/other uses; several pods may use one vGPU claim only when it selects '
        f'NRI nodes, and claim "plain" does not: {ADD} to each of its vGPU '
        'requests, or request the NRI DeviceClass "vgpu-manager-nri"'
    )


def test_without_nri_classes_the_fix_says_none_is_configured() -> None:
    policy = replace(RELAXED, nri_classes=frozenset())
    assert message(uses("plain", "r1"), policy, (holder("plain"),)).endswith(
        f"{ADD} to each of its vGPU requests, or request a DeviceClass for NRI "
        "nodes (the webhook has none: --nri-device-classes)"
    )
    two = replace(
        RELAXED, vgpu_classes=RELAXED.vgpu_classes | {"b-nri"}, nri_classes=frozenset({NRI_CLASS, "b-nri"})
    )
    assert message(uses("plain", "r1"), two, (holder("plain"),)).endswith(
        'or request the NRI DeviceClasses "b-nri", "vgpu-manager-nri"'
    )


# --------------------------------------------------------------------------------------------------
# Both selector forms: the plain one and CEL's optional one (for a roll from a vgpud without nriMode)

FORMS = pytest.mark.parametrize("form", [nri_selector, nri_selector_optional], ids=["plain", "optional"])


def by_form(form: Callable[[str], str]) -> dict[str, dict[str, Any]]:
    """Claims "one" and "two", each of two requests that select NRI nodes by `form`."""
    return {
        name: spec_claim(name, nri_request("r0", selector=form), nri_request("r1", selector=form))
        for name in ("one", "two")
    }


@FORMS
def test_either_selector_form_admits_the_relaxed_shapes(form: Callable[[str], str]) -> None:
    claims = by_form(form)
    both = o.pod(
        "new",
        POD3_UID,
        containers=[c("a", ref("gpu", "r0"), ref("more", "r0"))],
        claims={"gpu": "one", "more": "two"},
    )
    assert check_pod(both, claims, {}, [], RELAXED) == []
    assert [v.rule for v in check_pod(both, claims, {}, [], OFF)] == [Rule.ONE_CLAIM_PER_CONTAINER]
    across = o.pod("new", POD3_UID, containers=[c("a", ref("gpu", "r1"))], claims={"gpu": "one"})
    held = o.pod("other", o.POD2_UID, containers=[c("x", ref("gpu", "r0"))], claims={"gpu": "one"})
    assert check_pod(across, claims, {}, [held], RELAXED) == []
    assert [v.rule for v in check_pod(across, claims, {}, [held], OFF)] == [Rule.ONE_POD_PER_CLAIM]


def test_or_value_true_does_not_select_nri_nodes() -> None:
    """`orValue(true)` also selects the devices of nodes without the attribute: denied, with the fix."""
    claims = by_form(lambda driver: f"device.attributes['{driver}'].?nriMode.orValue(true)")
    across = o.pod("new", POD3_UID, containers=[c("a", ref("gpu", "r1"))], claims={"gpu": "one"})
    held = o.pod("other", o.POD2_UID, containers=[c("x", ref("gpu", "r0"))], claims={"gpu": "one"})
    (violation,) = check_pod(across, claims, {}, [held], RELAXED)
    assert violation.rule is Rule.ONE_POD_PER_CLAIM
    assert f'claim "one" does not: {ADD} to each of its vGPU requests' in summary([violation])

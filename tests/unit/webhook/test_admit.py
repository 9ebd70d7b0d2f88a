"""Deciding a review: what is looked up, what is allowed without a look-up, how failures answer, and
what the recorder keeps."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from tests import objects as o
from tests.unit.webhook.builders import (
    POLICY,
    RELAXED,
    FakeLookup,
    allocated,
    claim_review,
    nri_request,
    review,
    sidecar,
    spec_claim,
    template,
)
from vgpud.kube.api import KubeError
from vgpud.recorder import Outcome
from vgpud.relaxations import nri_selector, nri_selector_optional
from vgpud.webhook.admit import Admitter
from vgpud.webhook.review import AdmissionRequest, parse_review

c, ref = o.container, o.ref
GPU = spec_claim("gpu-claim", o.exactly("r0"), o.exactly("r1"))
NIC = spec_claim("nic-claim", o.exactly("eth", "dranet"))


def request_of(document: dict[str, Any]) -> AdmissionRequest:
    return parse_review(json.dumps(document).encode())


def new_pod(*containers: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return o.pod("new", "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f", containers=list(containers), **kwargs)


async def test_a_violating_pod_is_denied_with_the_rule_message() -> None:
    lookup = FakeLookup({"gpu-claim": GPU})
    admitter = Admitter(lookup, POLICY)
    decision = await admitter.decide(
        request_of(review(new_pod(c("a", ref("gpu", "r0")), c("b", ref("gpu", "r0")))))
    )
    assert not decision.allowed
    assert decision.code == 403
    assert decision.message.startswith('pod default/new: app container "b" uses request "r0" of vGPU claim')
    assert lookup.calls == [("claim", "gpu-claim"), ("pods", "default")]
    (call,) = admitter.recorder.recent()
    assert (call.component, call.call, call.outcome) == ("webhook", "pods CREATE", Outcome.REJECTED)
    assert (call.pod_namespace, call.pod_name, call.pod_uid) == (
        "default",
        "new",
        "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f",
    )
    assert call.detail == decision.message


async def test_a_valid_pod_is_allowed_and_recorded_as_checked() -> None:
    admitter = Admitter(FakeLookup({"gpu-claim": GPU}), POLICY)
    decision = await admitter.decide(
        request_of(review(new_pod(c("a", ref("gpu", "r0")), c("b", ref("gpu", "r1")))))
    )
    assert decision.allowed
    assert admitter.recorder.recent()[0].outcome == Outcome.OK


@pytest.mark.parametrize("form", [nri_selector, nri_selector_optional], ids=["plain", "optional"])
async def test_another_pod_of_the_namespace_holding_the_request_or_the_claim_denies(
    form: Callable[[str], str],
) -> None:
    """Rule 4 (the request) always; rule 5 (the claim) unless relaxed for a claim that selects NRI
    nodes, by either selector form; a pod of another namespace holds nothing here."""
    holder = o.pod("holder", o.POD2_UID, containers=[c("x", ref("gpu", "r0"))])
    elsewhere = o.pod("far", o.POD1_UID, containers=[c("x", ref("gpu", "r1"))], namespace="team-b")
    nri = spec_claim("gpu-claim", nri_request("r0", selector=form), nri_request("r1", selector=form))
    for claim, policy, r1_allowed in ((GPU, POLICY, False), (GPU, RELAXED, False), (nri, RELAXED, True)):
        admitter = Admitter(FakeLookup({"gpu-claim": claim}, pods=[holder, elsewhere]), policy)
        same = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
        assert "a vGPU request may be used by one pod only" in same.message
        other = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r1"))))))
        assert other.allowed is r1_allowed, other.message


async def test_template_claims_are_looked_up_and_checked() -> None:
    lookup = FakeLookup(templates={"gpu-template": template("gpu-template", o.exactly("r0"))})
    admitter = Admitter(lookup, POLICY)
    pod = new_pod(c("a"), init=[sidecar("s", ref("gpu")), c("i", ref("gpu"))], templates={"gpu": None})
    decision = await admitter.decide(request_of(review(pod)))
    assert not decision.allowed
    assert "a sidecar container must be the only user of its vGPU request" in decision.message
    assert lookup.calls == [("template", "gpu-template")]  # no named claim: no pod listing


@pytest.mark.parametrize(
    "obj",
    [
        new_pod(c("a")),  # no resource claims
        new_pod(c("a", ref("nic")), c("b", ref("nic")), claims={"nic": "nic-claim"}),
    ],
)
async def test_pods_without_vgpu_claims_are_allowed(obj: dict[str, Any]) -> None:
    lookup = FakeLookup({"nic-claim": NIC})
    decision = await Admitter(lookup, POLICY).decide(request_of(review(obj)))
    assert decision.allowed
    assert ("pods", "default") not in lookup.calls


async def test_missing_claims_and_templates_allow_with_warnings() -> None:
    pod = new_pod(c("a", ref("gpu")), c("b", ref("t")), claims={"gpu": "gpu-claim"}, templates={"t": None})
    decision = await Admitter(FakeLookup(), POLICY).decide(request_of(review(pod)))
    assert decision.allowed
    assert decision.warnings == (
        'ResourceClaim "gpu-claim" does not exist yet: its vGPU requests are checked when it is reserved '
        "for this pod",
        'ResourceClaimTemplate "t-template" does not exist: no claim can be generated',
    )


@pytest.mark.parametrize(
    ("document", "call"),
    [
        (review({"metadata": {"name": "cm"}}, resource="configmaps", kind="ConfigMap"), "configmaps CREATE"),
        (review(None, operation="DELETE", old=new_pod(c("a", ref("gpu")))), "pods DELETE"),
        (review(new_pod(c("a")), operation="UPDATE", old=new_pod(c("a"))), "pods UPDATE"),
        (claim_review(NIC), "resourceclaims CREATE"),
        (
            claim_review(NIC, operation="UPDATE", old=NIC, sub_resource="status"),
            "resourceclaims/status UPDATE",
        ),
    ],
)
async def test_objects_that_are_not_ours_are_allowed_unread(document: dict[str, Any], call: str) -> None:
    lookup = FakeLookup()
    admitter = Admitter(lookup, POLICY)
    assert (await admitter.decide(request_of(document))).allowed
    assert lookup.calls == []
    (recorded,) = admitter.recorder.recent()
    assert (recorded.call, recorded.outcome) == (call, Outcome.SKIPPED)


async def test_a_claim_create_is_checked_for_readability() -> None:
    admitter = Admitter(FakeLookup(), POLICY)
    assert (await admitter.decide(request_of(claim_review(GPU)))).allowed
    broken = allocated(GPU, results=[o.result("nope")])
    decision = await admitter.decide(request_of(claim_review(broken)))
    assert (decision.allowed, decision.code) == (False, 400)
    assert decision.message.startswith(
        "vgpud webhook cannot read resourceclaims default/gpu-claim: ResourceClaim"
    )


async def test_a_reservation_that_breaks_rule_4_is_denied() -> None:
    pod_a = o.pod("a", o.POD1_UID, containers=[c("main", ref("gpu", "r0"))])
    pod_b = o.pod("b", o.POD2_UID, containers=[c("main", ref("gpu", "r0"))])
    results = [o.result("r0"), o.result("r1")]
    old = allocated(GPU, results=results, reserved_for=o.reserved(pod_a))
    new = allocated(GPU, results=results, reserved_for=o.reserved(pod_a, pod_b))
    lookup = FakeLookup(pods=[pod_a, pod_b])
    admitter = Admitter(lookup, POLICY)
    document = claim_review(new, operation="UPDATE", old=old, sub_resource="status")
    decision = await admitter.decide(request_of(document))
    assert not decision.allowed
    assert decision.message.startswith('pod default/b: app container "main" uses request "r0"')
    assert lookup.calls == [("pods", "default")]
    recorded = admitter.recorder.recent()[0]
    assert (recorded.call, recorded.claim_uid) == ("resourceclaims/status UPDATE", GPU["metadata"]["uid"])
    # the controller releasing the second reservation is never blocked
    release = claim_review(old, operation="UPDATE", old=new, sub_resource="status")
    assert (await admitter.decide(request_of(release))).allowed


async def test_a_status_update_without_reservations_needs_no_pods() -> None:
    lookup = FakeLookup()
    document = claim_review(
        allocated(GPU, results=[o.result("r0")]), operation="UPDATE", old=GPU, sub_resource="status"
    )
    assert (await Admitter(lookup, POLICY).decide(request_of(document))).allowed
    assert lookup.calls == []


async def test_an_api_failure_denies_with_code_500() -> None:
    lookup = FakeLookup({"gpu-claim": GPU})
    lookup.fail = KubeError("connection refused")
    admitter = Admitter(lookup, POLICY)
    decision = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
    assert (decision.allowed, decision.code) == (False, 500)
    assert decision.message == "vgpud webhook could not check pods default/new: connection refused"
    assert admitter.recorder.recent()[0].outcome == Outcome.ERROR


async def test_a_slow_api_denies_with_code_500_before_the_api_server_gives_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lookup = FakeLookup({"gpu-claim": GPU})
    lookup.delay = 60
    admitter = Admitter(lookup, POLICY, lookup_timeout=2.5)
    started = trio.current_time()
    decision = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
    assert trio.current_time() - started == pytest.approx(2.5)
    assert (decision.allowed, decision.code) == (False, 500)
    assert "the API server did not answer in 2.5s" in decision.message


async def test_a_pod_the_rules_cannot_read_is_denied_with_code_400() -> None:
    pod = new_pod(c("a", ref("gpu")))
    pod["spec"]["containers"][0]["resources"]["claims"][0]["name"] = "undeclared"
    decision = await Admitter(FakeLookup(), POLICY).decide(request_of(review(pod)))
    assert (decision.allowed, decision.code) == (False, 400)
    assert "'undeclared' is not in spec.resourceClaims" in decision.message


async def test_a_pod_without_a_namespace_anywhere_is_denied_with_code_400() -> None:
    document = review(new_pod(c("a", ref("gpu"))))
    del document["request"]["namespace"], document["request"]["object"]["metadata"]["namespace"]
    decision = await Admitter(FakeLookup(), POLICY).decide(request_of(document))
    assert (decision.allowed, decision.code) == (False, 400)
    assert "metadata.namespace: missing" in decision.message


async def test_a_failure_inside_the_webhook_still_answers(caplog: pytest.LogCaptureFixture) -> None:
    lookup = FakeLookup({"gpu-claim": GPU})
    lookup.fail = ZeroDivisionError("a bug")
    admitter = Admitter(lookup, POLICY)
    decision = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
    assert (decision.allowed, decision.code) == (False, 500)
    assert decision.message == "vgpud webhook failed: ZeroDivisionError: a bug"
    assert admitter.recorder.recent()[0].outcome == Outcome.ERROR
    assert "failed" in caplog.text


@pytest.mark.parametrize(
    ("lookup", "reason"),
    [
        (
            FakeLookup(
                {"gpu-claim": GPU}, pods=[dict(o.pod("x", o.POD2_UID, containers=[]), status={"phase": 1})]
            ),
            "Pod default/x: status.phase: expected a string, got int",
        ),
        (
            FakeLookup({"gpu-claim": ["not", "a", "claim"]}),
            "ResourceClaim gpu-claim: expected an object, got list",
        ),
    ],
    ids=["a namespace pod's phase", "a claim"],
)
async def test_an_api_object_of_the_wrong_type_is_denied_with_code_400_and_logged(
    lookup: FakeLookup, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    admitter = Admitter(lookup, POLICY)
    decision = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
    assert (decision.allowed, decision.code) == (False, 400)
    assert decision.message == (
        f"vgpud webhook cannot read what the API server returned for pods default/new: {reason}"
    )
    assert admitter.recorder.recent()[0].outcome == Outcome.ERROR
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert reason in warning.getMessage()


class OddList(FakeLookup):
    """A pod listing that is not a list of objects (a proxy or API server answering garbage)."""

    def __init__(self, listed: Any) -> None:
        super().__init__({"gpu-claim": GPU})
        self.listed = listed

    async def list_pods(self, namespace: str) -> Any:
        await super().list_pods(namespace)
        return self.listed


@pytest.mark.parametrize(
    ("listed", "reason"),
    [
        ({"items": []}, "the pods of namespace default: expected a list, got dict"),
        ([new_pod(c("x")), "pod"], "the pods of namespace default: item 1: expected an object, got str"),
    ],
)
async def test_a_pod_listing_that_is_not_a_list_of_objects_is_denied_with_code_400(
    listed: Any, reason: str
) -> None:
    decision = await Admitter(OddList(listed), POLICY).decide(request_of(review(new_pod(c("a", ref("gpu"))))))
    assert (decision.allowed, decision.code, decision.message) == (
        False,
        400,
        f"vgpud webhook cannot read what the API server returned for pods default/new: {reason}",
    )


async def test_a_decision_still_running_at_the_deadline_is_answered_with_code_500() -> None:
    """The rules over a namespace of 100,000 containers run in a worker thread; the review is answered
    at its deadline while they still run."""
    crowd = [
        o.pod(f"p{k}", f"00000000-0000-4000-8000-{k:012d}", containers=[c(f"c{j}") for j in range(50)])
        for k in range(2000)
    ]
    admitter = Admitter(FakeLookup({"gpu-claim": GPU}, pods=crowd), POLICY, lookup_timeout=0.05)
    started = time.perf_counter()
    decision = await admitter.decide(request_of(review(new_pod(c("a", ref("gpu", "r0"))))))
    assert time.perf_counter() - started < 0.05 + 0.5  # not the whole decision's time
    assert (decision.allowed, decision.code) == (False, 500)
    assert (
        decision.message == "vgpud webhook could not check pods default/new: deciding took longer than 0.05s"
    )
    assert admitter.cpu.offloaded == 1

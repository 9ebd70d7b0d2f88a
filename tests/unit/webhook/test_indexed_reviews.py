"""A review decided through the pod cache's index answers as one decided over the namespace's whole
list: for generated namespaces (named and template claims, claims generated under a named claim's
name, finished pods, other namespaces, reservations of every kind), both for pod creation and for
claim reservations; before the cache is current the namespace is listed; a reserved pod the cache
lags on is read from the API server."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests import objects as o
from tests.unit.webhook.builders import (
    POLICY,
    RELAXED,
    CachedLookup,
    FakeLookup,
    StaticPods,
    allocated,
    claim_review,
    nri_request,
    review,
    spec_claim,
    template,
)
from vgpud.webhook.admit import Admitter
from vgpud.webhook.claims import Policy
from vgpud.webhook.podcache import PodCache
from vgpud.webhook.podselect import pod_claim_names, reservations
from vgpud.webhook.review import AdmissionRequest, Decision, parse_review

c, ref = o.container, o.ref
NS, OTHER_NS = o.NAMESPACE, "team-b"
NAMED = ("c0", "c1", "c2", "nri", "nic")
CLAIMS = {
    "c0": spec_claim("c0", o.exactly("r0"), o.exactly("r1")),
    "c1": spec_claim("c1", o.exactly("r0"), o.exactly("r1")),
    "c2": spec_claim("c2", o.exactly("r0")),
    "nri": spec_claim("nri", nri_request("r0"), nri_request("r1")),
    "nic": spec_claim("nic", o.exactly("eth", "dranet")),
}
TEMPLATES = {"t-template": template("t-template", o.exactly("r0"), o.exactly("r1"))}
PHASES = ("Pending", "Running", "Running", "Succeeded", "Failed")
CASES = 300


def request_of(document: dict[str, Any]) -> AdmissionRequest:
    return parse_review(json.dumps(document).encode())


def uid(k: int) -> str:
    return f"00000000-0000-4000-8000-{k:012d}"


def random_pod(rng: random.Random, name: str, k: int, namespace: str = NS) -> dict[str, Any]:
    """Containers using requests of up to two named claims and a template's claim, which may be
    generated yet (named in the status only, now and then under a named claim's name)."""
    claims = {f"p{i}": name for i, name in enumerate(rng.sample(NAMED, rng.randrange(3)))}
    templates: dict[str, str | None] = {}
    if rng.random() < 0.3:
        templates["t"] = rng.choice((None, f"{name}-t", "c0", "c1"))
    pod_claims = [*claims, *templates]
    containers = []
    for j in range(rng.randint(1, 3)):
        refs = [
            ref(pc, rng.choice((None, "r0", "r1")))
            for pc in rng.sample(pod_claims, min(len(pod_claims), rng.randrange(3)))
        ]
        containers.append(c(f"a{j}", *refs))
    init = [c("i", ref(pod_claims[0]))] if pod_claims and rng.random() < 0.2 else None
    pod = o.pod(
        name,
        uid(k),
        containers=containers,
        init=init,
        claims=claims,
        templates=templates or None,
        namespace=namespace,
    )
    pod["status"]["phase"] = rng.choice(PHASES)
    return pod


def namespace_pods(rng: random.Random) -> list[dict[str, Any]]:
    """Pods of the namespace and of another, in the list's order (by namespace, then name)."""
    pods = [
        random_pod(rng, f"pod-{rng.randrange(10_000):04d}-{k}", k, rng.choice((NS, NS, NS, OTHER_NS)))
        for k in range(rng.randrange(25))
    ]
    return sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))


def pod_review(rng: random.Random) -> dict[str, Any]:
    return review(random_pod(rng, "new", 10_000))


def status_review(rng: random.Random, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """A named claim reserved for some of the pods (of any namespace, finished, naming it or not) and
    for pods that do not exist; before, for some of them."""
    name = rng.choice(("c0", "c1", "nri"))
    gone = o.pod("gone", uid(20_000), containers=[])
    naming = [p for p in pods if name in pod_claim_names(p)]
    chosen = rng.sample([*pods, gone], min(len(pods) + 1, rng.randint(1, 3)))
    chosen += rng.sample(naming, min(len(naming), rng.randint(0, 2)))
    chosen = list({p["metadata"]["uid"]: p for p in chosen}.values())
    rng.shuffle(chosen)
    results = [o.result("r0"), o.result("r1", "vgpu-1")]
    new = allocated(CLAIMS[name], results=results, reserved_for=o.reserved(*chosen))
    old = allocated(CLAIMS[name], results=results, reserved_for=o.reserved(*chosen[: rng.randrange(3)]))
    return claim_review(
        new, operation="UPDATE", old=old if rng.random() < 0.8 else None, sub_resource="status"
    )


def reads(document: dict[str, Any], pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The pods a claim status review reads one by one when the cache is current: those reserved
    that no pod of the namespace with that uid names the claim."""
    request = document["request"]
    if request["resource"]["resource"] != "resourceclaims":
        return []
    name = request["object"]["metadata"]["name"]
    naming = {
        p["metadata"]["uid"] for p in pods if p["metadata"]["namespace"] == NS and name in pod_claim_names(p)
    }
    reserved = {**reservations(request["oldObject"]), **reservations(request["object"])}
    return [("pod", n) for n in sorted({n for u, n in reserved.items() if u not in naming})]


def answer(decision: Decision) -> tuple[Any, ...]:
    return decision.allowed, decision.code, decision.message, decision.warnings


async def decide(lookup: FakeLookup, policy: Policy, document: dict[str, Any]) -> tuple[Any, ...]:
    return answer(await Admitter(lookup, policy).decide(request_of(document)))


async def test_the_index_decides_as_the_whole_namespace_list() -> None:
    rng = random.Random(20260133)
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        pods = namespace_pods(rng)
        policy = POLICY if case % 4 < 2 else RELAXED
        document = pod_review(rng) if case % 2 else status_review(rng, pods)
        listed = FakeLookup(CLAIMS, TEMPLATES, pods)
        expected = await decide(listed, policy, document)

        selected = FakeLookup(CLAIMS, TEMPLATES, pods)
        selected.synced = True
        async with CachedLookup(CLAIMS, TEMPLATES, pods).running() as cached:
            for lookup in (selected, cached):
                assert await decide(lookup, policy, document) == expected, (case, document, pods)
                # never the namespace's list; one pod read only where the API server has no pod of that
                # uid naming the claim (the cache is not behind here)
                assert not any(call[0] == "pods" for call in lookup.calls)
                assert [call for call in lookup.calls if call[0] == "pod"] == reads(document, pods)
        kind = f"{document['request']['resource']['resource']} {'allowed' if expected[0] else expected[1]}"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    # every kind of answer, many times: the comparison is not between two allows
    assert outcomes.keys() >= {"pods allowed", "pods 403", "resourceclaims allowed", "resourceclaims 403"}
    assert min(outcomes.values()) >= 10, outcomes


async def test_before_the_cache_is_current_the_namespace_is_listed() -> None:
    holder = o.pod("holder", o.POD2_UID, containers=[c("x", ref("gpu", "r0"))])
    lookup = CachedLookup({"gpu-claim": spec_claim("gpu-claim", o.exactly("r0"))}, pods=[holder])
    document = review(o.pod("new", o.POD1_UID, containers=[c("a", ref("gpu", "r0"))]))
    decision = await Admitter(lookup, POLICY).decide(request_of(document))  # not running
    assert "a vGPU request may be used by one pod only" in decision.message
    assert lookup.calls == [("claim", "gpu-claim"), ("cached pods", NS), ("pods", NS)]
    lookup.calls.clear()
    async with lookup.running():
        again = await Admitter(lookup, POLICY).decide(request_of(document))
    assert answer(again) == answer(decision)
    assert lookup.calls == [("claim", "gpu-claim"), ("cached pods", NS)]


GPU = spec_claim("gpu-claim", o.exactly("r0"))


@pytest.mark.parametrize("lag", ["the reserved pod is new", "its claim is named in its status since"])
async def test_a_reserved_pod_the_cache_lags_on_is_read_from_the_api_server(lag: str) -> None:
    """The reservation check holds the line whatever the cache's delay: a reserved pod it has not
    seen, or has without the claim named, is read again before the rules run."""
    holder = o.pod("a", o.POD1_UID, containers=[c("main", ref("gpu", "r0"))])
    if lag == "the reserved pod is new":
        late = o.pod("b", o.POD2_UID, containers=[c("main", ref("gpu", "r0"))])
        seen = [holder]
    else:
        late = o.pod("b", o.POD2_UID, containers=[c("main", ref("t", "r0"))], templates={"t": "gpu-claim"})
        seen = [holder, o.pod("b", o.POD2_UID, containers=[c("main", ref("t", "r0"))], templates={"t": None})]
    results = [o.result("r0")]
    old = allocated(GPU, results=results, reserved_for=o.reserved(holder))
    new = allocated(GPU, results=results, reserved_for=o.reserved(holder, late))
    document = claim_review(new, operation="UPDATE", old=old, sub_resource="status")
    expected = await decide(FakeLookup(pods=[holder, late]), POLICY, document)
    assert not expected[0] and expected[2].startswith('pod default/b: app container "main" uses request "r0"')

    lookup = CachedLookup(pods=[holder, late])
    lookup.cache = PodCache(StaticPods(seen), stream_lists=False)  # the watch has not brought `late` yet
    async with lookup.running():
        assert await decide(lookup, POLICY, document) == expected
    assert lookup.calls == [("cached pods", NS), ("pod", "b")]

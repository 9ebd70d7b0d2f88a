"""Fuzz target: the webhook's AdmissionReview path in process: `review.parse_review` on the body, then
`Admitter.decide` on what it reads (against a fake API of claims and pods), then the response document.

Contract per input: `BadReview` or a request; `decide` answers with a Decision and never reaches its
catch-all (a "vgpud webhook failed" denial is an exception inside the rules: a crash), and never a 500
(the fake API does not fail); the response encodes to JSON that echoes the request's uid. Each review
is decided twice: over the namespace's whole list, and through the pod cache's index (a real
`PodCache`, its pods trimmed as stored); both answers must be the same, with one exception (`acheck`).

The namespace's pods are fixed (holders of the claims' requests, a finished one, one whose claim comes
from a template and is named in its status, one of another namespace, one naming no claim), except
that one of them, now and then, is mutated as the reviews are (chosen from the input's hash, so an
input replays alone).

Inputs are reviews the API server would send (pods with named and template claims, vGPU claims, claim
status updates, other resources; the relaxations on, with claims that select NRI nodes), with their
JSON trees mutated (a value of another type, a key removed, a list grown, deep nesting, huge numbers)
or their bytes mutated, and random bytes.
"""

from __future__ import annotations

import copy
import json
import random
import zlib
from typing import Any

from tests import objects as o
from tests.fuzz.driver import ContractBroken, Target, kind_of, mutate, random_bytes, text
from tests.unit.webhook.builders import (
    NRI_CLASS,
    RELAXED,
    CachedLookup,
    FakeLookup,
    allocated,
    claim_review,
    finished,
    nri_request,
    review,
    spec_claim,
    template,
)
from vgpud.kube.informer import key_of
from vgpud.recorder import Recorder
from vgpud.webhook.admit import Admitter
from vgpud.webhook.claims import ApiObjectError, namespace_pod
from vgpud.webhook.review import AdmissionRequest, BadReview, Decision, encode, parse_review, review_response

POOL_SIZE = 32
#: the fuzzed webhook's policy: both relaxations on, so every rule's code runs (rules 1 and 5 only
#: for claims that do not select NRI nodes)
POLICY = RELAXED
#: edits go no deeper than this (a pod's container claim references sit at depth 7)
MAX_EDIT_DEPTH = 12
GPU = spec_claim("gpu-claim", o.exactly("r0"), uid=o.CLAIM_UID)
TEMPLATE = template("gpu-template", o.exactly("r0"))
DEEP_HEAD = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
OTHER_POD = o.pod("other", o.POD2_UID, containers=[o.container("a", o.ref("gpu"))])
#: a claim that selects NRI nodes by selector (r0) and by firstAvailable alternatives (r1)
NRI = spec_claim(
    "nri-claim",
    nri_request("r0"),
    {
        "name": "r1",
        "firstAvailable": [
            {"name": "a", "deviceClassName": NRI_CLASS},
            {
                "name": "b",
                "deviceClassName": "vgpu-manager",
                "selectors": nri_request("x")["exactly"]["selectors"],
            },
        ],
    },
    uid="6a7b8c9d-0e1f-4a2b-8c3d-4e5f6a7b8c9d",
)
#: a pod of the namespace on request r0 of the NRI claim
NRI_POD = o.pod(
    "nri-holder",
    "7b8c9d0e-1f2a-4b3c-9d4e-5f6a7b8c9d0e",
    containers=[o.container("a", o.ref("n", "r0"))],
    claims={"n": "nri-claim"},
)


#: a pod whose template's claim was generated under the name "gpu-claim" (named in its status only)
GENERATED_POD = o.pod(
    "generated",
    "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e",
    containers=[o.container("a", o.ref("t", "r0"))],
    templates={"t": "gpu-claim"},
)
#: a finished pod on the GPU claim: it holds nothing unless reserved
FINISHED_POD = finished(
    o.pod("finished", "9d0e1f2a-3b4c-4d5e-8f6a-7b8c9d0e1f2a", containers=[o.container("a", o.ref("gpu"))])
)
ELSEWHERE_POD = o.pod(
    "elsewhere",
    "0e1f2a3b-4c5d-4e6f-9a7b-8c9d0e1f2a3b",
    containers=[o.container("a", o.ref("gpu"))],
    namespace="b",
)
PLAIN_POD = o.pod("plain", "4d5e6f7a-8b9c-4d0e-8f1a-2b3c4d5e6f7a", containers=[o.container("a")], claims={})
NAMESPACE_PODS = (OTHER_POD, NRI_POD, GENERATED_POD, FINISHED_POD, ELSEWHERE_POD, PLAIN_POD)
#: the share of inputs whose namespace has one pod mutated
MUTATED_POD_SHARE = 0.25
CLAIMS = {"gpu-claim": GPU, "nri-claim": NRI}
TEMPLATES = {"gpu-template": TEMPLATE}


def lookup() -> FakeLookup:
    """The fake API with the namespace's pods as they are (the HTTPS target's)."""
    return FakeLookup(CLAIMS, TEMPLATES, namespace_pods(b""))


def namespace_pods(data: bytes) -> list[Any]:
    """The pods the fake API holds for this input, in the list's order (by key, as the cache sorts)."""
    rng = random.Random(zlib.crc32(data))
    pods: list[Any] = list(NAMESPACE_PODS)
    if rng.random() < MUTATED_POD_SHARE:
        index = rng.randrange(len(pods))
        pods[index] = mutate_tree(rng, pods[index])
    return sorted(pods, key=lambda pod: key_of(pod) if _storable(pod) else ("~", ""))


def _storable(pod: Any) -> bool:
    return isinstance(pod, dict) and isinstance(pod.get("metadata"), dict)


def _readable(pod: Any) -> bool:
    try:
        namespace_pod(pod)
    except ApiObjectError:
        return False
    return True


def answer(decision: Decision) -> tuple[Any, ...]:
    return decision.allowed, decision.code, decision.message, decision.warnings


async def decide(lookup: FakeLookup, request: AdmissionRequest) -> Decision:
    return await Admitter(lookup, POLICY, recorder=Recorder(capacity=1)).decide(request)


def seed_reviews() -> list[dict[str, Any]]:
    """One review of each kind the webhook decides on, and one it lets through unread."""
    pod = o.pod("p", o.POD1_UID, containers=[o.container("a", o.ref("gpu")), o.container("b")])
    violating = o.pod(
        "v", o.POD1_UID, containers=[o.container("a", o.ref("gpu")), o.container("b", o.ref("gpu"))]
    )
    templated = o.pod(
        "t",
        o.POD1_UID,
        containers=[o.container("a", o.ref("gpu"))],
        templates={"gpu": None},
        init=[o.container("i")],
    )
    results = [o.result("r0")]
    status_old = allocated(GPU, results=results, reserved_for=o.reserved(OTHER_POD))
    status_new = allocated(GPU, results=results, reserved_for=o.reserved(OTHER_POD, pod))
    # relaxed shapes: two claims in one container, the NRI claim's other request in another pod
    relaxed = o.pod(
        "r",
        o.POD1_UID,
        containers=[o.container("a", o.ref("gpu"), o.ref("n", "r1"))],
        claims={"gpu": "gpu-claim", "n": "nri-claim"},
    )
    nri_results = [o.result("r0"), o.result("r1/a", "vgpu-1")]
    nri_old = allocated(NRI, results=nri_results, reserved_for=o.reserved(NRI_POD))
    nri_new = allocated(NRI, results=nri_results, reserved_for=o.reserved(NRI_POD, relaxed))
    return [
        review(relaxed),
        claim_review(nri_new, operation="UPDATE", old=nri_old, sub_resource="status"),
        review(pod),
        review(violating),
        review(templated),
        claim_review(GPU),
        claim_review(GPU, operation="UPDATE", old=GPU),
        claim_review(status_new, operation="UPDATE", old=status_old, sub_resource="status"),
        review({"metadata": {"name": "d"}}, resource="deployments", group="apps", kind="Deployment"),
    ]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value, of any type, now and then large or deeply nested."""
    roll = rng.randrange(12)
    if roll == 0:
        return None
    if roll == 1:
        return rng.random() < 0.5
    if roll == 2:
        return rng.choice((0, -1, 1, 2**31, 2**63, -(2**64), 10**30))
    if roll == 3:
        return rng.choice((0.5, -1e308, 1e-300))
    if roll in (4, 5, 6):
        return rng.choice(("", "CREATE", "pods", "status", "resource.k8s.io", "gpu", "r0", text(rng)))
    if roll == 7 and depth < 4:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if roll == 8 and depth < 4:
        return {
            rng.choice(("name", "request", "spec", text(rng, 4))): _value(rng, depth + 1) for _ in range(2)
        }
    if roll == 9:
        nested: Any = []
        for _ in range(rng.randint(50, 300)):  # deepcopy and json.dumps recurse: DEEP_HEAD goes deeper
            nested = [nested]
        return nested
    return text(rng, 40)


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of a tree's nodes down to `MAX_EDIT_DEPTH` (never inside a deep nest inserted before)."""
    out = [path]
    if len(path) >= MAX_EDIT_DEPTH:
        return out
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _nodes(value, (*path, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += _nodes(value, (*path, index))
    return out


def mutate_tree(rng: random.Random, doc: Any) -> Any:
    """1-3 edits at random places of a JSON tree: a new value, a removal, a duplicate."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_nodes(doc))
        if not path:
            if rng.random() < 0.1:
                return _value(rng)
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        op = rng.randrange(4)
        if op == 0 and isinstance(parent, dict):
            del parent[last]
        elif op == 1 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        elif op == 2 and isinstance(parent, dict):
            parent[text(rng, 6) or "x"] = _value(rng)
        else:
            parent[last] = _value(rng)
    return doc


def target(seed: int) -> Target:
    rng = random.Random(seed)
    seeds = seed_reviews()
    pool = tuple(json.dumps(mutate_tree(rng, rng.choice(seeds))).encode() for _ in range(POOL_SIZE))
    valid = tuple(json.dumps(doc).encode() for doc in seeds)

    def generate(rng: random.Random) -> bytes:
        roll = rng.random()
        if roll < 0.1:
            return rng.choice(valid)
        if roll < 0.75:
            return json.dumps(mutate_tree(rng, rng.choice(seeds))).encode()
        if roll < 0.94:
            return mutate(rng, rng.choice(valid + pool), pool=pool)
        if roll < 0.95:  # nesting deeper than the parser recurses
            depth = rng.choice((900, 5000, 100_000))
            return DEEP_HEAD + rng.choice((b"[", b'{"a":')) * depth + b"}"
        return random_bytes(rng, 128)

    async def acheck(data: bytes) -> str:
        try:
            request = parse_review(data)
        except BadReview as err:
            return kind_of(err, err.reason)
        pods = namespace_pods(data)
        decision = await decide(FakeLookup(CLAIMS, TEMPLATES, pods), request)
        async with CachedLookup(CLAIMS, TEMPLATES, pods).running() as cached:
            indexed = await decide(cached, request)
        for made in (decision, indexed):
            if made.message.startswith("vgpud webhook failed") or made.code == 500:
                raise ContractBroken(f"decide failed inside: {made.message}")
        response = json.loads(encode(review_response(request.uid, decision)))
        if response["response"]["uid"] != request.uid or response["response"]["allowed"] != decision.allowed:
            raise ContractBroken(f"the response does not echo the request: {response}")
        outcome = f"{request.resource_path} {request.operation}: {decision.code}"
        if answer(indexed) == answer(decision):
            return outcome
        return outcome + await _unrelated_malformed_pod(request, pods, decision, indexed, cached)

    return Target("webhook", generate, acheck=acheck)


async def _unrelated_malformed_pod(
    request: AdmissionRequest, pods: list[Any], listed: Decision, indexed: Decision, cached: CachedLookup
) -> str:
    """The one accepted difference between the two answers: the list holds a malformed pod that the
    index does not choose (it names none of the claims under review and none reserves it), which the
    list's answer rejects (code 400, the rules cannot read what the API server returned) and the
    index's never reads. The API server validates every pod it stores, so it cannot hold such a pod:
    the list's 400 guards against a broken answer, not a pod that exists. Anything else is a broken
    contract; so is an answer that differs from the list's once the unchosen malformed pods are gone
    from it (the index must choose every pod that can change the answer)."""
    if listed.code != 400 or "cannot read what the API server returned" not in listed.message:
        raise ContractBroken(
            f"the index decides otherwise than the list: {answer(indexed)} != {answer(listed)}"
        )
    chosen = {key_of(pod) for pod in cached.returned}
    chosen |= {(request.namespace, name) for call, name in cached.calls if call == "pod"}
    kept = [pod for pod in pods if _readable(pod) or (_storable(pod) and key_of(pod) in chosen)]
    if len(kept) == len(pods):
        raise ContractBroken(
            f"the index decides otherwise than the list with no pod left unread: {answer(indexed)}"
        )
    cleaned = await decide(FakeLookup(CLAIMS, TEMPLATES, kept), request)
    if answer(cleaned) != answer(indexed):
        raise ContractBroken(
            f"without the malformed pods it did not read, the list decides otherwise than the index: "
            f"{answer(cleaned)} != {answer(indexed)}"
        )
    return " (a malformed pod the index leaves out)"

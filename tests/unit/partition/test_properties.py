"""Properties over random claims and pods: eager partitions are a partition of the consumers and
their requests, independent of input order; lazy directories are unique per (claim, pod, container)."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests import objects as o
from vgpud.partition.eager import PartitionInfo, resolve_partitions
from vgpud.partition.layout import Layout
from vgpud.partition.model import ClaimView, PodView, claim_consumers

REQUESTS = ["r0", "r1", "r2", "r3"]
SUBS = ["big", "small"]
FOREIGN = ["n0", "n1"]
NAMES = ["a", "b", "c", "d", "e", "f"]
PROPERTY = settings(max_examples=150, deadline=None)


@st.composite
def containers(draw: st.DrawFn, name: str, pod_claims: list[str], *, init: bool) -> dict[str, Any]:
    """A container with up to three claim references (with or without a request)."""
    requests = st.sampled_from([None, None, *REQUESTS, *FOREIGN])
    refs = draw(st.lists(st.tuples(st.sampled_from(pod_claims), requests), max_size=3))
    sidecar = init and draw(st.booleans())
    return o.container(name, *(o.ref(c, r) for c, r in refs), restart="Always" if sidecar else None)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A claim with vGPU (some firstAvailable) and foreign requests, and 1-3 pods that reference it."""
    ours = draw(st.lists(st.sampled_from(REQUESTS), unique=True, max_size=4))
    first_available = draw(st.sets(st.sampled_from(ours))) if ours else set()
    requests = [o.first_available(r, *SUBS) if r in first_available else o.exactly(r) for r in ours]
    requests += [o.exactly(n, "dranet") for n in FOREIGN]
    results = []
    for r in ours:
        for device in draw(st.lists(st.integers(0, 3), min_size=1, max_size=2)):
            name = f"{r}/{draw(st.sampled_from(SUBS))}" if r in first_available else r
            results.append(o.result(name, f"vgpu-{device}"))
    results += [o.result(n, "eth0", driver=o.OTHER_DRIVER) for n in draw(st.sets(st.sampled_from(FOREIGN)))]

    pods = []
    for index, uid in enumerate(draw(st.lists(st.uuids(), min_size=1, max_size=3, unique=True))):
        templated = draw(st.sampled_from(["direct", "direct", "generated", "pending"]))
        claims = {} if templated != "direct" else {"gpu": "gpu-claim"}
        templates = (
            {} if templated == "direct" else {"gpu": "gpu-claim" if templated == "generated" else None}
        )
        if draw(st.booleans()):
            claims["other"] = "other-claim"
        pod_claims = ["gpu", "gpu", *claims, *templates]  # mostly this claim
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
        split = draw(st.integers(0, len(names) - 1))

        pods.append(
            o.pod(
                f"pod-{index}",
                str(uid),
                claims=claims,
                templates=templates,
                init=[draw(containers(n, pod_claims, init=True)) for n in names[:split]],
                containers=[draw(containers(n, pod_claims, init=False)) for n in names[split:]],
            )
        )
    reserved = [p for p in pods if draw(st.integers(0, 3))]  # three in four pods are reserved
    return o.claim(requests=requests, results=results, reserved_for=o.reserved(*reserved)), pods


def _parse(claim: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[ClaimView, list[PodView]]:
    return ClaimView.from_dict(claim, o.DRIVER), [PodView.from_dict(p) for p in pods]


def _canonical(info: PartitionInfo) -> tuple[Any, ...]:
    return (
        {
            k: (frozenset(c.node for c in p.containers), p.requests, p.fallback)
            for k, p in info.partitions.items()
        },
        dict(info.request_to_partition),
        {k: tuple(c.node for c in v) for k, v in info.candidates_by_key.items()},
    )


def _shuffled(
    claim: dict[str, Any], pods: list[dict[str, Any]], rnd: random.Random
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The same objects with every list whose order carries no meaning permuted."""
    claim, pods = copy.deepcopy(claim), copy.deepcopy(pods)
    rnd.shuffle(claim["spec"]["devices"]["requests"])
    rnd.shuffle(claim["status"]["allocation"]["devices"]["results"])
    rnd.shuffle(claim["status"]["reservedFor"])
    rnd.shuffle(pods)
    for pod in pods:
        rnd.shuffle(pod["spec"]["resourceClaims"])
        for key in ("initContainers", "containers"):
            rnd.shuffle(pod["spec"].get(key, []))
            for container in pod["spec"].get(key, []):
                rnd.shuffle(container.get("resources", {}).get("claims", []))
    return claim, pods


@PROPERTY
@given(scenarios())
def test_every_consumer_is_in_exactly_one_partition_and_partitions_are_disjoint(
    scenario: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    claim, pods = _parse(*scenario)
    info = resolve_partitions(claim, pods)
    consumers = claim_consumers(claim, pods)
    layout = Layout()

    for container, requests in consumers.items():
        (home,) = [p for p in info.partitions.values() if container in p.containers]
        assert set(requests) <= set(home.requests)
        assert container in info.candidates_by_key[home.key]

    seen_containers: set[Any] = set()
    seen_requests: set[str] = set()
    for key, partition in info.partitions.items():
        assert not seen_containers & set(partition.containers)
        assert not seen_requests & set(partition.requests)
        seen_containers |= set(partition.containers)
        seen_requests |= set(partition.requests)
        assert set(partition.containers) <= set(consumers)
        assert partition.fallback is (not partition.containers)
        layout.partition(claim.uid, key)  # every key is a safe relative path
    assert seen_requests == set(claim.requests)
    assert seen_containers == set(consumers)


@PROPERTY
@given(scenarios(), st.randoms(use_true_random=False))
def test_keys_do_not_depend_on_the_order_of_pods_containers_or_requests(
    scenario: tuple[dict[str, Any], list[dict[str, Any]]], rnd: random.Random
) -> None:
    reference = _canonical(resolve_partitions(*_parse(*scenario)))
    assert _canonical(resolve_partitions(*_parse(*_shuffled(*scenario, rnd)))) == reference


_POD_UIDS = st.one_of(st.uuids().map(str), st.from_regex(r"\A[A-Za-z0-9_-]{1,12}\Z"))
_CONTAINERS = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")
_CLAIM_UIDS = st.uuids().map(str)


@PROPERTY
@given(st.lists(st.tuples(_CLAIM_UIDS | st.just(o.CLAIM_UID), _POD_UIDS, _CONTAINERS), max_size=30))
def test_lazy_directories_are_unique_per_claim_pod_container(triples: list[tuple[str, str, str]]) -> None:
    layout = Layout()
    bases = {}
    for claim_uid, pod_uid, container in triples:
        base = layout.container_partition(claim_uid, pod_uid, container).base
        assert base.parent == layout.claim_dir(claim_uid)
        bases[(claim_uid, pod_uid, container)] = base
    assert len(set(bases.values())) == len(bases)

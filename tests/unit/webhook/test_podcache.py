"""The webhook's pod cache (vgpud.webhook.podcache): what a stored pod keeps (everything the rules
read, as it came), the claim index through adds, changes and deletions, the pure choice of a review's
pods, when the cache is read, and its health as a supervised component."""

from __future__ import annotations

import copy
import json
import operator
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import reduce
from typing import Any

import pytest
import trio
import trio.testing

from tests import objects as o
from tests.fuzz.target_webhook import mutate_tree
from tests.unit.webhook.builders import run_informer
from vgpud.componenthealth import HealthState
from vgpud.kube.api import JsonObject, KubeError, Listing, WatchEvent, WatchEventType
from vgpud.supervisor import Backoff, HealthAfter, Restart, Supervisor
from vgpud.webhook.admit import _containers
from vgpud.webhook.claims import ApiObjectError, namespace_pod
from vgpud.webhook.podcache import PodCache, PodsByClaim
from vgpud.webhook.podselect import pod_claim_names, reservations, select_pods, trim_pod

c, ref = o.container, o.ref
NS, OTHER_NS = o.NAMESPACE, "team-b"


def uid(k: int) -> str:
    return f"00000000-0000-4000-8000-{k:012d}"


def full_pod(name: str, k: int, **kwargs: Any) -> JsonObject:
    """A pod as the API server returns it: labels, annotations, managed fields, images, env, volumes,
    conditions; a sidecar, and a template claim generated as "gen-claim"."""
    pod = o.pod(
        name,
        uid(k),
        containers=[c("main", ref("gpu", "r0")), c("log")],
        init=[c("setup", ref("gpu")), c("proxy", restart="Always")],
        claims={"gpu": "gpu-claim"},
        **kwargs,
    )
    pod["spec"]["resourceClaims"].append({"name": "t", "resourceClaimTemplateName": "t-template"})
    pod["status"]["resourceClaimStatuses"] = [{"name": "t", "resourceClaimName": "gen-claim"}]
    pod["metadata"] |= {
        "resourceVersion": "812",
        "labels": {"app": "trainer", "pod-template-hash": "7d9f"},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": uid(99)}],
        "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {"f:x": {}}}}] * 4,
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        container["env"] = [{"name": f"VAR{i}", "value": "v" * 40} for i in range(10)]
        container.setdefault("resources", {})["limits"] = {"cpu": "2", "memory": "4Gi"}
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["spec"] |= {
        "nodeName": "node-a",
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}] * 3,
        "serviceAccountName": "default",
    }
    pod["status"] |= {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}] * 4,
        "podIP": "10.0.0.7",
        "containerStatuses": [{"name": "main", "ready": True, "imageID": "sha256:" + "0" * 64}],
    }
    return pod


def test_a_stored_pod_keeps_what_the_rules_read_and_nothing_else() -> None:
    pod = full_pod("p", 1)
    trimmed = trim_pod(pod)
    assert trimmed == {
        "metadata": {"name": "p", "namespace": NS, "uid": uid(1), "resourceVersion": "812"},
        "spec": {
            "resourceClaims": pod["spec"]["resourceClaims"],
            "nodeName": "node-a",
            "initContainers": [
                {"name": "setup", "resources": {"claims": [{"name": "gpu"}]}},
                {"name": "proxy", "restartPolicy": "Always"},  # `resources` without claims: none
            ],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu", "request": "r0"}]}},
                {"name": "log"},
            ],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "t", "resourceClaimName": "gen-claim"}],
        },
    }
    assert namespace_pod(trimmed) == namespace_pod(pod)
    assert _containers(trimmed) == _containers(pod)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("metadata",), ["not", "an", "object"]),
        (("metadata", "uid"), 5),
        (("spec",), "spec"),
        (("spec", "containers"), {"name": "a"}),
        (("spec", "containers", 0), "a"),
        (("spec", "containers", 0, "name"), 7),
        (("spec", "containers", 0, "resources"), ["claims"]),
        (("spec", "containers", 0, "resources", "claims"), "gpu"),
        (("spec", "initContainers", 1, "restartPolicy"), True),
        (("spec", "resourceClaims", 0, "resourceClaimName"), 3),
        (("status",), []),
        (("status", "phase"), 1),
        (("status", "resourceClaimStatuses"), {"t": "gen-claim"}),
    ],
)
def test_an_ill_typed_field_is_kept_as_it_came_so_the_rules_reject_it_alike(
    path: tuple[Any, ...], value: Any
) -> None:
    pod = full_pod("p", 1)
    parent = pod
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    trimmed = trim_pod(pod)
    kept = trimmed
    for step in path:
        kept = kept[step]
    assert kept == value
    with pytest.raises(ApiObjectError) as from_list:
        namespace_pod(pod)
    with pytest.raises(ApiObjectError) as from_cache:
        namespace_pod(trimmed)
    assert str(from_cache.value) == str(from_list.value)


def test_strings_that_repeat_across_pods_are_kept_once() -> None:
    strings: dict[str, str] = {}
    one, two = (trim_pod(json.loads(json.dumps(full_pod(n, k))), strings) for k, n in ((1, "p"), (2, "q")))
    for path in (
        ("metadata", "namespace"),
        ("spec", "nodeName"),
        ("spec", "containers", 0, "name"),
        ("spec", "containers", 0, "resources", "claims", 0, "request"),
        ("spec", "initContainers", 1, "restartPolicy"),
        ("spec", "resourceClaims", 1, "resourceClaimTemplateName"),
        ("status", "phase"),
        ("status", "resourceClaimStatuses", 0, "name"),
    ):
        assert reduce(operator.getitem, path, one) is reduce(operator.getitem, path, two), path
    assert one["metadata"]["uid"] != two["metadata"]["uid"]
    assert "p" not in strings and uid(1) not in strings  # a pod's own name and uid are its own


def test_a_missing_field_stays_missing() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "x"}]}}
    assert trim_pod(pod) == {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}
    assert trim_pod({}) == {}


def outcome(pod: Any) -> Any:
    try:
        return namespace_pod(pod), _containers(pod)
    except ApiObjectError as err:
        return str(err)


def test_the_rules_read_a_trimmed_pod_as_the_pod_itself_whatever_is_broken_in_it() -> None:
    rng = random.Random(33)
    seeds = [full_pod("p", 1), o.pod("q", uid(2), containers=[c("a", ref("gpu"))], templates={"t": None})]
    compared = broken = 0
    for _ in range(3000):
        pod = mutate_tree(rng, rng.choice(seeds))
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            continue  # the cache cannot key it (nor does the API server send it)
        compared += 1
        expected = outcome(pod)
        broken += isinstance(expected, str)
        assert outcome(trim_pod(pod)) == expected, pod
    assert compared > 2000 and 100 < broken < compared - 100  # both kinds, many of each


def test_a_pod_names_its_claims_by_spec_and_by_status() -> None:
    pod = full_pod("p", 1)
    assert pod_claim_names(pod) == {"gpu-claim", "gen-claim"}
    assert pod_claim_names(trim_pod(pod)) == {"gpu-claim", "gen-claim"}
    pod["status"]["resourceClaimStatuses"] = [{"name": "t"}, {"name": "u", "resourceClaimName": 4}, "x"]
    pod["spec"]["resourceClaims"].append({"name": "n", "resourceClaimName": ""})
    assert pod_claim_names(pod) == {"gpu-claim"}
    assert pod_claim_names({"spec": "broken"}) == frozenset()
    assert pod_claim_names(None) == frozenset()


def test_a_claims_reservations_by_uid() -> None:
    a, b = o.pod("a", uid(1), containers=[]), o.pod("b", uid(2), containers=[])
    claim = o.claim(requests=[], results=[], reserved_for=[*o.reserved(a, b), {"name": "x", "uid": 3}, "y"])
    assert reservations(claim) == {uid(1): "a", uid(2): "b"}
    assert reservations(None) == {} and reservations({"status": {"reservedFor": {}}}) == {}


# -- the index --------------------------------------------------------------------------------------


def named(name: str, k: int, *claims: str, namespace: str = NS, phase: str = "Running") -> JsonObject:
    pod = o.pod(
        name,
        uid(k),
        containers=[c("a", *(ref(f"c{i}") for i in range(len(claims))))],
        claims={f"c{i}": claim for i, claim in enumerate(claims)},
        namespace=namespace,
    )
    pod["status"]["phase"] = phase
    return trim_pod(pod)


def templated(name: str, k: int, generated: str | None) -> JsonObject:
    """A pod whose claim comes from a template: named in its status once generated."""
    return trim_pod(o.pod(name, uid(k), containers=[c("a", ref("t"))], templates={"t": generated}))


def test_the_index_follows_adds_changes_and_deletions() -> None:
    index = PodsByClaim()
    a, b = named("a", 1, "x", "y"), named("b", 2, "x")
    index.update(None, a)
    index.update(None, b)
    assert index.keys(NS, "x") == {(NS, "a"), (NS, "b")} and index.keys(NS, "y") == {(NS, "a")}
    index.update(a, named("a", 1, "y", "z"))  # a claim name dropped, another added
    assert index.keys(NS, "x") == {(NS, "b")} and index.keys(NS, "z") == {(NS, "a")}
    index.update(b, None)
    assert index.keys(NS, "x") == frozenset() and len(index) == 2  # (NS, y), (NS, z): no empty entry
    t = templated("t", 3, None)
    index.update(None, t)
    assert len(index) == 2  # no claim generated yet: named nowhere
    index.update(t, templated("t", 3, "gen"))  # status.resourceClaimStatuses appears later
    assert index.keys(NS, "gen") == {(NS, "t")}
    index.update(None, named("a", 4, "y", namespace=OTHER_NS))
    assert index.keys(NS, "y") == {(NS, "a")} and index.keys(OTHER_NS, "y") == {(OTHER_NS, "a")}


class Scripted:
    """A PodSource: `pods` listed; the watch sends what the test sends on `events`; `failing` makes
    the list and the watch raise it."""

    def __init__(self, pods: list[JsonObject]) -> None:
        self.pods = pods
        self.send, self._receive = trio.open_memory_channel[WatchEvent](10)
        self.failing: KubeError | None = None
        self.listed = trio.Event()
        self.calls = 0

    async def list_all_pods(self) -> Listing:
        self.calls += 1
        if self.failing is not None:
            raise self.failing
        await self.listed.wait()
        return Listing([{"apiVersion": "v1", "kind": "Pod", **pod} for pod in self.pods], "1")

    @asynccontextmanager
    async def watch_all_pods(self, resource_version: str) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        self.calls += 1
        if self.failing is not None:
            raise self.failing
        yield self._receive


def event(kind: WatchEventType, pod: JsonObject) -> WatchEvent:
    return WatchEvent(kind, copy.deepcopy(pod))


async def test_the_cache_stores_trimmed_pods_and_indexes_them_as_they_change() -> None:
    first = full_pod("a", 1)
    source = Scripted([first, named("b", 2, "gpu-claim", namespace=OTHER_NS)])
    source.listed.set()
    cache = PodCache(source, stream_lists=False)
    async with trio.open_nursery() as nursery:
        assert cache.read(NS, ["gpu-claim"], []) is None  # not listed yet: the caller lists
        await nursery.start(run_informer, cache)
        assert cache.current and len(cache) == 2
        assert cache.informer.get(NS, "a") == trim_pod(first)
        assert cache.read(NS, ["gpu-claim"], []) == [trim_pod(first)]
        assert cache.pods_for(NS, ["gen-claim"], []) == [trim_pod(first)]

        # added, in name order; then a status change names a generated claim
        await source.send.send(
            event(WatchEventType.ADDED, o.pod("0", uid(3), containers=[c("x", ref("gpu"))]))
        )
        await source.send.send(
            event(WatchEventType.ADDED, o.pod("t", uid(4), containers=[], templates={"t": None}))
        )
        await trio.testing.wait_all_tasks_blocked()
        assert [p["metadata"]["name"] for p in cache.pods_for(NS, ["gpu-claim"], [])] == ["0", "a"]
        assert cache.pods_for(NS, ["t-gen"], []) == []
        generated = o.pod("t", uid(4), containers=[], templates={"t": "t-gen"})
        await source.send.send(event(WatchEventType.MODIFIED, generated))
        await trio.testing.wait_all_tasks_blocked()
        assert cache.pods_for(NS, ["t-gen"], []) == [trim_pod(generated)]

        # deleted and created again under the same name: a new uid, other claims
        await source.send.send(event(WatchEventType.DELETED, first))
        await trio.testing.wait_all_tasks_blocked()
        assert cache.pods_for(NS, ["gpu-claim", "gen-claim"], [uid(1)]) == [
            trim_pod(o.pod("0", uid(3), containers=[c("x", ref("gpu"))]))
        ]
        again = named("a", 5, "other-claim")
        await source.send.send(event(WatchEventType.ADDED, again))
        await trio.testing.wait_all_tasks_blocked()
        assert cache.pods_for(NS, ["other-claim"], []) == [again]
        assert cache.informer.by_uid(uid(1)) is None and cache.pods_for(NS, [], [uid(5)]) == [again]
        assert cache.index.keys(NS, "gen-claim") == frozenset()

        # a bookmark passes through untouched; an object without metadata is dropped
        bookmark = {"kind": "Pod", "metadata": {"resourceVersion": "9", "annotations": {"a": "b"}}}
        await source.send.send(WatchEvent(WatchEventType.BOOKMARK, bookmark))
        await source.send.send(WatchEvent(WatchEventType.ADDED, {"metadata": "broken"}))
        await trio.testing.wait_all_tasks_blocked()
        assert cache.informer.bookmarks == 1 and len(cache) == 4
        nursery.cancel_scope.cancel()
    assert not cache.current and cache.read(NS, ["other-claim"], []) is None  # no watch: not read


def test_a_reviews_pods_are_those_of_its_namespace_naming_its_claims_or_reserved() -> None:
    pods = [
        named("d", 1, "gpu"),
        named("c", 2, "nic"),  # names another claim only
        named("b", 3, "gpu", phase="Succeeded"),  # finished: the rules decide whether it holds
        named("a", 4, "nic"),  # reserved
        named("e", 5, "gpu", namespace=OTHER_NS),
        named("f", 6, "nic", namespace=OTHER_NS),  # reserved, but elsewhere
        templated("g", 7, "gpu"),  # named in its status only
        named("h", 8, "gpu", "nic"),  # both: once
    ]
    chosen = select_pods(pods, NS, {"gpu"}, {uid(4), uid(6), uid(8)})
    assert [p["metadata"]["name"] for p in chosen] == ["d", "b", "a", "g", "h"]
    assert select_pods([*pods, "not a pod", {"metadata": []}], NS, set(), set()) == []


async def test_the_cache_chooses_as_select_pods_does_in_the_lists_order() -> None:
    rng = random.Random(7)
    claims = ["gpu", "nic", "x", "y"]
    pods = [
        named(
            f"p{rng.randrange(1000):03d}-{k}",
            k,
            *rng.sample(claims, rng.randrange(3)),
            namespace=rng.choice((NS, OTHER_NS)),
        )
        for k in range(300)
    ]
    source = Scripted(pods)
    source.listed.set()
    cache = PodCache(source, stream_lists=False)
    listed = sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    async with trio.open_nursery() as nursery:
        await nursery.start(run_informer, cache)
        for _ in range(200):
            names = set(rng.sample(claims, rng.randrange(3)))
            uids = {uid(rng.randrange(300)) for _ in range(rng.randrange(4))}
            namespace = rng.choice((NS, OTHER_NS))
            assert cache.read(namespace, names, uids) == select_pods(listed, namespace, names, uids)
        nursery.cancel_scope.cancel()


# -- as a supervised component ----------------------------------------------------------------------


async def test_healthy_while_it_first_lists_and_failing_only_when_it_keeps_failing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Scripted([named("a", 1, "gpu")])
    cache = PodCache(source, stream_lists=False)
    async with Supervisor() as supervisor:
        supervisor.supervise("webhook-pod-cache", cache.run, Restart(Backoff(jitter=0.5)), HealthAfter(60))
        await trio.sleep(5)  # still listing: reviews list their namespace, the webhook is healthy
        assert not cache.current and supervisor.health.all_healthy()
        source.failing = KubeError("connection refused")
        source.listed.set()
        await trio.sleep(30)  # failing, within the grace period
        assert source.calls > 3 and supervisor.health.all_healthy()
        await trio.sleep(60)
        assert supervisor.health.get("webhook-pod-cache").state is HealthState.FAILING
        assert not supervisor.health.all_healthy()
        source.failing = None  # the API server answers again: healthy once listed and watching
        await trio.sleep(60)
        assert cache.current and supervisor.health.all_healthy()
        supervisor.cancel()

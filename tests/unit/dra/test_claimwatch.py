"""The node's claim cache (vgpud.dra.claimwatch, vgpud.dra.claimlabel): it holds the claims this node
prepared and no other, and a prepared claim it lacks (an older vgpud's, unlabelled; deleted; its label
removed) is read once and labelled, or stays cleared. Real files in a temp dir, the in-memory API."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import trio
import trio.testing

from tests import objects as o
from tests.draharness import NODE, REF, Harness, single_container_claim
from tests.unit.registry.world import run_cache
from vgpud.dra.claimlabel import node_claim_labels, node_label_key, node_label_value
from vgpud.dra.claimwatch import ClaimWatch
from vgpud.kube.api import KubeError
from vgpud.kube.informer import claim_informer

LABELS = node_claim_labels(o.DRIVER, NODE)
KEY = node_label_key(o.DRIVER)


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path, lazy=True)


async def prepare(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    assert (await h.driver.prepare([REF]))[o.CLAIM_UID].error == ""


def node_watch(h: Harness) -> ClaimWatch:
    return ClaimWatch(claim_informer(h.kube, labels=LABELS), h.driver.index, h.kube, LABELS)


def claims_elsewhere(h: Harness, count: int) -> None:
    """Claims allocated on other nodes, in other namespaces: none carries this node's label."""
    for k in range(count):
        claim, _ = single_container_claim()
        claim["metadata"] |= {
            "name": f"elsewhere-{k}",
            "namespace": f"ns-{k % 7}",
            "uid": f"uid-elsewhere-{k}",
        }
        claim["metadata"]["labels"] = node_claim_labels(o.DRIVER, f"node-{k}")
        h.kube.add_claim(claim)


def stored_claim(h: Harness) -> dict:
    return copy.deepcopy(h.kube._claims[(REF.namespace, REF.name)])


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize(
    "node_name",
    ["node-1", "a" * 63, "a" * 64, "gpu-7.rack-3.example.internal." + "x" * 100, "", "-dash", "dot."],
)
def test_the_label_value_is_a_valid_label_for_any_node_name(node_name: str) -> None:
    value = node_label_value(node_name)
    assert len(value) <= 63
    assert value == "" or (value[0].isalnum() and value[-1].isalnum())
    assert set(value) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    if node_name and len(node_name) <= 63 and node_name[0].isalnum() and node_name[-1].isalnum():
        assert value == node_name
    else:
        assert value.startswith("sha256-") and node_label_value(node_name + "x") != value


async def test_prepare_labels_the_claim_and_the_cache_holds_only_this_nodes_claims(h: Harness) -> None:
    claims_elsewhere(h, 50)
    await prepare(h)
    assert LABELS.items() <= stored_claim(h)["metadata"]["labels"].items()
    watch = node_watch(h)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        assert [key for key in [(REF.namespace, REF.name)] if watch._claims.get(*key)] == [
            (REF.namespace, REF.name)
        ]
        assert len(watch._claims) == 1
        claims_elsewhere(h, 10)  # more claims elsewhere: not one reaches this node
        await settle()
        assert len(watch._claims) == 1 and watch.reads == 0
        nursery.cancel_scope.cancel()


async def test_a_claim_an_older_vgpud_prepared_is_read_once_and_labelled(tmp_path: Path) -> None:
    old = Harness(tmp_path, lazy=True)
    old.claim_labels = {}  # the vgpud before the label
    old.driver = old.new_driver()
    await prepare(old)
    assert KEY not in (stored_claim(old)["metadata"].get("labels") or {})
    watch = node_watch(old)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        await settle()
        assert (watch.reads, watch.labelled) == (1, 1)
        assert stored_claim(old)["metadata"]["labels"] == LABELS
        assert len(watch._claims) == 1 and watch.missing == frozenset()
        assert old.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        nursery.cancel_scope.cancel()


async def test_a_deleted_claim_is_read_once_and_admits_no_pod(h: Harness) -> None:
    await prepare(h)
    watch = node_watch(h)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        assert h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        h.kube.remove_claim(REF.namespace, REF.name)
        await settle()
        assert (watch.reads, watch.labelled) == (1, 0)
        assert not h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        nursery.cancel_scope.cancel()


async def test_a_claim_whose_label_was_removed_is_labelled_again(h: Harness) -> None:
    await prepare(h)
    watch = node_watch(h)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        claim = stored_claim(h)
        del claim["metadata"]["labels"][KEY]
        h.kube.add_claim(claim)
        await settle()
        assert (watch.reads, watch.labelled) == (1, 1)
        assert LABELS.items() <= stored_claim(h)["metadata"]["labels"].items()
        assert len(watch._claims) == 1
        assert h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        nursery.cancel_scope.cancel()


async def test_a_claim_labelled_for_another_node_is_left_to_it(h: Harness) -> None:
    await prepare(h)
    watch = node_watch(h)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        claim = stored_claim(h)
        claim["metadata"]["labels"][KEY] = "another-node"
        h.kube.add_claim(claim)
        await settle()
        assert (watch.reads, watch.labelled) == (1, 0)
        assert stored_claim(h)["metadata"]["labels"][KEY] == "another-node"
        assert len(watch._claims) == 0
        # its reservations are the claim's as read: the pod it is reserved for still counts
        assert h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        nursery.cancel_scope.cancel()


async def test_a_failed_read_fails_the_component_and_the_restart_reads_again(h: Harness) -> None:
    await prepare(h)
    claim = stored_claim(h)
    del claim["metadata"]["labels"][KEY]
    h.kube.add_claim(claim)
    watch = node_watch(h)
    h.kube.fail_next("get_resource_claim", KubeError("the API server is down", 503))
    with pytest.raises(KubeError, match="down"):  # as it was raised: the supervisor logs it
        await watch.run(lambda: None)
    assert watch.missing == {o.CLAIM_UID}
    assert not h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        await settle()
        assert (watch.reads, watch.labelled) == (2, 1) and watch.missing == frozenset()
        assert h.driver.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
        nursery.cancel_scope.cancel()


async def test_a_labelled_claim_this_node_did_not_prepare_is_never_read(h: Harness) -> None:
    claim, _ = single_container_claim()
    claim["metadata"]["labels"] = dict(LABELS)
    h.kube.add_claim(claim)
    watch = node_watch(h)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        h.kube.remove_claim(REF.namespace, REF.name)
        await settle()
        assert watch.reads == 0 and h.kube.calls["get_resource_claim"] == 0
        nursery.cancel_scope.cancel()

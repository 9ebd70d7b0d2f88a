"""What FakeKube offers tests beyond the contract: hooks, failure injection, copies, call counts."""

from __future__ import annotations

import pytest
import trio

from tests.unit.kube.conftest import Names
from tests.unit.kube.test_kube_contract import MANAGER, claim_body, slice_body
from vgpud.kube.api import KubeError, NotFound, WatchEventType
from vgpud.kube.fake import FakeKube


@pytest.fixture
def fake() -> FakeKube:
    return FakeKube()


@pytest.fixture
def names() -> Names:
    return Names(namespace="ns", node_name="node-a", driver="d.vgpu.test", tag="t")


async def test_copies_in_and_out(fake: FakeKube, names: Names) -> None:
    body = claim_body(names, "claim")
    stored = fake.add_claim(body)
    body["metadata"]["annotations"]["keep"] = "changed by caller"
    stored["metadata"]["name"] = "mutated"
    got = await fake.get_resource_claim("ns", "claim")
    got["spec"]["devices"] = {}
    again = await fake.get_resource_claim("ns", "claim")
    assert again["metadata"]["annotations"] == {"keep": "me"}
    assert again["spec"]["devices"]["requests"]


async def test_server_fields_and_given_uid(fake: FakeKube, names: Names) -> None:
    body = claim_body(names, "claim")
    body["metadata"]["uid"] = "fixed-uid"
    stored = fake.add_claim(body)
    assert stored["metadata"]["uid"] == "fixed-uid"
    node = fake.add_node({"metadata": {"name": "node-a"}})
    assert node["metadata"]["uid"] and "namespace" not in node["metadata"]
    assert int(node["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])


async def test_fail_next_is_queued_per_method(fake: FakeKube) -> None:
    fake.add_node({"metadata": {"name": "n"}})
    fake.fail_next("get_node", KubeError("boom", 500))
    fake.fail_next("get_node", NotFound("gone", 404))
    with pytest.raises(KubeError) as first:
        await fake.get_node("n")
    assert first.value.status == 500
    with pytest.raises(NotFound):
        await fake.get_node("n")
    assert (await fake.get_node("n"))["metadata"]["name"] == "n"
    assert fake.calls["get_node"] == 3


async def test_apply_generation_and_noop(fake: FakeKube, names: Names) -> None:
    first = await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
    same = await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
    assert same == first  # no change: same resourceVersion, generation
    changed = await fake.apply_resource_slice(slice_body(names, cores=10), field_manager=MANAGER)
    assert changed["metadata"]["generation"] == first["metadata"]["generation"] + 1


async def test_noop_apply_is_not_an_event(fake: FakeKube, names: Names) -> None:
    await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
    async with fake.watch_resource_slices(driver=names.driver, node_name=names.node_name) as events:
        await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
        await fake.delete_resource_slice(slice_body(names)["metadata"]["name"])
        assert (await anext(events)).type == WatchEventType.DELETED


async def test_end_watches(fake: FakeKube, names: Names) -> None:
    async with fake.watch_resource_slices(driver=names.driver, node_name=names.node_name) as events:
        await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
        fake.end_watches(KubeError("too old resource version", 410))
        assert (await anext(events)).type == WatchEventType.ADDED  # what was sent before still arrives
        with pytest.raises(KubeError) as e:
            await anext(events)
        assert e.value.status == 410
    async with fake.watch_resource_slices(driver=names.driver, node_name=names.node_name) as events:
        fake.end_watches()
        assert [e async for e in events] == []


async def test_slice_leaving_the_selector_is_deleted_for_the_watcher(fake: FakeKube, names: Names) -> None:
    async with fake.watch_resource_slices(driver=names.driver, node_name=names.node_name) as events:
        await fake.apply_resource_slice(slice_body(names), field_manager=MANAGER)
        moved = slice_body(names)
        moved["spec"]["nodeName"] = "node-b"
        await fake.apply_resource_slice(moved, field_manager=MANAGER)
        with trio.fail_after(1):
            assert [(await anext(events)).type for _ in range(2)] == [
                WatchEventType.ADDED,
                WatchEventType.DELETED,
            ]


async def test_watch_failure_injection(fake: FakeKube, names: Names) -> None:
    fake.fail_next("watch_resource_slices", KubeError("unavailable", 503))
    with pytest.raises(KubeError):
        async with fake.watch_resource_slices(driver=names.driver, node_name=names.node_name):
            pass
    assert fake.calls["watch_resource_slices"] == 1

"""The KubeApi contract, run against FakeKube and against KubeClient on a real kube-apiserver.

Whatever the fake lets a unit test rely on, the real server must do too: these tests are the proof.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from tests.unit.kube.conftest import Names, World
from vgpud.kube.api import RESOURCE_API, Conflict, JsonObject, KubeError, NotFound, WatchEvent, WatchEventType
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventRecorder, EventResult, Reason, pod_ref

MANAGER = "vgpud-test"
#: bound on every wait for the API server (generous: a loaded CI machine)
DEADLINE_S = 20


def claim_body(names: Names, name: str) -> JsonObject:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": names.namespace, "annotations": {"keep": "me"}},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "vgpu.test",
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"cores": "20", "memory": "1Gi"}},
                        },
                    }
                ]
            }
        },
    }


def pod_body(names: Names, name: str) -> JsonObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": names.namespace},
        "spec": {
            "nodeName": names.node_name,
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "claim"}],
        },
    }


def slice_body(
    names: Names, suffix: str = "0", *, driver: str | None = None, node: str | None = None, cores: int = 100
) -> JsonObject:
    """A slice as vgpud publishes one: one shareable device with consumable cores and memory."""
    node = node or names.node_name
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node}-{names.tag}-{suffix}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"uid-{node}", "controller": True}
            ],
        },
        "spec": {
            "driver": driver or names.driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"uuid": {"string": f"GPU-{names.tag}"}, "minor": {"int": 0}},
                    "capacity": {
                        "cores": {
                            "value": str(cores),
                            "requestPolicy": {
                                "default": str(cores),
                                "validRange": {"min": "1", "max": str(cores), "step": "1"},
                            },
                        },
                        "memory": {"value": "16Gi"},
                    },
                    "allowMultipleAllocations": True,
                }
            ],
        },
    }


def name_of(obj: JsonObject) -> str:
    return obj["metadata"]["name"]


async def test_get_claim(world: World) -> None:
    created = await world.seed.claim(claim_body(world, "claim"))
    got = await world.kube.get_resource_claim(world.namespace, "claim")
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert got["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "vgpu.test"
    with pytest.raises(NotFound) as e:
        await world.kube.get_resource_claim(world.namespace, "absent")
    assert e.value.status == 404


async def test_patch_claim_annotations(world: World) -> None:
    uid = (await world.seed.claim(claim_body(world, "claim")))["metadata"]["uid"]
    patched = await world.kube.patch_resource_claim_metadata(
        world.namespace, "claim", uid=uid, annotations={"vgpu/a": "1", "vgpu/b": "2"}
    )
    assert patched["metadata"]["annotations"] == {"keep": "me", "vgpu/a": "1", "vgpu/b": "2"}
    await world.kube.patch_resource_claim_metadata(
        world.namespace, "claim", uid=uid, annotations={"vgpu/a": None}
    )
    got = await world.kube.get_resource_claim(world.namespace, "claim")
    assert got["metadata"]["annotations"] == {"keep": "me", "vgpu/b": "2"}


async def test_patch_claim_annotations_uid_precondition(world: World) -> None:
    await world.seed.claim(claim_body(world, "claim"))
    with pytest.raises(Conflict) as e:
        await world.kube.patch_resource_claim_metadata(
            world.namespace, "claim", uid="6a1b0e2c-0000-4000-8000-000000000000", annotations={"vgpu/a": "1"}
        )
    assert "uid" in str(e.value)
    got = await world.kube.get_resource_claim(world.namespace, "claim")
    assert got["metadata"]["annotations"] == {"keep": "me"}
    with pytest.raises(NotFound):
        await world.kube.patch_resource_claim_metadata(world.namespace, "absent", uid="x", labels={"a": "1"})


async def test_get_pod_and_node(world: World) -> None:
    pod = await world.seed.pod(pod_body(world, "pod"))
    node = await world.seed.node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": world.node_name}})
    got_pod = await world.kube.get_pod(world.namespace, "pod")
    assert got_pod["metadata"]["uid"] == pod["metadata"]["uid"]
    assert got_pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "claim"}]
    assert (await world.kube.get_node(world.node_name))["metadata"]["uid"] == node["metadata"]["uid"]
    with pytest.raises(NotFound):
        await world.kube.get_pod(world.namespace, "absent")
    with pytest.raises(NotFound):
        await world.kube.get_node(f"absent-{world.tag}")


async def test_apply_creates_then_updates(world: World) -> None:
    body = slice_body(world)
    created = await world.kube.apply_resource_slice(body, field_manager=MANAGER)
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert meta["ownerReferences"] == body["metadata"]["ownerReferences"]
    assert MANAGER in {entry["manager"] for entry in meta["managedFields"]}
    assert created["spec"]["devices"][0]["capacity"]["cores"]["value"] == "100"
    assert created["spec"]["devices"][0]["allowMultipleAllocations"] is True

    same = await world.kube.apply_resource_slice(body, field_manager=MANAGER)
    assert same["metadata"]["resourceVersion"] == meta["resourceVersion"]  # a no-op: no new version

    updated = await world.kube.apply_resource_slice(slice_body(world, cores=50), field_manager=MANAGER)
    assert updated["metadata"]["uid"] == meta["uid"]
    assert updated["metadata"]["resourceVersion"] != meta["resourceVersion"]
    assert updated["metadata"]["generation"] == meta["generation"] + 1
    assert updated["spec"]["devices"][0]["capacity"]["cores"]["value"] == "50"
    [listed] = await world.kube.list_resource_slices(driver=world.driver, node_name=world.node_name)
    assert listed["spec"] == updated["spec"]
    assert (listed["apiVersion"], listed["kind"]) == (RESOURCE_API, "ResourceSlice")


async def test_list_filters_by_driver_and_node(world: World) -> None:
    mine = [slice_body(world, "0"), slice_body(world, "1")]
    others = [
        slice_body(world, "od", driver=f"other-{world.driver}"),
        slice_body(world, "on", node=f"other-{world.tag}"),
    ]
    for body in mine + others:
        await world.kube.apply_resource_slice(body, field_manager=MANAGER)
    listed = await world.kube.list_resource_slices(driver=world.driver, node_name=world.node_name)
    assert sorted(map(name_of, listed)) == sorted(map(name_of, mine))
    assert await world.kube.list_resource_slices(driver=world.driver, node_name=f"none-{world.tag}") == []


async def test_delete(world: World) -> None:
    body = slice_body(world)
    await world.kube.apply_resource_slice(body, field_manager=MANAGER)
    await world.kube.delete_resource_slice(name_of(body))
    assert await world.kube.list_resource_slices(driver=world.driver, node_name=world.node_name) == []
    await world.kube.delete_resource_slice(name_of(body))  # already gone: fine


async def next_events(events: AsyncIterator[WatchEvent], count: int) -> list[tuple[WatchEventType, str]]:
    return [(e.type, name_of(e.object)) for e in [await anext(events) for _ in range(count)]]


def watch_threads() -> list[Any]:
    """Stacks of threads still inside a watch stream (the real client's; the fake has none)."""
    return [f for f in sys._current_frames().values() if "_Watch." in qualnames(f)]


def qualnames(frame: Any) -> str:
    names = []
    while frame is not None:
        names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return " ".join(names)


async def test_watch_sees_changes_to_our_slices_only(world: World) -> None:
    before = slice_body(world, "before")
    await world.kube.apply_resource_slice(before, field_manager=MANAGER)
    mine = slice_body(world, "0")
    with trio.fail_after(DEADLINE_S):
        async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name) as events:
            await world.kube.apply_resource_slice(mine, field_manager=MANAGER)
            await world.kube.apply_resource_slice(
                slice_body(world, "od", driver=f"other-{world.driver}"), field_manager=MANAGER
            )
            await world.kube.apply_resource_slice(
                slice_body(world, "on", node=f"other-{world.tag}"), field_manager=MANAGER
            )
            await world.kube.apply_resource_slice(slice_body(world, "0", cores=10), field_manager=MANAGER)
            await world.kube.delete_resource_slice(name_of(mine))
            got = await next_events(events, 3)
            assert got == [
                (WatchEventType.ADDED, name_of(mine)),
                (WatchEventType.MODIFIED, name_of(mine)),
                (WatchEventType.DELETED, name_of(mine)),
            ]
            # a slice that existed before the watch is not replayed; a later change to it is seen
            await world.kube.delete_resource_slice(name_of(before))
            assert await next_events(events, 1) == [(WatchEventType.DELETED, name_of(before))]
    assert watch_threads() == []


async def test_watch_event_carries_the_object(world: World) -> None:
    with trio.fail_after(DEADLINE_S):
        async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name) as events:
            applied = await world.kube.apply_resource_slice(slice_body(world), field_manager=MANAGER)
            event = await anext(events)
    assert event.object["spec"] == applied["spec"]
    assert event.object["metadata"]["uid"] == applied["metadata"]["uid"]
    assert (event.object["apiVersion"], event.object["kind"]) == (RESOURCE_API, "ResourceSlice")


async def test_watch_exits_promptly_with_unread_events(world: World) -> None:
    with trio.fail_after(DEADLINE_S):
        async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name):
            for suffix in "012":
                await world.kube.apply_resource_slice(slice_body(world, suffix), field_manager=MANAGER)
            await trio.sleep(0.2)  # let the server send them: the reader never takes them
    assert watch_threads() == []


async def test_watch_exits_promptly_when_idle(world: World) -> None:
    with trio.fail_after(DEADLINE_S):
        for _ in range(3):
            async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name):
                pass
    assert watch_threads() == []


async def test_watch_exits_when_cancelled(world: World) -> None:
    with trio.move_on_after(0.3) as scope:
        async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name) as events:
            async for _ in events:
                pass
    assert scope.cancelled_caught
    with trio.fail_after(DEADLINE_S):
        while watch_threads():  # noqa: ASYNC110 - a cancelled watch's thread ends on its own, soon
            await trio.sleep(0.05)


async def test_watch_lets_the_callers_error_through(world: World) -> None:
    """Not wrapped in an ExceptionGroup: callers catch KubeError around a watch as around a call."""
    with trio.fail_after(DEADLINE_S), pytest.raises(KubeError, match="caller's own"):
        async with world.kube.watch_resource_slices(driver=world.driver, node_name=world.node_name):
            raise KubeError("the caller's own")
    assert watch_threads() == []


async def test_claims_are_listed_and_watched_in_every_namespace(world: World) -> None:
    """What the claim cache (vgpud.kube.informer) is fed: a watch from the list's version sees every
    change after the list, and nothing before it."""
    before = await world.seed.claim(claim_body(world, "before"))
    with trio.fail_after(DEADLINE_S):
        listing = await world.kube.list_resource_claims()
        mine = [c for c in listing.items if c["metadata"]["namespace"] == world.namespace]
        assert [(c["metadata"]["uid"], c["kind"]) for c in mine] == [
            (before["metadata"]["uid"], "ResourceClaim")
        ]
        await world.kube.patch_resource_claim_metadata(
            world.namespace, "before", uid=before["metadata"]["uid"], annotations={"seen": "yes"}
        )
        later = await world.seed.claim(claim_body(world, "later"))
        async with world.kube.watch_resource_claims(resource_version=listing.resource_version) as events:
            got = []
            async for event in events:  # other tests' claims may pass by: only ours count
                if event.object["metadata"]["namespace"] == world.namespace:
                    got.append((event.type, event.object["metadata"]["uid"]))
                if len(got) == 2:
                    break
            assert got == [
                (WatchEventType.MODIFIED, before["metadata"]["uid"]),
                (WatchEventType.ADDED, later["metadata"]["uid"]),
            ]
    assert watch_threads() == []


async def test_a_label_selects_the_claims_listed_and_watched(world: World) -> None:
    """What a node's claim cache is fed (vgpud.dra.claimlabel): the claims that carry its label. A
    claim labelled later enters the watch (ADDED), one whose label is removed leaves it (DELETED), a
    claim labelled for another node never shows."""
    mine = {f"vgpud.test/node-{world.tag}": "here"}
    theirs = {f"vgpud.test/node-{world.tag}": "there"}
    labelled = await world.seed.claim(claim_body(world, "labelled"))
    other = await world.seed.claim(claim_body(world, "other"))
    late = await world.seed.claim(claim_body(world, "late"))
    uid = {c["metadata"]["name"]: c["metadata"]["uid"] for c in (labelled, other, late)}
    kube = world.kube
    with trio.fail_after(DEADLINE_S):
        await kube.patch_resource_claim_metadata(
            world.namespace, "labelled", uid=uid["labelled"], labels=mine
        )
        await kube.patch_resource_claim_metadata(world.namespace, "other", uid=uid["other"], labels=theirs)
        listing = await kube.list_resource_claims(labels=mine)
        assert [c["metadata"]["name"] for c in listing.items] == ["labelled"]
        async with kube.watch_resource_claims(
            resource_version=listing.resource_version, labels=mine
        ) as events:
            await kube.patch_resource_claim_metadata(
                world.namespace, "other", uid=uid["other"], labels={"x": "1"}
            )
            await kube.patch_resource_claim_metadata(world.namespace, "late", uid=uid["late"], labels=mine)
            key = next(iter(mine))
            await kube.patch_resource_claim_metadata(
                world.namespace, "labelled", uid=uid["labelled"], labels={key: None}
            )
            got = [(event.type, event.object["metadata"]["name"]) for event in [await events.__anext__()]]
            got.append(((e := await events.__anext__()).type, e.object["metadata"]["name"]))
            assert got == [(WatchEventType.ADDED, "late"), (WatchEventType.DELETED, "labelled")]
        gone = await kube.get_resource_claim(world.namespace, "labelled")
        assert key not in (gone["metadata"].get("labels") or {})
    assert watch_threads() == []


async def test_the_nodes_pods_are_listed_and_watched_from_the_lists_version(world: World) -> None:
    """What the pod cache is fed: this node's pods only (field selector spec.nodeName)."""
    first = await world.seed.pod(pod_body(world, "first"))
    elsewhere = pod_body(world, "elsewhere")
    elsewhere["spec"]["nodeName"] = f"other-{world.tag}"
    await world.seed.pod(elsewhere)
    with trio.fail_after(DEADLINE_S):
        listing = await world.kube.list_node_pods(node_name=world.node_name)
        assert [(p["metadata"]["uid"], p["kind"]) for p in listing.items] == [
            (first["metadata"]["uid"], "Pod")
        ]
        second = await world.seed.pod(pod_body(world, "second"))  # after the list, before the watch
        moved = pod_body(world, "moved")
        moved["spec"]["nodeName"] = f"other-{world.tag}"
        await world.seed.pod(moved)
        async with world.kube.watch_node_pods(
            node_name=world.node_name, resource_version=listing.resource_version
        ) as events:
            event = await events.__anext__()
            assert (event.type, event.object["metadata"]["uid"]) == (
                WatchEventType.ADDED,
                second["metadata"]["uid"],
            )
            assert event.object["spec"]["nodeName"] == world.node_name
    assert watch_threads() == []


def event_body(world: World, name: str) -> JsonObject:
    return {
        "metadata": {"name": name, "namespace": world.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": world.namespace, "name": "pod"},
        "type": "Warning",
        "reason": "Test",
        "message": "one",
        "source": {"component": "vgpud", "host": world.node_name},
        "count": 1,
    }


async def test_an_event_is_created_then_patched(world: World) -> None:
    created = await world.kube.create_event(world.namespace, event_body(world, "pod.1"))
    assert (created["count"], created["metadata"]["namespace"]) == (1, world.namespace)
    with pytest.raises(Conflict):
        await world.kube.create_event(world.namespace, event_body(world, "pod.1"))
    patched = await world.kube.patch_event(
        world.namespace, "pod.1", {"count": 2, "lastTimestamp": "2026-01-02T03:04:05Z", "message": "two"}
    )
    assert (patched["count"], patched["message"], patched["reason"]) == (2, "two", "Test")
    assert patched["lastTimestamp"] == "2026-01-02T03:04:05Z"
    [read] = await world.seed.events(world.namespace)
    assert (read["metadata"]["name"], read["count"], read["message"]) == ("pod.1", 2, "two")
    with pytest.raises(NotFound):
        await world.kube.patch_event(world.namespace, "absent.1", {"count": 2})


async def written(recorder: EventRecorder, count: int) -> None:
    """Until the recorder has written (or given up on) `count` Events."""
    with trio.fail_after(DEADLINE_S):
        while sum(recorder.stats.values()) < count:  # noqa: ASYNC110 (a counter: no event to wait on)
            await trio.sleep(0.01)


async def test_the_recorder_writes_a_repeat_as_one_event_with_its_count(world: World) -> None:
    """What `kubectl describe pod` and `kubectl describe node` then find: one Event per fact, its
    count the repeats, the node's in `default` with the node's name as uid."""
    pod = await world.seed.pod(pod_body(world, "pod"))
    now = [1_800_000_000.0]
    recorder = EventRecorder(world.kube, world.node_name, clock=lambda: now[0])
    ref = pod_ref(world.namespace, "pod", pod["metadata"]["uid"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.run, lambda: None)
        recorder.record(ref, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "container main runs without it")
        recorder.record_node(EventType.WARNING, Reason.GPU_UNHEALTHY, "GPU 0 unhealthy")
        await written(recorder, 2)
        now[0] += 61
        recorder.record(ref, EventType.WARNING, Reason.VGPU_NOT_INJECTED, "container main runs without it")
        await written(recorder, 3)
        nursery.cancel_scope.cancel()
    assert recorder.stats == {EventResult.SENT: 2, EventResult.PATCHED: 1}
    [event] = await world.seed.events(world.namespace)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": world.namespace,
        "name": "pod",
        "uid": pod["metadata"]["uid"],
    }
    assert event["metadata"]["name"].startswith("pod.")
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "VGPUNotInjected", 2)
    assert event["source"] == {"component": "vgpud", "host": world.node_name}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("vgpud", world.node_name)
    assert (event["firstTimestamp"], event["lastTimestamp"]) == (
        "2027-01-15T08:00:00Z",
        "2027-01-15T08:01:01Z",
    )
    [on_node] = [e for e in await world.seed.events("default") if e["source"]["host"] == world.node_name]
    assert on_node["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": world.node_name,
        "uid": world.node_name,
    }
    assert (on_node["reason"], on_node["message"], on_node["count"]) == ("GPUUnhealthy", "GPU 0 unhealthy", 1)

"""The watch-fed cache (vgpud.kube.informer) over the in-memory facade, in virtual time: list, then
watch from the list's version; a watch that ends is reopened from the last version; 410 Gone lists
again; an error is the supervisor's to retry with backoff, and the retry watches on from where it
stopped; a periodic resync lists again; subscribers are woken by their key's change only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from tests import objects as o
from tests.unit.registry.world import run_cache
from vgpud.kube import Gone, JsonObject, KubeError, Listing, WatchEvent
from vgpud.kube.api import WatchEventType
from vgpud.kube.fake import FakeKube
from vgpud.kube.informer import Informer, pod_informer
from vgpud.supervisor import Backoff, Restart, Supervisor

NODE = "node-a"


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def pod(name: str, *, node: str = NODE, phase: str = "Pending") -> JsonObject:
    body = o.pod(name, "", containers=[o.container("main")])
    del body["metadata"]["uid"]  # the fake mints one
    body["spec"]["nodeName"] = node
    body["status"]["phase"] = phase
    return body


def names(informer: Informer) -> list[str]:
    return sorted(obj["metadata"]["name"] for obj in informer._objects.values())


class Recorded:
    """Every change a handler saw, as (old name or None, new name or None)."""

    def __init__(self, informer: Informer) -> None:
        self.changes: list[tuple[str | None, str | None]] = []
        informer.handlers.append(self.changed)

    def changed(self, old: JsonObject | None, new: JsonObject | None) -> None:
        self.changes.append(tuple(None if x is None else x["metadata"]["name"] for x in (old, new)))  # type: ignore[arg-type]


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_lists_then_watches_this_nodes_pods(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()
    kube.add_pod(pod("a"))
    kube.add_pod(pod("elsewhere", node="node-b"))
    informer = pod_informer(kube, NODE, stream_lists=False)
    seen = Recorded(informer)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        assert informer.synced and names(informer) == ["a"]
        b = kube.add_pod(pod("b"))
        kube.add_pod(pod("a", phase="Running"))
        kube.remove_pod(o.NAMESPACE, "a")
        kube.add_pod(pod("elsewhere-too", node="node-b"))
        await settle()
        assert names(informer) == ["b"]
        assert informer.by_uid(b["metadata"]["uid"]) == b
        assert informer.get(o.NAMESPACE, "b") == b and informer.get(o.NAMESPACE, "a") is None
        assert seen.changes == [(None, "a"), (None, "b"), ("a", "a"), ("a", None)]
        assert kube.calls == {"list_node_pods": 1, "watch_node_pods": 1}
        nursery.cancel_scope.cancel()


async def test_a_change_between_the_list_and_the_watch_is_not_lost(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()

    async def list_then_someone_writes() -> Listing:
        listing = await kube.list_node_pods(node_name=NODE)
        kube.add_pod(pod("late"))  # after the list's version, before the watch opens
        return listing

    def watch(version: str) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return kube.watch_node_pods(node_name=NODE, resource_version=version)

    informer = Informer("pod", list_then_someone_writes, watch, stream_lists=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        await settle()
        assert names(informer) == ["late"]
        nursery.cancel_scope.cancel()


async def test_an_ended_watch_is_reopened_from_the_last_version_without_a_list(
    autojump: trio.testing.MockClock,
) -> None:
    kube = FakeKube()
    informer = pod_informer(kube, NODE, stream_lists=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        kube.end_watches()  # the server's timeout
        kube.add_pod(pod("while-away"))  # before the new watch: replayed from the version
        await trio.sleep(1.0)  # the minimum interval between two watch starts
        await settle()
        assert names(informer) == ["while-away"]
        assert kube.calls == {"list_node_pods": 1, "watch_node_pods": 2}
        nursery.cancel_scope.cancel()


async def test_410_gone_lists_again_and_the_list_is_the_truth(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()
    kube.add_pod(pod("stays"))
    kube.add_pod(pod("goes"))
    informer = pod_informer(kube, NODE, stream_lists=False)
    seen = Recorded(informer)
    listed = []
    informer.list_handlers.append(lambda: listed.append(names(informer)))
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        kube.end_watches()
        kube.remove_pod(o.NAMESPACE, "goes")
        kube.add_pod(pod("new"))
        kube.compact()  # the reopened watch's version is no longer in the history
        await trio.sleep(1.0)
        await settle()
        assert names(informer) == ["new", "stays"]
        assert kube.calls == {
            "list_node_pods": 2,
            "watch_node_pods": 3,
        }  # list, watch, watch (Gone), list, watch
        assert listed == [["goes", "stays"], ["new", "stays"]]
        # the relist told the handlers what changed, the deletion too, and nothing about "stays"
        assert seen.changes[2:] == [("goes", None), (None, "new")]
        nursery.cancel_scope.cancel()
    with pytest.raises(Gone):  # what the informer got: the server's ERROR event on an accepted watch
        async with kube.watch_node_pods(node_name=NODE, resource_version="1") as events:
            await anext(events)


async def test_an_error_is_retried_with_the_supervisors_backoff_from_the_last_version(
    autojump: trio.testing.MockClock,
) -> None:
    kube = FakeKube()
    informer = pod_informer(kube, NODE, stream_lists=False)
    opened: list[float] = []
    watch_node_pods = kube.watch_node_pods

    def timed_watch(**kwargs: Any) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        opened.append(trio.current_time())
        return watch_node_pods(**kwargs)

    kube.watch_node_pods = timed_watch  # type: ignore[method-assign]
    async with Supervisor() as supervisor:
        supervisor.supervise("pod-cache", informer.run, Restart(Backoff(initial=1, factor=2, cap=30)))
        await settle()
        kube.fail_next("watch_node_pods", KubeError("connection refused"))
        kube.fail_next("watch_node_pods", KubeError("connection refused"))
        kube.end_watches(KubeError("stream reset"))  # at t=0: the session fails
        kube.add_pod(pod("while-down"))
        await trio.sleep(10)
        assert opened == [0.0, 1.0, 3.0, 7.0]  # then after 1 s (refused), 2 s (refused), 4 s
        assert names(informer) == ["while-down"]
        assert kube.calls["list_node_pods"] == 1  # the retries watched from the last version
        assert supervisor.health.get("pod-cache").state == "healthy"
        supervisor.cancel()


@pytest.mark.parametrize(("rand", "due"), [(0.0, 600.0), (0.5, 630.0), (0.999, 659.94)])
async def test_a_resync_lists_again_at_a_random_point_of_its_window(
    autojump: trio.testing.MockClock, rand: float, due: float
) -> None:
    """[resync, resync x 1.1]: the nodes of a DaemonSet started together do not list together."""
    kube = FakeKube()
    informer = pod_informer(kube, NODE, resync=600.0, rand=lambda: rand, stream_lists=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        await trio.sleep(due - 1)
        assert kube.calls == {"list_node_pods": 1, "watch_node_pods": 1}
        await trio.sleep(2)
        assert kube.calls == {"list_node_pods": 2, "watch_node_pods": 2}
        nursery.cancel_scope.cancel()


async def test_a_bookmark_moves_the_version_and_changes_nothing(autojump: trio.testing.MockClock) -> None:
    """The next watch starts from the bookmark's version; the store is as the list left it."""
    listed = pod("listed")
    opened: list[str] = []

    async def lister() -> Listing:
        return Listing([listed], "10")

    @asynccontextmanager
    async def watcher(version: str) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        opened.append(version)

        async def events() -> AsyncIterator[WatchEvent]:
            if len(opened) == 1:
                yield WatchEvent(
                    WatchEventType.BOOKMARK, {"kind": "Pod", "metadata": {"resourceVersion": "25"}}
                )

        yield events()

    informer = Informer("pod", lister, watcher, min_interval=1.0, stream_lists=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        await trio.sleep(1.5)
        assert opened[:2] == ["10", "25"] and informer.bookmarks == 1
        assert names(informer) == ["listed"] and informer.lists == 1
        nursery.cancel_scope.cancel()


async def test_subscribers_are_woken_by_their_keys_change_only(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()
    informer = pod_informer(kube, NODE, stream_lists=False)
    mine, other, synced = trio.Event(), trio.Event(), trio.Event()
    informer.subscribe_synced(synced)
    informer.subscribe((o.NAMESPACE, "mine"), mine)
    informer.subscribe((o.NAMESPACE, "other"), other)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        assert synced.is_set()
        kube.add_pod(pod("mine"))
        kube.add_pod(pod("someone-else"))
        await settle()
        assert mine.is_set() and not other.is_set()
        informer.unsubscribe((o.NAMESPACE, "other"), other)
        kube.add_pod(pod("other"))
        await settle()
        assert not other.is_set()
        nursery.cancel_scope.cancel()


def test_settings_that_cannot_work_are_refused() -> None:
    kube = FakeKube()
    with pytest.raises(ValueError, match="resync must be > 0"):
        pod_informer(kube, NODE, resync=0)


async def test_a_streaming_list_is_the_watchs_start(autojump: trio.testing.MockClock) -> None:
    """The current pods arrive as the watch's initial events: no list call; ready once they are in."""
    kube = FakeKube()
    kube.add_pod(pod("before"))
    informer = pod_informer(kube, NODE)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        assert names(informer) == ["before"] and informer.synced and informer.lists == 1
        kube.add_pod(pod("after"))
        await settle()
        assert names(informer) == ["after", "before"]
        assert kube.calls == {"watch_node_pods": 1}
        nursery.cancel_scope.cancel()


async def test_a_server_without_the_streaming_list_is_listed(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()
    kube.add_pod(pod("before"))
    kube.fail_next("watch_node_pods", KubeError("sendInitialEvents is forbidden for watch", 422))
    informer = pod_informer(kube, NODE)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        assert names(informer) == ["before"] and not informer.stream_lists
        assert kube.calls == {"watch_node_pods": 2, "list_node_pods": 1}
        nursery.cancel_scope.cancel()


async def test_a_resync_streams_the_list_again(autojump: trio.testing.MockClock) -> None:
    kube = FakeKube()
    kube.add_pod(pod("stays"))
    kube.add_pod(pod("goes"))
    informer = pod_informer(kube, NODE, resync=600.0, rand=lambda: 0.0)
    gone: list[str] = []
    informer.handlers.append(lambda old, new: gone.append(old["metadata"]["name"]) if new is None else None)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, informer)
        kube.remove_pod("default", "goes")
        await trio.sleep(601)
        assert names(informer) == ["stays"] and gone == ["goes"]
        assert informer.lists == 2 and kube.calls == {"watch_node_pods": 2}
        nursery.cancel_scope.cancel()

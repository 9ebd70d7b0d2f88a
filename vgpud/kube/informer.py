"""Informer: a watch-fed cache of one kind of object, the pattern of client-go's reflector and store.

It lists, then watches from the list's resourceVersion, so no change falls between the two. Where the
server offers it (the WatchList feature, on in current Kubernetes), the list is the watch's own start
(`stream_lists`: a watch from version "" sends every object, then a bookmark, then the changes), so no
list answer of every object is ever built or held; a server without it (422) is listed, in pages. A watch
that ends (the server's timeout) is opened again from the last version seen, without a list; a
watch the server answers 410 Gone (its history was compacted) lists again; every `resync` seconds it
lists again anyway, which bounds how long a missed change can stay wrong. The watch asks for bookmarks,
so its version stays current through quiet hours and a reopened watch rarely meets 410; each resync
comes at a random point of [resync, resync x (1 + jitter)], so the nodes of a DaemonSet, started
together, do not list together ever after. Any other error is raised:
the informer is a supervised component (`run(ready)`), and the supervisor's restart backoff is the
reconnect backoff; the store and the last version survive the restart, so the next session watches
from where the last one stopped. Readers never wait for the API: `get` and `by_uid` read the store,
and a reader that needs a change subscribes a Trio event to a key, which the next change of that
object sets (the resolver of register calls waits on these instead of polling).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from vgpud.kube.api import (
    INITIAL_EVENTS_END,
    Gone,
    JsonObject,
    KubeApi,
    KubeError,
    Listing,
    WatchEvent,
    WatchEventType,
)

log = logging.getLogger("vgpud.kube")

#: (namespace, name); cluster-scoped objects have namespace ""
Key = tuple[str, str]
Lister = Callable[[], Awaitable[Listing]]
Watcher = Callable[[str], AbstractAsyncContextManager[AsyncIterator[WatchEvent]]]
#: (old, new): None for old on an object's first sight, None for new on its deletion
Handler = Callable[[JsonObject | None, JsonObject | None], None]

#: seconds between two complete lists while the watch runs
RESYNC_INTERVAL = 600.0
#: at least this long between two watch starts, so a watch that ends at once cannot spin
WATCH_MIN_INTERVAL = 1.0
#: a resync comes up to this fraction of `resync` later than due, at random (client-go's reflector
#: spreads its resyncs the same way)
RESYNC_JITTER = 0.1


def key_of(obj: JsonObject) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _uid(obj: JsonObject) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _version(obj: JsonObject) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _ends_initial_events(event: WatchEvent) -> bool:
    annotations = (event.object.get("metadata") or {}).get("annotations") or {}
    return event.type is WatchEventType.BOOKMARK and annotations.get(INITIAL_EVENTS_END) == "true"


class Informer:
    """The objects one list + watch pair sees, kept current. Objects are the API's dicts, shared with
    every reader: readers must not modify them."""

    def __init__(
        self,
        kind: str,
        lister: Lister,
        watcher: Watcher,
        *,
        resync: float = RESYNC_INTERVAL,
        min_interval: float = WATCH_MIN_INTERVAL,
        resync_jitter: float = RESYNC_JITTER,
        rand: Callable[[], float] = random.random,
        stream_lists: bool = True,
    ) -> None:
        if not (resync > 0 and min_interval >= 0 and resync_jitter >= 0):
            raise ValueError(f"informer {kind}: resync must be > 0, min_interval and resync_jitter >= 0")
        self.kind = kind
        self._lister = lister
        self._watcher = watcher
        self.resync = resync
        self.min_interval = min_interval
        self.resync_jitter = resync_jitter
        #: a number in [0, 1): where in the jitter window the next resync falls
        self._rand = rand
        #: list through the watch (the streaming list); off for good once the server refuses it
        self.stream_lists = stream_lists
        self._objects: dict[Key, JsonObject] = {}
        self._uids: dict[str, Key] = {}
        #: the version the next watch starts from; None: list first
        self._version: str | None = None
        self._next_list = -math.inf
        self._subscribers: dict[Key, set[trio.Event]] = {}
        self._sync_subscribers: set[trio.Event] = set()
        #: called on every change of an object, after the store has it
        self.handlers: list[Handler] = []
        #: called after every complete list, after the store has it
        self.list_handlers: list[Callable[[], None]] = []
        #: true from the first complete list on (a later failure does not reset it)
        self.synced = False
        #: complete lists, opened watches and bookmarks received (debug state, tests)
        self.lists = 0
        self.watches = 0
        self.bookmarks = 0

    # -- readers -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, namespace: str, name: str) -> JsonObject | None:
        return self._objects.get((namespace, name))

    def by_uid(self, uid: str) -> JsonObject | None:
        key = self._uids.get(uid)
        return self._objects.get(key) if key is not None else None

    def uids(self) -> frozenset[str]:
        return frozenset(self._uids)

    def subscribe(self, key: Key, event: trio.Event) -> None:
        """`event` is set at the next change of the object at `key` (added, modified or deleted)."""
        self._subscribers.setdefault(key, set()).add(event)

    def unsubscribe(self, key: Key, event: trio.Event) -> None:
        events = self._subscribers.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._subscribers[key]

    def subscribe_synced(self, event: trio.Event) -> None:
        """`event` is set when the first list completes (never, when it has: check `synced`)."""
        if not self.synced:
            self._sync_subscribers.add(event)

    def unsubscribe_synced(self, event: trio.Event) -> None:
        self._sync_subscribers.discard(event)

    # -- the component -----------------------------------------------------------------------------

    async def run(self, ready: Callable[[], None]) -> None:
        """List when there is no version to watch from (or a resync is due), then watch; ready once
        the watch is open and the list in (once per call). Returns never; raises KubeError when the
        server fails."""
        announced = False

        def announce() -> None:
            nonlocal announced
            if not announced:
                announced = True
                ready()

        while True:
            relist = self._version is None or trio.current_time() >= self._next_list
            stream = relist and self.stream_lists
            if relist and not stream:
                await self._list()
            started = trio.current_time()
            try:
                await self._watch(stream, announce)
            except Gone as err:
                log.info("%s watch from version %s: %s; listing again", self.kind, self._version, err)
                self._version = None
                continue
            except KubeError as err:
                if not (stream and err.status == 422):
                    raise
                log.info("%s: the API server has no streaming list (%s); listing instead", self.kind, err)
                self.stream_lists = False
                continue
            if trio.current_time() < self._next_list:
                await trio.sleep_until(started + self.min_interval)

    async def _watch(self, stream: bool, announce: Callable[[], None]) -> None:
        """One watch until the resync is due or the server ends it; `stream`: from version "", its
        initial events (up to the bookmark that ends them) replace the store as a list would."""
        # a streaming list has no deadline until its initial events are in: they are the list
        with trio.CancelScope(deadline=math.inf if stream else self._next_list) as scope:
            async with self._watcher("" if stream else str(self._version)) as events:
                self.watches += 1
                initial: dict[Key, JsonObject] | None = {} if stream else None
                if initial is None:
                    announce()
                async for event in events:
                    if initial is None:
                        self._apply(event)
                    elif _ends_initial_events(event):
                        self._replace(initial, _version(event.object))
                        initial = None
                        scope.deadline = self._next_list
                        announce()
                    elif event.type is WatchEventType.ADDED:
                        initial[key_of(event.object)] = event.object

    async def _list(self) -> None:
        listing = await self._lister()
        self._replace({key_of(obj): obj for obj in listing.items}, listing.resource_version)

    def _replace(self, fresh: dict[Key, JsonObject], version: str) -> None:
        """A complete list of the objects (`fresh`, as of `version`) replaces the store."""
        for key in [k for k in self._objects if k not in fresh]:
            self._store(key, None)
        for key, obj in fresh.items():
            old = self._objects.get(key)
            if old is None or _version(old) != _version(obj) or _uid(old) != _uid(obj):
                self._store(key, obj)
        self._version = version
        self._next_list = trio.current_time() + self.resync * (1 + self.resync_jitter * self._rand())
        self.lists += 1
        if not self.synced:
            self.synced = True
            log.info("%s cache: %d listed", self.kind, len(fresh))
            for event in self._sync_subscribers:
                event.set()
            self._sync_subscribers.clear()
        for handler in self.list_handlers:
            handler()

    def _apply(self, event: WatchEvent) -> None:
        obj = event.object
        version = _version(obj)
        if version:
            self._version = version
        if event.type is WatchEventType.BOOKMARK:
            self.bookmarks += 1
            return
        self._store(key_of(obj), None if event.type is WatchEventType.DELETED else obj)

    def _store(self, key: Key, new: JsonObject | None) -> None:
        old = self._objects.pop(key, None)
        if old is not None and self._uids.get(_uid(old)) == key:
            del self._uids[_uid(old)]
        if new is not None:
            self._objects[key] = new
            self._uids[_uid(new)] = key
        if old is None and new is None:
            return
        for handler in self.handlers:
            handler(old, new)
        for event in self._subscribers.pop(key, ()):
            event.set()


def pod_informer(kube: KubeApi, node_name: str, **kwargs: Any) -> Informer:
    """The pods bound to `node_name`."""

    def watch(version: str) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return kube.watch_node_pods(node_name=node_name, resource_version=version)

    async def list_node_pods() -> Listing:
        return await kube.list_node_pods(node_name=node_name)

    return Informer("pod", list_node_pods, watch, **kwargs)


def claim_informer(kube: KubeApi, *, labels: Mapping[str, str] | None = None, **kwargs: Any) -> Informer:
    """The ResourceClaims of every namespace that carry `labels` (a node's: the claims it prepared,
    `vgpud.dra.claimlabel`); None: every claim of the cluster."""

    def watch(version: str) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return kube.watch_resource_claims(resource_version=version, labels=labels)

    async def list_claims() -> Listing:
        return await kube.list_resource_claims(labels=labels)

    return Informer("resource claim", list_claims, watch, **kwargs)

"""The webhook's pod cache: every pod of the cluster, trimmed to what the admission rules read and
indexed by the claims each one names, so that a review reads the few pods that can matter to it
instead of listing its namespace (a list costs in proportion to the namespace: a review took 162 ms
at 2,000 pods, 751 ms at 8,000).

An `Informer` (vgpud.kube.informer) keeps it current: a streaming list (or a list in pages) and a
watch of /api/v1/pods with bookmarks, relisting now and then. Each pod is trimmed as it is stored
(`podselect.trim_pod`), and an Informer handler keeps the index (namespace, claim name) -> pods.
`PodCache.pods_for` makes the choice of `podselect.select_pods` through the index, in the order of the
namespace's list (by name), so the rules see the pods they would see in the list, in the same order,
less those that cannot change their answer.

The cache is read only while it is current (`read`): listed once, and its watch open. Before that
(the webhook just started) and while the watch reconnects, reviews list their namespace as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

from vgpud.kube.api import JsonObject, Listing, WatchEvent, WatchEventType
from vgpud.kube.informer import Informer, Key, key_of
from vgpud.webhook.podselect import Strings, pod_claim_names, select_pods, storable, trim_pod

log = logging.getLogger("vgpud.webhook")

KIND = "webhook pod"


class PodsByClaim:
    """(namespace, claim name) -> the keys of the pods that name the claim; `update` is an Informer
    handler, called with (old, new) on every change."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], set[Key]] = {}

    def __len__(self) -> int:
        """How many (namespace, claim) entries are indexed."""
        return len(self._pods)

    def keys(self, namespace: str, claim: str) -> frozenset[Key]:
        return frozenset(self._pods.get((namespace, claim), ()))

    def update(self, old: JsonObject | None, new: JsonObject | None) -> None:
        before = pod_claim_names(old) if old is not None else frozenset()
        after = pod_claim_names(new) if new is not None else frozenset()
        if old is not None:
            key = key_of(old)
            for name in before - after if new is not None and key_of(new) == key else before:
                entry = self._pods.get((key[0], name))
                if entry is not None:
                    entry.discard(key)
                    if not entry:
                        del self._pods[(key[0], name)]
        if new is not None:
            key = key_of(new)
            for name in after:
                self._pods.setdefault((key[0], name), set()).add(key)


class PodSource(Protocol):
    """Every pod of the cluster: a list, and a watch from a version ("": the streaming list)."""

    async def list_all_pods(self) -> Listing: ...

    def watch_all_pods(
        self, resource_version: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]: ...


class _Trimmed:
    """A watch's events with their pods trimmed; bookmarks as they came (the informer reads their
    annotations); an object without metadata to key it by is dropped (the API server sends none)."""

    def __init__(self, events: AsyncIterator[WatchEvent], strings: Strings) -> None:
        self._events = events
        self._strings = strings

    def __aiter__(self) -> _Trimmed:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            event = await anext(self._events)
            if event.type is WatchEventType.BOOKMARK:
                return event
            if storable(event.object):
                return WatchEvent(event.type, trim_pod(event.object, self._strings))
            log.warning("pod cache: dropped a %s event without pod metadata", event.type.value)


class PodCache:
    """Every pod of the cluster, trimmed, with its claim index; a supervised component (`run`)."""

    def __init__(self, source: PodSource, **informer_options: Any) -> None:
        self._source = source
        self.informer = Informer(KIND, self._list, self._watch, **informer_options)
        self.index = PodsByClaim()
        self.informer.handlers.append(self.index.update)
        self.informer.list_handlers.append(self._listed)
        self._watches = 0
        self._sessions = 0
        #: one copy of the strings that repeat across pods (`podselect.trim_pod`)
        self._strings: Strings = {}

    def __len__(self) -> int:
        return len(self.informer)

    @property
    def current(self) -> bool:
        """Listed at least once, and its watch open: the index is as late as the watch, no more."""
        return self.informer.synced and self._watches > 0

    def pods_for(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject]:
        """`select_pods` over the cache, through the index: the pods of `namespace` that name one of
        `claim_names` or that are reserved (`reserved_uids`), by name as the namespace's list has them."""
        keys: set[Key] = set()
        for name in claim_names:
            keys |= self.index.keys(namespace, name)
        for uid in reserved_uids:
            pod = self.informer.by_uid(uid)
            if pod is not None:
                keys.add(key_of(pod))
        found = (self.informer.get(*key) for key in sorted(keys))
        return select_pods((pod for pod in found if pod is not None), namespace, claim_names, reserved_uids)

    def read(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject] | None:
        """`pods_for` while the cache is `current`; None otherwise (the caller lists the namespace)."""
        return self.pods_for(namespace, claim_names, reserved_uids) if self.current else None

    async def run(self, ready: Callable[[], None]) -> None:
        """`Informer.run`, as a supervised component. The first session is ready at once: until the
        cache is current reviews list their namespace, so a cache still listing must not fail the
        webhook's health. A later one (after a failure) is ready once its list is in and its watch
        open, so a cache that keeps failing shows in the health as any component does."""
        self._sessions += 1
        if self._sessions == 1:
            ready()
        await self.informer.run(ready)

    async def _list(self) -> Listing:
        listing = await self._source.list_all_pods()
        pods = [trim_pod(pod, self._strings) for pod in listing.items if storable(pod)]
        return Listing(pods, listing.resource_version)

    @asynccontextmanager
    async def _watch(self, resource_version: str) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        async with self._source.watch_all_pods(resource_version) as events:
            self._watches += 1
            try:
                yield _Trimmed(events, self._strings)
            finally:
                self._watches -= 1

    def _listed(self) -> None:
        if self.informer.lists == 1:
            log.info(
                "pod cache synced: %d pods, %d (namespace, claim) names; reviews read it from now on "
                "instead of listing their namespace",
                len(self.informer),
                len(self.index),
            )

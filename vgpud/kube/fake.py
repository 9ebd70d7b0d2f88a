"""FakeKube: an in-memory, Trio-native KubeApi for unit tests and benches.

It keeps objects as dicts, as the API server would return them, and deep-copies on the way in and
out so a caller can never mutate the store behind its back. Test hooks simulate what other actors
do: `add_claim`/`add_pod`/`add_node` and `remove_claim`/`remove_pod` (the user, the scheduler, the
kubelet), `delete_resource_slice` (kubelet deleting slices), `fail_next` (a flaky server),
`end_watches` (a watch that breaks), `compact` (etcd compaction: a watch from an older
resourceVersion is Gone) and `delete_event` (the server's event TTL); `events` lists the Events
written. Every change is kept in a history, so a watch from a resourceVersion
replays what came after it, as the API server's watch cache does.
"""

from __future__ import annotations

import copy
import math
import uuid
from collections import Counter, defaultdict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio

from vgpud.kube._channel import ChannelEvents, WatchItem
from vgpud.kube.api import (
    INITIAL_EVENTS_END,
    RESOURCE_API,
    Conflict,
    Gone,
    JsonObject,
    KubeError,
    Listing,
    NotFound,
    WatchEvent,
    WatchEventType,
)

_SYSTEM_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


@dataclass(frozen=True)
class _Change:
    version: int
    kind: str
    old: JsonObject | None
    new: JsonObject | None


@dataclass
class _Watcher:
    kind: str
    matches: Callable[[JsonObject], bool]
    send: trio.MemorySendChannel[WatchItem]


class FakeKube:
    """KubeApi in memory. `calls` counts every KubeApi call by method name (tests may clear it)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._failures: defaultdict[str, deque[KubeError]] = defaultdict(deque)
        self._claims: dict[tuple[str, str], JsonObject] = {}
        self._pods: dict[tuple[str, str], JsonObject] = {}
        self._nodes: dict[str, JsonObject] = {}
        self._slices: dict[str, JsonObject] = {}
        self._events: dict[tuple[str, str], JsonObject] = {}
        self._watchers: list[_Watcher] = []
        self._version = 0
        self._history: list[_Change] = []
        #: a watch from a resourceVersion below this is Gone
        self._compacted = 0

    # -- test hooks --------------------------------------------------------------------------------

    def add_claim(self, obj: JsonObject) -> JsonObject:
        """Store (or replace) a ResourceClaim as the API server would; returns the stored copy."""
        stored = self._admit(obj, RESOURCE_API, "ResourceClaim")
        old = self._claims.get(_namespaced_key(stored))
        self._claims[_namespaced_key(stored)] = stored
        self._notify(old, stored, "ResourceClaim")
        return copy.deepcopy(stored)

    def add_pod(self, obj: JsonObject) -> JsonObject:
        """Store (or replace) a Pod; its watchers hear of it."""
        stored = self._admit(obj, "v1", "Pod")
        old = self._pods.get(_namespaced_key(stored))
        self._pods[_namespaced_key(stored)] = stored
        self._notify(old, stored, "Pod")
        return copy.deepcopy(stored)

    def remove_pod(self, namespace: str, name: str) -> None:
        old = self._pods.pop((namespace, name), None)
        if old is not None:
            self._bump(old)
            self._notify(old, None, "Pod")

    def compact(self) -> None:
        """Forget the history: a watch from any resourceVersion before now is Gone (410)."""
        self._history.clear()
        self._compacted = self._version

    def add_node(self, obj: JsonObject) -> JsonObject:
        stored = self._admit(obj, "v1", "Node")
        self._nodes[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def remove_claim(self, namespace: str, name: str) -> None:
        old = self._claims.pop((namespace, name), None)
        if old is not None:
            self._bump(old)
            self._notify(old, None, "ResourceClaim")

    def slices(self) -> list[JsonObject]:
        """Every stored slice, whatever its driver or node (what an admin would see)."""
        return [copy.deepcopy(s) for _, s in sorted(self._slices.items())]

    def events(self, namespace: str | None = None) -> list[JsonObject]:
        """The Events written (in `namespace`; None: every namespace), oldest first."""
        return [
            copy.deepcopy(e) for (ns, _), e in self._events.items() if namespace is None or ns == namespace
        ]

    def delete_event(self, namespace: str, name: str) -> None:
        """An Event gone (deleted, or expired after the server's TTL)."""
        self._events.pop((namespace, name), None)

    def fail_next(self, method: str, error: KubeError) -> None:
        """The next call of `method` raises `error` (queued: call again to fail several in a row)."""
        self._failures[method].append(error)

    def end_watches(self, error: KubeError | None = None) -> None:
        """Break every open watch: its iterator raises `error`, or simply ends when None."""
        for watcher in self._watchers:
            if error is not None:
                watcher.send.send_nowait(error)
            watcher.send.close()
        self._watchers.clear()

    # -- KubeApi -----------------------------------------------------------------------------------

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        await self._enter("get_resource_claim")
        return copy.deepcopy(_found(self._claims.get((namespace, name)), "resourceclaims", name))

    async def patch_resource_claim_metadata(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> JsonObject:
        await self._enter("patch_resource_claim_metadata")
        claim = _found(self._claims.get((namespace, name)), "resourceclaims", name)
        meta = claim["metadata"]
        if meta["uid"] != uid:
            raise Conflict(f'ResourceClaim "{name}" is invalid: metadata.uid: {uid}: field is immutable', 422)
        patched = {
            field: _merged(meta.get(field, {}), changes or {})
            for field, changes in (("annotations", annotations), ("labels", labels))
        }
        if any(patched[field] != meta.get(field, {}) for field in patched):
            # a patch that changes nothing is no new version
            old = copy.deepcopy(claim)
            for field, values in patched.items():
                meta[field] = values
                if not values:
                    del meta[field]
            self._bump(claim)
            self._notify(old, claim, "ResourceClaim")
        return copy.deepcopy(claim)

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        await self._enter("get_pod")
        return copy.deepcopy(_found(self._pods.get((namespace, name)), "pods", name))

    async def list_node_pods(self, *, node_name: str) -> Listing:
        await self._enter("list_node_pods")
        matches = _pod_filter(node_name)
        pods = [copy.deepcopy(p) for _, p in sorted(self._pods.items()) if matches(p)]
        return Listing(pods, str(self._version))

    @asynccontextmanager
    async def watch_node_pods(self, *, node_name: str, resource_version: str) -> AsyncIterator[ChannelEvents]:
        await self._enter("watch_node_pods")
        async with self._watch("Pod", _pod_filter(node_name), resource_version) as events:
            yield events

    async def get_node(self, name: str) -> JsonObject:
        await self._enter("get_node")
        return copy.deepcopy(_found(self._nodes.get(name), "nodes", name))

    async def list_resource_slices(self, *, driver: str, node_name: str) -> list[JsonObject]:
        await self._enter("list_resource_slices")
        matches = _slice_filter(driver, node_name)
        return [s for s in self.slices() if matches(s)]

    async def apply_resource_slice(self, body: JsonObject, *, field_manager: str) -> JsonObject:
        """Create, or replace the spec and the metadata fields given (one manager owns the slice).
        As on a real server, an apply that changes nothing changes no resourceVersion and no watcher
        hears of it, so a publisher that re-applies on every event does not loop."""
        await self._enter("apply_resource_slice")
        given = {k: v for k, v in body["metadata"].items() if k not in _SYSTEM_METADATA}
        name = given["name"]
        old = self._slices.get(name)
        if old is None:
            new = self._admit({**body, "metadata": given}, RESOURCE_API, "ResourceSlice")
            new["metadata"]["generation"] = 1
        else:
            new = copy.deepcopy(old)
            new["metadata"].update(copy.deepcopy(given))
            new["spec"] = copy.deepcopy(body.get("spec", {}))
            if new["spec"] != old.get("spec"):
                new["metadata"]["generation"] += 1
        new["metadata"]["managedFields"] = [
            {"manager": field_manager, "operation": "Apply", "apiVersion": RESOURCE_API}
        ]
        if new == old:
            return copy.deepcopy(old)
        if old is not None:
            self._bump(new)
        self._slices[name] = new
        self._notify(old, new, "ResourceSlice")
        return copy.deepcopy(new)

    async def delete_resource_slice(self, name: str) -> None:
        """Also the hook a test uses to play kubelet deleting a slice (it counts as a call)."""
        await self._enter("delete_resource_slice")
        old = self._slices.pop(name, None)
        if old is not None:
            self._bump(old)
            self._notify(old, None, "ResourceSlice")

    @asynccontextmanager
    async def watch_resource_slices(self, *, driver: str, node_name: str) -> AsyncIterator[ChannelEvents]:
        await self._enter("watch_resource_slices")
        async with self._watch("ResourceSlice", _slice_filter(driver, node_name)) as events:
            yield events

    async def list_resource_claims(self, *, labels: Mapping[str, str] | None = None) -> Listing:
        await self._enter("list_resource_claims")
        wanted = _label_filter(labels)
        claims = [copy.deepcopy(c) for _, c in sorted(self._claims.items()) if wanted(c)]
        return Listing(claims, str(self._version))

    @asynccontextmanager
    async def watch_resource_claims(
        self, *, resource_version: str, labels: Mapping[str, str] | None = None
    ) -> AsyncIterator[ChannelEvents]:
        await self._enter("watch_resource_claims")
        async with self._watch("ResourceClaim", _label_filter(labels), resource_version) as events:
            yield events

    async def create_event(self, namespace: str, body: JsonObject) -> JsonObject:
        await self._enter("create_event")
        name = body["metadata"]["name"]
        if (namespace, name) in self._events:
            raise Conflict(f'events "{name}" already exists', 409)
        if body["metadata"].get("namespace", namespace) != namespace:
            raise KubeError("the namespace of the provided object does not match the namespace sent", 400)
        metadata = {**body["metadata"], "namespace": namespace}
        stored = self._admit({**body, "metadata": metadata}, "v1", "Event")
        self._events[(namespace, name)] = stored
        return copy.deepcopy(stored)

    async def patch_event(self, namespace: str, name: str, changes: Mapping[str, Any]) -> JsonObject:
        await self._enter("patch_event")
        event = _found(self._events.get((namespace, name)), "events", name)
        event.update(copy.deepcopy(dict(changes)))
        self._bump(event)
        return copy.deepcopy(event)

    # -- internals ---------------------------------------------------------------------------------

    @asynccontextmanager
    async def _watch(
        self, kind: str, wanted: Callable[[JsonObject], bool], resource_version: str | None = None
    ) -> AsyncIterator[ChannelEvents]:
        """Events of `kind` objects that `wanted` accepts, after `resource_version` (None: from now)
        until the caller leaves. A version older than the history is Gone, raised from the iterator
        as the API server sends it: an ERROR event on an accepted watch."""
        send, receive = trio.open_memory_channel[WatchItem](math.inf)
        watcher = _Watcher(kind, wanted, send)
        if resource_version == "":  # the streaming list
            for _, obj in sorted(self._stored(kind).items()):
                if wanted(obj):
                    send.send_nowait(WatchEvent(WatchEventType.ADDED, copy.deepcopy(obj)))
            end = {"kind": kind, "metadata": {"resourceVersion": str(self._version)}}
            end["metadata"]["annotations"] = {INITIAL_EVENTS_END: "true"}
            send.send_nowait(WatchEvent(WatchEventType.BOOKMARK, end))
            resource_version = str(self._version)
        since = None if resource_version is None else int(resource_version)
        if since is not None and since < self._compacted:
            send.send_nowait(Gone(f"too old resource version: {since} ({self._compacted})", 410))
        else:
            if since is not None:
                for change in self._history:
                    if change.version > since and change.kind == kind:
                        self._tell(watcher, change.old, change.new)
            self._watchers.append(watcher)
        try:
            with receive:
                yield ChannelEvents(receive)
        finally:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
            send.close()

    def _stored(self, kind: str) -> dict[tuple[str, str], JsonObject]:
        """The objects of a kind a watch may stream."""
        return {"Pod": self._pods, "ResourceClaim": self._claims}[kind]

    async def _enter(self, method: str) -> None:
        """Count the call, yield to the scheduler as real I/O would, and raise an injected failure."""
        self.calls[method] += 1
        await trio.lowlevel.checkpoint()
        if self._failures[method]:
            raise self._failures[method].popleft()

    def _admit(self, obj: JsonObject, api_version: str, kind: str) -> JsonObject:
        """A copy with what the server fills in on create (a given uid is kept so tests control it)."""
        stored = copy.deepcopy(obj)
        stored.setdefault("apiVersion", api_version)
        stored.setdefault("kind", kind)
        meta = stored.setdefault("metadata", {})
        if kind not in ("Node", "ResourceSlice"):
            meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._bump(stored)
        return stored

    def _bump(self, obj: JsonObject) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)

    def _notify(self, old: JsonObject | None, new: JsonObject | None, kind: str) -> None:
        """Record the change and tell each watcher of `kind` what it sees."""
        old, new = copy.deepcopy(old), copy.deepcopy(new)
        self._history.append(_Change(self._version, kind, old, new))
        for watcher in self._watchers:
            if watcher.kind == kind:
                self._tell(watcher, old, new)

    @staticmethod
    def _tell(watcher: _Watcher, old: JsonObject | None, new: JsonObject | None) -> None:
        """An object entering the watcher's selector is ADDED, leaving it DELETED."""
        was = old is not None and watcher.matches(old)
        now = new is not None and watcher.matches(new)
        if was and now:
            event = WatchEvent(WatchEventType.MODIFIED, copy.deepcopy(new))
        elif now:
            event = WatchEvent(WatchEventType.ADDED, copy.deepcopy(new))
        elif was:
            event = WatchEvent(WatchEventType.DELETED, copy.deepcopy(new if new is not None else old))
        else:
            return
        watcher.send.send_nowait(event)


def _namespaced_key(obj: JsonObject) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _found(obj: JsonObject | None, resource: str, name: str) -> JsonObject:
    if obj is None:
        raise NotFound(f'{resource} "{name}" not found', 404)
    return obj


def _merged(current: Mapping[str, str], changes: Mapping[str, str | None]) -> dict[str, str]:
    """A merge patch of one string map: None removes a key."""
    merged = dict(current)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _label_filter(labels: Mapping[str, str] | None) -> Callable[[JsonObject], bool]:
    """An equality label selector: the object carries every one of `labels` (None: any object)."""
    wanted = dict(labels or {}).items()

    def matches(obj: JsonObject) -> bool:
        return wanted <= (obj.get("metadata", {}).get("labels") or {}).items()

    return matches


def _pod_filter(node_name: str) -> Callable[[JsonObject], bool]:
    def matches(obj: JsonObject) -> bool:
        return obj.get("spec", {}).get("nodeName") == node_name

    return matches


def _slice_filter(driver: str, node_name: str) -> Callable[[JsonObject], bool]:
    def matches(obj: JsonObject) -> bool:
        spec = obj.get("spec", {})
        return spec.get("driver") == driver and spec.get("nodeName") == node_name

    return matches

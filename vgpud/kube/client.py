"""KubeClient: KubeApi over vgpud's own small REST client (vgpud.kube.rest, urllib3; DESIGN §2 and
docs/decisions.md for why not the official client).

The HTTP calls are blocking, so every call runs in a worker thread under this client's own
CapacityLimiter (it never competes with other to_thread users). Objects stay the API server's JSON
(camelCase dicts). A watch holds one thread for its lifetime; leaving its context manager stops it
with a socket shutdown, so the thread ends at once.

Lists come in pages of `list_page_size` objects (`limit` and `continue`, as client-go's pager): the
server never builds one answer of every object, and neither does this client hold two copies of one.
A continue token the server has compacted away (410 Expired between two pages) falls back to one
complete list, as client-go's pager does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, closing, suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

import trio
import urllib3

from vgpud.kube import config as kubeconfig_
from vgpud.kube import rest
from vgpud.kube._channel import ChannelEvents, WatchItem
from vgpud.kube.api import (
    RESOURCE_API,
    Gone,
    JsonObject,
    KubeError,
    Listing,
    NotFound,
    WatchEvent,
    WatchEventType,
)
from vgpud.kube.config import ApiConfig
from vgpud.kube.rest import CALL_TIMEOUT_S, Query

#: objects per page of a list (client-go's pager default)
LIST_PAGE_SIZE = 500

log = logging.getLogger("vgpud.kube")

#: a watch ends after this long (server-side timeoutSeconds) and the caller lists and re-watches,
#: as client-go's reflector does; it also bounds how stale a watch's view can get
WATCH_TIMEOUT_S = 300

_MERGE_PATCH = "application/merge-patch+json"
_APPLY_PATCH = "application/apply-patch+yaml"  # a JSON body is valid YAML
_CORE = "/api/v1"
_RESOURCE = f"/apis/{RESOURCE_API}"


class KubeClient:
    """KubeApi against a real API server."""

    def __init__(
        self, config: ApiConfig, *, max_threads: int = 8, list_page_size: int = LIST_PAGE_SIZE
    ) -> None:
        if list_page_size < 1:
            raise ValueError(f"list_page_size must be >= 1, got {list_page_size}")
        self._rest = rest.Rest(config, maxsize=max_threads)
        self._limiter = trio.CapacityLimiter(max_threads)
        self._page_size = list_page_size

    @classmethod
    def from_config(cls, kubeconfig: Path | None = None) -> KubeClient:
        """In-cluster config when running in a pod, else `kubeconfig` (or $KUBECONFIG, ~/.kube/config)."""
        tried: list[str] = []
        if kubeconfig is None:
            try:
                return cls(kubeconfig_.in_cluster())
            except KubeError as e:
                tried.append(f"in-cluster config ({e})")
        path = kubeconfig or Path(os.path.expanduser(os.environ.get("KUBECONFIG") or "~/.kube/config"))
        if os.pathsep in str(path):
            tried.append(f"kubeconfig {path} (a list of files, which vgpud does not merge: name one)")
            raise KubeError("no Kubernetes API configuration: tried " + "; ".join(tried))
        try:
            return cls(kubeconfig_.from_kubeconfig(path))
        except KubeError as e:
            tried.append(f"kubeconfig {path} ({e})")
            raise KubeError("no Kubernetes API configuration: tried " + "; ".join(tried)) from e

    def close(self) -> None:
        self._rest.close()

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        return await self._call("GET", _path(_RESOURCE, "namespaces", namespace, "resourceclaims", name))

    async def patch_resource_claim_metadata(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> JsonObject:
        # metadata.uid in a merge patch is a precondition, checked atomically with the write: a claim
        # deleted and re-created under the same name fails it (422 on metadata.uid -> Conflict).
        metadata: JsonObject = {"uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        if labels:
            metadata["labels"] = dict(labels)
        body = {"metadata": metadata}
        path = _path(_RESOURCE, "namespaces", namespace, "resourceclaims", name)
        return await self._call("PATCH", path, body=body, content_type=_MERGE_PATCH)

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        return await self._call("GET", _path(_CORE, "namespaces", namespace, "pods", name))

    async def list_node_pods(self, *, node_name: str) -> Listing:
        listed = await self._list(f"{_CORE}/pods", {"fieldSelector": _pod_selector(node_name)})
        return _listing(listed, "v1", "Pod")

    def watch_node_pods(
        self, *, node_name: str, resource_version: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(f"{_CORE}/pods", _pod_selector(node_name), resource_version, bookmarks=True)

    async def get_node(self, name: str) -> JsonObject:
        return await self._call("GET", _path(_CORE, "nodes", name))

    async def list_resource_slices(self, *, driver: str, node_name: str) -> list[JsonObject]:
        query = {"fieldSelector": _slice_selector(driver, node_name)}
        listed = await self._list(f"{_RESOURCE}/resourceslices", query)
        return [_with_kind(item) for item in listed.get("items") or []]

    async def apply_resource_slice(self, body: JsonObject, *, field_manager: str) -> JsonObject:
        """Server-side apply (force); the server creates the slice when it does not exist."""
        body = {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", **body}
        path = _path(_RESOURCE, "resourceslices", body["metadata"]["name"])
        query = {"fieldManager": field_manager, "force": True}
        return await self._call("PATCH", path, query, body=body, content_type=_APPLY_PATCH)

    async def delete_resource_slice(self, name: str) -> None:
        with suppress(NotFound):
            await self._call("DELETE", _path(_RESOURCE, "resourceslices", name))

    def watch_resource_slices(
        self, *, driver: str, node_name: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Events after the moment of entry: it lists to learn the current resourceVersion and watches
        from there (a watch without one would first replay every slice as ADDED), and returns only once
        the server has accepted the watch, so a change made after entry is always seen."""
        return self._watch(f"{_RESOURCE}/resourceslices", _slice_selector(driver, node_name))

    async def list_resource_claims(self, *, labels: Mapping[str, str] | None = None) -> Listing:
        query = {"labelSelector": _label_selector(labels)} if labels else None
        listed = await self._list(f"{_RESOURCE}/resourceclaims", query)
        return _listing(listed, RESOURCE_API, "ResourceClaim")

    def watch_resource_claims(
        self, *, resource_version: str, labels: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        path = f"{_RESOURCE}/resourceclaims"
        return self._watch(path, "", resource_version, bookmarks=True, labels=_label_selector(labels))

    async def create_event(self, namespace: str, body: JsonObject) -> JsonObject:
        return await self._call("POST", _path(_CORE, "namespaces", namespace, "events"), body=body)

    async def patch_event(self, namespace: str, name: str, changes: Mapping[str, Any]) -> JsonObject:
        path = _path(_CORE, "namespaces", namespace, "events", name)
        return await self._call("PATCH", path, body=dict(changes), content_type=_MERGE_PATCH)

    @asynccontextmanager
    async def _watch(
        self,
        path: str,
        selector: str,
        resource_version: str | None = None,
        *,
        bookmarks: bool = False,
        labels: str = "",
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """A watch from `resource_version`, or (None) from now: then a one-item list learns the
        current version first. With `bookmarks`, the server's BOOKMARK events come through too.
        `selector` and `labels`: the field and label selectors ("" for none)."""
        query: dict[str, str | int | bool] = {"fieldSelector": selector} if selector else {}
        if labels:
            query["labelSelector"] = labels
        if bookmarks:
            query["allowWatchBookmarks"] = True
        if resource_version == "":  # the streaming list: the current objects first, then the changes
            query |= {
                "sendInitialEvents": True,
                "resourceVersionMatch": "NotOlderThan",
                "allowWatchBookmarks": True,
            }
            bookmarks = True
        else:
            if resource_version is None:
                listed = await self._call("GET", path, {**query, "limit": 1})
                resource_version = listed["metadata"]["resourceVersion"]
            query["resourceVersion"] = resource_version
        query["timeoutSeconds"] = WATCH_TIMEOUT_S
        stream = _Watch(self._rest, path, query, bookmarks=bookmarks)
        send, receive = trio.open_memory_channel[WatchItem](0)
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(stream.run, send)
                with receive:
                    yield ChannelEvents(receive)
            except BaseException as e:
                # Held until the thread has ended (the nursery waits for it instead of abandoning it),
                # and raised as it was, not wrapped in the nursery's ExceptionGroup: `except KubeError`
                # around a watch works as with FakeKube.
                error = e
            finally:
                stream.stop()
        if error is not None:
            raise error

    async def _list(self, path: str, query: Query | None = None) -> JsonObject:
        """Every object of a list, page by page; one list object (`items`, `metadata.resourceVersion`:
        the pages' common snapshot). A continue token gone stale mid-list: one complete list instead."""
        items: list[JsonObject] = []
        token = ""
        while True:
            page_query = {**(query or {}), "limit": self._page_size, **({"continue": token} if token else {})}
            try:
                page = await self._call("GET", path, page_query)
            except Gone as err:
                if not token:
                    raise
                log.info("list %s: %s after %d objects; listing it whole", path, err, len(items))
                return await self._call("GET", path, query)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            token = metadata.get("continue") or ""
            if not token:
                return {"items": items, "metadata": {"resourceVersion": metadata.get("resourceVersion", "")}}

    async def _call(
        self, method: str, path: str, query: Query | None = None, *, body: JsonObject | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:  # fmt: skip
        """Run one API call in a worker thread; the decoded JSON body, or a KubeError."""

        def blocking() -> JsonObject:
            return self._rest.call(method, path, query, body, content_type)

        return await trio.to_thread.run_sync(blocking, limiter=self._limiter, abandon_on_cancel=True)


class _Watch:
    """One watch stream in one thread, feeding a Trio channel until stopped, ended or broken."""

    def __init__(self, http: rest.Rest, path: str, query: Query, *, bookmarks: bool) -> None:
        self._rest = http
        self._path = path
        self._query = query
        #: pass BOOKMARK events on (the watch asked for them); otherwise skip any a server sends
        self._bookmarks = bookmarks
        self._lock = threading.Lock()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._stopped = False

    async def run(self, send: trio.MemorySendChannel[WatchItem], task_status: trio.TaskStatus[None]) -> None:
        """Started once the server accepted the watch (an error before that is raised to the opener);
        a later stream error goes to the reader as KubeError. Leaving, cancelled too, stops the thread."""
        accepted = False

        def started() -> None:
            nonlocal accepted
            task_status.started()
            accepted = True

        try:
            async with send:
                try:
                    await trio.to_thread.run_sync(
                        self._pump,
                        send,
                        lambda: trio.from_thread.run_sync(started),
                        # one thread per watch, for as long as it lasts: its own limiter, not the calls'
                        limiter=trio.CapacityLimiter(1),
                        abandon_on_cancel=True,
                    )
                except KubeError as e:
                    if not accepted:
                        raise
                    if not self._stopped:
                        with suppress(trio.BrokenResourceError):
                            await send.send(e)
        finally:
            self.stop()

    def stop(self) -> None:
        """Callable from Trio: ends the thread's blocking read now."""
        with self._lock:
            self._stopped = True
            response = self._response
        if response is not None:
            rest.shutdown(response)

    def _open(self, started: Callable[[], None]) -> urllib3.BaseHTTPResponse:
        """With headers back, the server has accepted the watch."""
        # quiet is normal, but not longer than the server's own timeout: then the link is dead
        read_timeout = float(WATCH_TIMEOUT_S) + CALL_TIMEOUT_S
        response = self._rest.open_watch(self._path, self._query, read_timeout=read_timeout)
        with self._lock:
            self._response = response
            stopped = self._stopped
        if stopped:  # cancelled while connecting: nobody waits for the start any more
            rest.shutdown(response)
        else:
            started()
        return response

    def _pump(self, send: trio.MemorySendChannel[WatchItem], started: Callable[[], None]) -> None:
        response = self._open(started)
        with closing(response), closing(self._events(response)) as events:
            for raw in events:
                kind = raw.get("type")
                if kind not in WatchEventType.__members__ or (kind == "BOOKMARK" and not self._bookmarks):
                    continue  # a bookmark nobody asked for, and whatever a newer server adds
                event = WatchEvent(WatchEventType(raw["type"]), raw["object"])
                try:
                    trio.from_thread.run(send.send, event)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.RunFinishedError):
                    return  # the reader left

    def _events(self, response: urllib3.BaseHTTPResponse) -> Iterator[JsonObject]:
        try:
            yield from rest.watch_events(response, f"watch {self._path}")
        except Exception:
            if self._stopped:
                return  # the socket shutdown that stop() did, seen from the reading side
            raise


def _path(*parts: str) -> str:
    """An API path; the caller's names are quoted as path segments."""
    prefix, *names = parts
    return "/".join([prefix, *(quote(name, safe="") for name in names)])


def _slice_selector(driver: str, node_name: str) -> str:
    return f"spec.driver={driver},spec.nodeName={node_name}"


def _label_selector(labels: Mapping[str, str] | None) -> str:
    """Equality terms `key=value`, comma-joined: objects that carry every one ("" for None)."""
    return ",".join(f"{key}={value}" for key, value in sorted((labels or {}).items()))


def _pod_selector(node_name: str) -> str:
    return f"spec.nodeName={node_name}"


def _listing(listed: JsonObject, api_version: str, kind: str) -> Listing:
    """List items come without apiVersion/kind: add them, so a listed object looks like a fetched one."""
    items = [{"apiVersion": api_version, "kind": kind, **item} for item in listed.get("items") or []]
    return Listing(items, listed["metadata"]["resourceVersion"])


def _with_kind(item: JsonObject) -> JsonObject:
    """List items come without apiVersion/kind; add them so a listed slice looks like a fetched one."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", **item}

"""What the webhook reads from the API server: the claims and claim templates a pod names, and the pods
of a namespace that can matter to a review. A Protocol, so unit tests hand in a dict-backed fake;
`KubeLookup` is the real one.

Pods come from the pod cache (vgpud.webhook.podcache) while it is current: only those that name the
claims under review or that they are reserved for. Otherwise (the webhook just started, or its watch is
reconnecting) `cached_pods` answers None and the review lists its namespace, in pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol
from urllib.parse import quote

from vgpud.kube.api import RESOURCE_API, JsonObject, Listing, WatchEvent
from vgpud.kube.client import KubeClient, _listing
from vgpud.kube.config import ApiConfig
from vgpud.webhook.podcache import PodCache

_PODS = "/api/v1/pods"


class Lookup(Protocol):
    """Trio coroutines; NotFound (vgpud.kube.api) for a missing object, KubeError for any other failure."""

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject: ...

    async def get_resource_claim_template(self, namespace: str, name: str) -> JsonObject: ...

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        """Every pod of the namespace."""
        ...

    async def list_pods_named(self, namespace: str, name: str) -> list[JsonObject]:
        """The pod of that name, if any (a list of one or none: the webhook may list pods, not get
        them): a pod the cache may not have seen yet, read from the API server."""
        ...

    def cached_pods(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject] | None:
        """The pods of the namespace that name one of `claim_names` or are reserved (`reserved_uids`),
        in the list's order (`podcache.select_pods`); None while there is no current cache to read."""
        ...


class KubeLookup(KubeClient):
    """The node daemon's client (worker threads, raw JSON dicts, errors translated), plus the reads
    only the webhook needs, and its pod cache (`pod_cache`, run by the webhook as a component)."""

    def __init__(self, config: ApiConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.pod_cache = PodCache(self)

    async def get_resource_claim_template(self, namespace: str, name: str) -> JsonObject:
        path = f"/apis/{RESOURCE_API}/namespaces/{quote(namespace, safe='')}/resourceclaimtemplates/"
        return await self._call("GET", path + quote(name, safe=""))

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        listed = await self._list(_namespace_pods(namespace))
        return listed["items"]  # as returned: the Admitter checks its type

    async def list_pods_named(self, namespace: str, name: str) -> list[JsonObject]:
        # a field selector on metadata.name is served as a read of one key, not a scan of the namespace
        query = {"fieldSelector": f"metadata.name={_selector_value(name)}"}
        listed = await self._call("GET", _namespace_pods(namespace), query)
        items = listed.get("items")
        return [] if items is None else items  # as returned: the Admitter checks its type

    def cached_pods(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject] | None:
        return self.pod_cache.read(namespace, claim_names, reserved_uids)

    async def list_all_pods(self) -> Listing:
        """Every pod of the cluster, in pages (the pod cache's list, where there is no streaming one)."""
        return _listing(await self._list(_PODS), "v1", "Pod")

    def watch_all_pods(self, resource_version: str) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """The pod cache's watch, with bookmarks; from version "" it is the streaming list."""
        return self._watch(_PODS, "", resource_version, bookmarks=True)


def _namespace_pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"


def _selector_value(value: str) -> str:
    """A field selector's value, escaped as apimachinery's fields.EscapeValue does."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")

"""What the webhook reads from the API server: the claims and claim templates a pod names, and the pods
of a namespace. A Protocol, so unit tests hand in a dict-backed fake; `KubeLookup` is the real one."""

from __future__ import annotations

from typing import Protocol
from urllib.parse import quote

from vgpud.kube.api import RESOURCE_API, JsonObject
from vgpud.kube.client import KubeClient


class Lookup(Protocol):
    """Trio coroutines; NotFound (vgpud.kube.api) for a missing object, KubeError for any other failure."""

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject: ...

    async def get_resource_claim_template(self, namespace: str, name: str) -> JsonObject: ...

    async def list_pods(self, namespace: str) -> list[JsonObject]: ...


class KubeLookup(KubeClient):
    """The node daemon's client (worker threads, raw JSON dicts, errors translated), plus the two reads
    only the webhook needs."""

    async def get_resource_claim_template(self, namespace: str, name: str) -> JsonObject:
        path = f"/apis/{RESOURCE_API}/namespaces/{quote(namespace, safe='')}/resourceclaimtemplates/"
        return await self._call("GET", path + quote(name, safe=""))

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        listed = await self._call("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods")
        items = listed.get("items")
        return [] if items is None else items  # as returned: the Admitter checks its type

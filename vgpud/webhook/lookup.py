"""What the webhook reads from the API server: the claims and claim templates a pod names, and the pods
of a namespace. A Protocol, so unit tests hand in a dict-backed fake; `KubeLookup` is the real one."""

from __future__ import annotations

from typing import Protocol

from vgpud.kube.api import JsonObject
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
        return await self._call(self._resource.read_namespaced_resource_claim_template, name, namespace)

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        listed = await self._call(self._core.list_namespaced_pod, namespace)
        items = listed.get("items")
        return [] if items is None else items  # as returned: the Admitter checks its type

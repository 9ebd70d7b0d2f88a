"""The `world` fixture: one KubeApi implementation plus a way to create what other actors would
(users create claims and pods, the cluster has nodes), so one contract suite runs against each."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import pytest
import trio

from tests.kubeapi import ApiServer, api_request
from vgpud.kube.api import RESOURCE_API, JsonObject, KubeApi
from vgpud.kube.client import KubeClient
from vgpud.kube.fake import FakeKube


class Seeder(Protocol):
    async def claim(self, body: JsonObject) -> JsonObject: ...
    async def pod(self, body: JsonObject) -> JsonObject: ...
    async def node(self, body: JsonObject) -> JsonObject: ...
    async def events(self, namespace: str) -> list[JsonObject]:
        """The Events of a namespace, as `kubectl get events` reads them."""
        ...


@dataclass
class Names:
    """Names no other test uses (tests share one API server)."""

    namespace: str
    node_name: str
    driver: str
    tag: str

    @classmethod
    def unique(cls) -> Names:
        tag = uuid.uuid4().hex[:8]
        return cls(f"ns-{tag}", f"node-{tag}", f"{tag}.vgpu.test", tag)


@dataclass
class World(Names):
    """The implementation under test and a seeder for what other actors create."""

    kube: KubeApi
    seed: Seeder


class FakeSeeder:
    def __init__(self, fake: FakeKube) -> None:
        self._fake = fake

    async def claim(self, body: JsonObject) -> JsonObject:
        return self._fake.add_claim(body)

    async def pod(self, body: JsonObject) -> JsonObject:
        return self._fake.add_pod(body)

    async def node(self, body: JsonObject) -> JsonObject:
        return self._fake.add_node(body)

    async def events(self, namespace: str) -> list[JsonObject]:
        return self._fake.events(namespace)


class ApiSeeder:
    """Creates objects with plain admin requests, independent of the client under test."""

    def __init__(self, server: ApiServer) -> None:
        self._server = server

    async def _post(self, path: str, body: JsonObject) -> JsonObject:
        return await trio.to_thread.run_sync(partial(api_request, self._server, "POST", path, body))

    async def claim(self, body: JsonObject) -> JsonObject:
        namespace = body["metadata"]["namespace"]
        return await self._post(f"/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaims", body)

    async def pod(self, body: JsonObject) -> JsonObject:
        return await self._post(f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", body)

    async def node(self, body: JsonObject) -> JsonObject:
        return await self._post("/api/v1/nodes", body)

    async def events(self, namespace: str) -> list[JsonObject]:
        path = f"/api/v1/namespaces/{namespace}/events"
        return (await trio.to_thread.run_sync(api_request, self._server, "GET", path))["items"]

    async def namespace(self, name: str) -> None:
        await self._post("/api/v1/namespaces", {"metadata": {"name": name}})


@pytest.fixture(params=["fake", "apiserver"])
def apiserver(request: pytest.FixtureRequest) -> ApiServer | None:
    """None for the fake; the session's real server otherwise (resolved here, outside Trio, so a
    missing server skips or fails with its own message)."""
    return None if request.param == "fake" else request.getfixturevalue("kube_apiserver")


@pytest.fixture
async def world(apiserver: ApiServer | None) -> AsyncIterator[World]:
    names = vars(Names.unique())
    if apiserver is None:
        fake = FakeKube()
        yield World(**names, kube=fake, seed=FakeSeeder(fake))
        return
    seeder = ApiSeeder(apiserver)
    await seeder.namespace(names["namespace"])
    client = KubeClient.from_config(apiserver.kubeconfig)
    try:
        yield World(**names, kube=client, seed=seeder)
    finally:
        client.close()

"""KubeClient at scale, against the real API server: a list in pages is the whole list."""

from __future__ import annotations

from typing import Any

import trio

from tests.kubeapi import ApiServer, api_request
from tests.unit.kube.conftest import ApiSeeder
from vgpud.kube import config as kubeconfig
from vgpud.kube.api import RESOURCE_API
from vgpud.kube.client import KubeClient


def claim(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"devices": {"requests": []}},
    }


def counting(client: KubeClient) -> list[dict[str, Any]]:
    """The queries of every GET the client sends (the real calls, recorded on the way)."""
    sent: list[dict[str, Any]] = []
    call = client._rest.call

    def recorded(method: str, path: str, query: Any = None, *args: Any) -> Any:
        if method == "GET":
            sent.append(dict(query or {}))
        return call(method, path, query, *args)

    client._rest.call = recorded  # type: ignore[method-assign]
    return sent


async def seeded(server: ApiServer, namespace: str, count: int) -> list[str]:
    seeder = ApiSeeder(server)
    await seeder.namespace(namespace)
    names = [f"c{i}" for i in range(count)]
    for name in names:
        await seeder.claim(claim(namespace, name))
    return names


def ours(listing: Any, namespace: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in listing.items if c["metadata"]["namespace"] == namespace)


async def test_a_list_in_pages_is_the_whole_list(kube_apiserver: ApiServer) -> None:
    names = await seeded(kube_apiserver, "paged", 5)
    client = KubeClient(kubeconfig.from_kubeconfig(kube_apiserver.kubeconfig), list_page_size=2)
    sent = counting(client)
    try:
        listing = await client.list_resource_claims()
    finally:
        client.close()
    assert ours(listing, "paged") == names
    assert len(sent) >= 3 and all(query["limit"] == 2 for query in sent)
    assert [bool(query.get("continue")) for query in sent] == [False] + [True] * (len(sent) - 1)
    whole = await trio.to_thread.run_sync(
        api_request, kube_apiserver, "GET", f"/apis/{RESOURCE_API}/resourceclaims"
    )
    assert listing.resource_version and len(listing.items) == len(whole["items"])

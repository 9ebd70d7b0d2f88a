"""KubeClient at scale, against the real API server: a list in pages is the whole list; a continue
token the server has compacted away (410 between two pages) ends in one whole list; the informer
streams its list where the server offers it and lists where it does not; a server that answers 429
(too many requests in flight) has its reads tried again after its Retry-After, and its writes'
refusals reach the caller as 429."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.kubeapi import INSTALL_HINT, ApiServer, api_request, apiserver_available, start_apiserver
from tests.support import require
from tests.unit.kube.conftest import ApiSeeder
from tests.unit.registry.world import run_cache
from vgpud.kube import config as kubeconfig
from vgpud.kube.api import RESOURCE_API, KubeError
from vgpud.kube.client import KubeClient
from vgpud.kube.informer import Informer, claim_informer


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


@pytest.fixture(scope="module")
def etcd_paged_apiserver() -> Iterator[ApiServer]:
    """A second server as older ones were: continue pages served from etcd (ListFromCacheSnapshot
    off: a compaction expires a list's continue token) and no streaming list (WatchList off)."""
    require(apiserver_available(), "etcd + kube-apiserver", INSTALL_HINT)
    workdir = Path(tempfile.mkdtemp(prefix="vgt", dir="/tmp"))
    server = start_apiserver(workdir, feature_gates=["ListFromCacheSnapshot=false", "WatchList=false"])
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def compact(server: ApiServer) -> None:
    """Compact etcd at its current revision: every older continue token is gone."""
    revision = _etcd(server, "/v3/kv/range", {"key": "AA==", "limit": 1})["header"]["revision"]
    _etcd(server, "/v3/kv/compaction", {"revision": revision, "physical": True})


def _etcd(server: ApiServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        server.etcd_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


async def test_a_continue_token_compacted_away_lists_whole(etcd_paged_apiserver: ApiServer) -> None:
    server = etcd_paged_apiserver
    names = await seeded(server, "compacted", 5)
    client = KubeClient(kubeconfig.from_kubeconfig(server.kubeconfig), list_page_size=2)
    sent = counting(client)
    call = client._rest.call
    seeder = ApiSeeder(server)

    def compact_after_the_first_page(method: str, path: str, query: Any = None, *args: Any) -> Any:
        answer = call(method, path, query, *args)
        if query and query.get("limit") and not query.get("continue"):
            trio.from_thread.run(seeder.claim, claim("compacted", "late"))  # the revision moves on
            compact(server)
        return answer

    client._rest.call = compact_after_the_first_page  # type: ignore[method-assign]
    try:
        listing = await client.list_resource_claims()
    finally:
        client.close()
    assert ours(listing, "compacted") == sorted([*names, "late"])  # the whole list, after the compaction
    assert [query.get("continue", "") != "" for query in sent] == [False, True, False]
    assert sent[-1] == {}  # the 410 on the second page: one whole, unpaginated list


async def informed(server: ApiServer) -> Informer:
    """A claim informer over `server`, run until its cache has listed and its watch is open."""
    client = KubeClient(kubeconfig.from_kubeconfig(server.kubeconfig), list_page_size=2)
    informer = claim_informer(client)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_cache, informer)
            nursery.cancel_scope.cancel()
    finally:
        client.close()
    return informer


async def test_the_informer_streams_its_list_where_the_server_offers_it(kube_apiserver: ApiServer) -> None:
    names = await seeded(kube_apiserver, "streamed", 3)
    informer = await informed(kube_apiserver)
    assert informer.stream_lists and informer.lists == 1
    assert all(informer.get("streamed", name) is not None for name in names)


async def test_the_informer_lists_where_the_server_has_no_streaming_list(
    etcd_paged_apiserver: ApiServer,
) -> None:
    names = await seeded(etcd_paged_apiserver, "listed", 3)
    informer = await informed(etcd_paged_apiserver)
    assert not informer.stream_lists and informer.lists == 1
    assert all(informer.get("listed", name) is not None for name in names)


@pytest.fixture(scope="module")
def throttling_apiserver() -> Iterator[ApiServer]:
    """A server that serves one read and one write at a time and answers the rest 429 with
    Retry-After: 1 (the in-flight limits without priority and fairness, as before APF)."""
    require(apiserver_available(), "etcd + kube-apiserver", INSTALL_HINT)
    workdir = Path(tempfile.mkdtemp(prefix="vgt", dir="/tmp"))
    flags = ["--enable-priority-and-fairness=false", "--max-requests-inflight=1"]
    server = start_apiserver(workdir, extra_args=[*flags, "--max-mutating-requests-inflight=1"])
    try:
        # the tests' client is "tester": the limits exempt system:masters, whom the seeder is
        binding = {
            "metadata": {"name": "testers-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "testers"}],
        }
        api_request(server, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


#: requests sent at once, and rounds of them at most, until the server has refused some
AT_ONCE, ROUNDS = 24, 10


def client_as_tester(server: ApiServer) -> KubeClient:
    assert server.tester_kubeconfig is not None
    return KubeClient(kubeconfig.from_kubeconfig(server.tester_kubeconfig), max_threads=AT_ONCE)


async def test_reads_refused_with_429_are_tried_again_after_retry_after(
    throttling_apiserver: ApiServer,
) -> None:
    names = await seeded(throttling_apiserver, "throttled", 3)
    client = client_as_tester(throttling_apiserver)
    answers: list[str] = []

    async def read(name: str) -> None:
        answers.append((await client.get_resource_claim("throttled", name))["metadata"]["name"])

    try:
        for _ in range(ROUNDS):
            async with trio.open_nursery() as nursery:
                for k in range(AT_ONCE):
                    nursery.start_soon(read, names[k % len(names)])
            if client._rest.throttled:
                break
    finally:
        client.close()
    assert client._rest.throttled > 0, f"the server refused none of {ROUNDS} x {AT_ONCE} reads"
    assert len(answers) % AT_ONCE == 0 and sorted(set(answers)) == names  # every read answered


async def test_writes_refused_with_429_reach_the_caller(throttling_apiserver: ApiServer) -> None:
    seeder = ApiSeeder(throttling_apiserver)
    await seeder.namespace("refused")
    uids = [(await seeder.claim(claim("refused", f"w{k}")))["metadata"]["uid"] for k in range(AT_ONCE)]
    client = client_as_tester(throttling_apiserver)
    refused: list[KubeError] = []

    async def write(k: int, round_: int) -> None:
        try:
            await client.patch_resource_claim_metadata(
                "refused", f"w{k}", uid=uids[k], labels={"r": str(round_)}
            )
        except KubeError as err:
            refused.append(err)

    try:
        for round_ in range(ROUNDS):
            async with trio.open_nursery() as nursery:
                for k in range(AT_ONCE):
                    nursery.start_soon(write, k, round_)
            if refused:
                break
    finally:
        client.close()
    assert refused, f"the server refused none of {ROUNDS} x {AT_ONCE} writes"
    assert {err.status for err in refused} == {429}, [str(err) for err in refused]
    assert client._rest.throttled == 0  # a write is never sent twice

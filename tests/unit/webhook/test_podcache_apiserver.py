"""The webhook's pod cache against a real API server: `KubeLookup`'s list and watch of every pod feed
it (a streaming list on current servers), and its index finds the pods that name a claim, by spec
and, once the claim is generated, by status; it follows a status change and a deletion."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from tests.kubeapi import ApiServer, api_request
from tests.unit.webhook.builders import run_informer
from vgpud.kube import config as kubeconfig
from vgpud.webhook.lookup import KubeLookup
from vgpud.webhook.podcache import PodCache

SETTLE_S = 30.0


def pod_body(name: str, claims: dict[str, str], templates: tuple[str, ...] = ()) -> dict[str, Any]:
    resource_claims = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    resource_claims += [{"name": k, "resourceClaimTemplateName": f"{k}-template"} for k in templates]
    refs = [{"name": entry["name"]} for entry in resource_claims]
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if refs:
        container["resources"] = {"claims": refs}
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"app": "x"}, "annotations": {"note": "y" * 500}},
        "spec": {"containers": [container]},
    }
    if resource_claims:
        body["spec"]["resourceClaims"] = resource_claims
    return body


async def call(server: ApiServer, method: str, path: str, body: Any = None, **kwargs: Any) -> dict[str, Any]:
    return await trio.to_thread.run_sync(partial(api_request, server, method, path, body, **kwargs))


async def until(cache: PodCache, key: tuple[str, str], check: Callable[[], bool]) -> None:
    """Until the cache has seen the change of the pod at `key` (its watch's delay)."""
    with trio.fail_after(SETTLE_S):
        while True:
            changed = trio.Event()
            cache.informer.subscribe(key, changed)
            if check():
                cache.informer.unsubscribe(key, changed)
                return
            await changed.wait()


def names(pods: list[dict[str, Any]]) -> list[str]:
    return [pod["metadata"]["name"] for pod in pods]


async def test_the_pod_cache_indexes_a_real_servers_pods_by_claim(kube_apiserver: ApiServer) -> None:
    ns = f"podcache-{uuid.uuid4().hex[:8]}"
    await call(kube_apiserver, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    pods = f"/api/v1/namespaces/{ns}/pods"
    shared = await call(kube_apiserver, "POST", pods, pod_body("b-shared", {"gpu": "shared-claim"}))
    await call(kube_apiserver, "POST", pods, pod_body("a-shared", {"gpu": "shared-claim", "n": "nic"}))
    await call(kube_apiserver, "POST", pods, pod_body("other", {"gpu": "other-claim"}))
    await call(kube_apiserver, "POST", pods, pod_body("plain", {}))
    templated = await call(kube_apiserver, "POST", pods, pod_body("templated", {}, ("t",)))

    lookup = KubeLookup(kubeconfig.from_kubeconfig(kube_apiserver.kubeconfig), list_page_size=2)
    cache: PodCache = lookup.pod_cache
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run_informer, cache)
            assert cache.current and cache.informer.stream_lists  # listed through its watch
            assert names(cache.read(ns, ["shared-claim"], []) or []) == ["a-shared", "b-shared"]
            stored = cache.informer.get(ns, "b-shared")
            assert stored is not None and "labels" not in stored["metadata"]  # trimmed
            assert stored["metadata"]["uid"] == shared["metadata"]["uid"]
            assert stored["spec"]["containers"] == [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}]}}
            ]
            assert names(cache.pods_for(ns, ["nic"], [templated["metadata"]["uid"]])) == [
                "a-shared",
                "templated",
            ]
            assert cache.pods_for(ns, ["generated"], []) == []
            assert cache.pods_for("elsewhere", ["shared-claim"], []) == []

            # the resource claim controller names the generated claim in the pod's status
            status = {"status": {"resourceClaimStatuses": [{"name": "t", "resourceClaimName": "generated"}]}}
            await call(
                kube_apiserver,
                "PATCH",
                f"{pods}/templated/status",
                status,
                content_type="application/merge-patch+json",
            )
            await until(
                cache,
                (ns, "templated"),
                lambda: names(cache.pods_for(ns, ["generated"], [])) == ["templated"],
            )

            await call(kube_apiserver, "DELETE", f"{pods}/b-shared", {"gracePeriodSeconds": 0})
            await until(
                cache,
                (ns, "b-shared"),
                lambda: names(cache.pods_for(ns, ["shared-claim"], [])) == ["a-shared"],
            )
            assert cache.informer.by_uid(shared["metadata"]["uid"]) is None
            # a new pod of the same name: another uid, found under the claims it names
            again = await call(kube_apiserver, "POST", pods, pod_body("b-shared", {"gpu": "other-claim"}))
            await until(
                cache,
                (ns, "b-shared"),
                lambda: names(cache.pods_for(ns, ["other-claim"], [])) == ["b-shared", "other"],
            )
            assert (
                cache.pods_for(ns, [], [again["metadata"]["uid"]])[0]["metadata"]["uid"]
                == again["metadata"]["uid"]
            )
            nursery.cancel_scope.cancel()
    finally:
        lookup.close()
    assert not cache.current  # its watch closed: reviews would list their namespace

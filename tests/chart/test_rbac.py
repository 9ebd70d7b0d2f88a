"""Least privilege: the chart's ClusterRoles grant exactly what vgpud calls.

`NODE_CALLS` / `WEBHOOK_CALLS` say which rights each API method needs; they sit here beside a check
that they cover every public method of `KubeClient` / `KubeLookup` (a new call without a row fails),
a check that the rendered rules are exactly their union (nothing granted that is not called), and a
run of every method against the real API server as the chart's own ServiceAccount, with the chart's
RBAC created for real (a row that is too narrow fails there with 403)."""

from __future__ import annotations

import dataclasses
import inspect
import secrets
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.chart.apiserver import create, create_namespace
from tests.chart.chart import Manifest, one, render
from tests.kubeapi import ApiServer, api_request
from vgpud.kube.api import RESOURCE_API, KubeApi, KubeError, WatchEventType
from vgpud.kube.client import KubeClient
from vgpud.kube.config import ApiConfig, from_kubeconfig
from vgpud.webhook.lookup import KubeLookup, Lookup
from vgpud.webhook.podcache import PodSource

Right = tuple[str, str, str]  # (API group, resource, verb)
RESOURCE = "resource.k8s.io"
SLICES, CLAIMS, TEMPLATES = "resourceslices", "resourceclaims", "resourceclaimtemplates"

#: the node daemon's calls (vgpud.kube.client.KubeClient) -> the rights each needs
NODE_CALLS: dict[str, set[Right]] = {
    "get_resource_claim": {(RESOURCE, CLAIMS, "get")},
    "patch_resource_claim_metadata": {(RESOURCE, CLAIMS, "patch")},  # merge patch
    "get_pod": {("", "pods", "get")},
    "list_node_pods": {("", "pods", "list")},
    "watch_node_pods": {("", "pods", "watch")},
    "get_node": {("", "nodes", "get")},
    "list_resource_slices": {(RESOURCE, SLICES, "list")},
    # server-side apply: patch, and create when the slice does not exist yet (the server checks both)
    "apply_resource_slice": {(RESOURCE, SLICES, "patch"), (RESOURCE, SLICES, "create")},
    "delete_resource_slice": {(RESOURCE, SLICES, "delete")},
    "watch_resource_slices": {(RESOURCE, SLICES, "list"), (RESOURCE, SLICES, "watch")},  # list for the RV
    "list_resource_claims": {(RESOURCE, CLAIMS, "list")},
    "watch_resource_claims": {(RESOURCE, CLAIMS, "watch")},  # from the list's version
    "create_event": {("", "events", "create")},
    "patch_event": {("", "events", "patch")},  # merge patch of a repeat's count
}
#: the webhook's reads (vgpud.webhook.lookup.Lookup) -> the rights each needs
WEBHOOK_CALLS: dict[str, set[Right]] = {
    "get_resource_claim": {(RESOURCE, CLAIMS, "get")},
    "get_resource_claim_template": {(RESOURCE, TEMPLATES, "get")},
    "list_pods": {("", "pods", "list")},
    "list_pods_named": {("", "pods", "list")},  # a field selector on metadata.name
    # the pod cache's (vgpud.webhook.podcache.PodSource)
    "list_all_pods": {("", "pods", "list")},
    "watch_all_pods": {("", "pods", "watch")},  # from the list's version, or the streaming list
}
#: KubeClient's methods that make no API call
NOT_CALLS = {"from_config", "close"}
#: the webhook's reads that make no API call (the pod cache's index)
WEBHOOK_NOT_CALLS = {"cached_pods"}


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def protocol_methods(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_") and callable(vars(protocol)[name])}


def granted(manifests: list[Manifest], name_suffix: str) -> set[Right]:
    """The rules of the chart's ClusterRole, one (group, resource, verb) per right."""
    rules = one(manifests, "ClusterRole", name_suffix)["rules"]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_every_api_method_has_a_row() -> None:
    assert public_methods(KubeClient) - NOT_CALLS == set(NODE_CALLS)
    assert protocol_methods(KubeApi) == set(NODE_CALLS)
    assert protocol_methods(Lookup) | protocol_methods(PodSource) == set(WEBHOOK_CALLS) | WEBHOOK_NOT_CALLS
    assert public_methods(KubeLookup) - public_methods(KubeClient) <= set(WEBHOOK_CALLS) | WEBHOOK_NOT_CALLS


def test_cluster_roles_grant_exactly_what_is_called() -> None:
    manifests = render()
    assert granted(manifests, "-node") == set().union(*NODE_CALLS.values())
    assert granted(manifests, "-webhook") == set().union(*WEBHOOK_CALLS.values())
    # and nothing namespaced or aggregated on the side
    assert {m["kind"] for m in manifests} & {"Role", "RoleBinding"} == set()


# -- the same calls, made for real as the chart's ServiceAccounts ----------------------------------

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
PROPAGATION_TIMEOUT_S = 30.0


def impersonating(server: ApiServer, user: str) -> ApiConfig:
    """The admin's credentials, acting as `user` (Impersonate-User, a kubeconfig's `as`)."""
    return dataclasses.replace(from_kubeconfig(server.kubeconfig), impersonate=user)


def wait_allowed(server: ApiServer, user: str, namespace: str, right: Right) -> None:
    """Until the API server's RBAC cache has the new binding (SubjectAccessReview says allowed)."""
    group, resource, verb = right
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "verb": verb,
                "namespace": namespace,
            },
        },
    }
    deadline = time.monotonic() + PROPAGATION_TIMEOUT_S
    while time.monotonic() < deadline:
        answer = api_request(server, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        if answer["status"].get("allowed"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{user} was not allowed {right} within {PROPAGATION_TIMEOUT_S:g}s")


class Chart:
    """The chart's RBAC created for real under a release name of its own, and the objects to call on."""

    def __init__(self, server: ApiServer) -> None:
        tag = secrets.token_hex(3)
        self.server = server
        self.namespace = f"vgpud-rbac-{tag}"
        self.release = f"rbac-{tag}"
        self.node_name = f"node-{tag}"
        self.driver = f"{tag}.vgpu.test"
        manifests = render(release=self.release, namespace=self.namespace)
        self.node_user = self._user(one(manifests, "ServiceAccount", "-node"))
        self.webhook_user = self._user(one(manifests, "ServiceAccount", "-webhook"))
        create_namespace(server, self.namespace)
        for manifest in manifests:
            if manifest["kind"] in RBAC_KINDS:
                create(server, manifest, dry_run=False)
        wait_allowed(server, self.node_user, "", (RESOURCE, SLICES, "patch"))
        wait_allowed(server, self.webhook_user, self.namespace, (RESOURCE, TEMPLATES, "get"))

    def _user(self, account: Manifest) -> str:
        return f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return api_request(self.server, "POST", path, body)

    def cleanup(self) -> None:
        """Remove the cluster-scoped objects (the namespace's go with the session's API server)."""
        for suffix in ("node", "webhook"):
            for kind in ("clusterrolebindings", "clusterroles"):
                try:
                    path = f"/apis/rbac.authorization.k8s.io/v1/{kind}/{self.release}-vgpud-{suffix}"
                    api_request(self.server, "DELETE", path)
                except urllib.error.HTTPError as err:
                    if err.code != 404:
                        raise


@pytest.fixture
def chart(kube_apiserver: ApiServer) -> Iterator[Chart]:
    installed = Chart(kube_apiserver)
    try:
        yield installed
    finally:
        installed.cleanup()


def claim_body(name: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "vgpu-manager"}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


def slice_body(chart: Chart, node_uid: str, generation: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{chart.node_name}-{chart.driver}",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": chart.node_name,
                    "uid": node_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "driver": chart.driver,
            "nodeName": chart.node_name,
            "pool": {"name": chart.node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def event_body(chart: Chart, namespace: str, involved: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{involved['name']}.{secrets.token_hex(8)}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", **involved},
        "type": "Normal",
        "reason": "RbacTest",
        "message": "the node's role may write Events",
        "source": {"component": "vgpud", "host": chart.node_name},
        "count": 1,
    }


async def write_events(kube: KubeClient, chart: Chart, pod: dict[str, Any]) -> set[str]:
    """An Event on the pod (in its namespace) and one on the node (in `default`), each patched once."""
    ns = chart.namespace
    for namespace, involved in (
        (ns, {"kind": "Pod", "namespace": ns, "name": "p1", "uid": pod["metadata"]["uid"]}),
        ("default", {"kind": "Node", "name": chart.node_name, "uid": chart.node_name}),
    ):
        event = await kube.create_event(namespace, event_body(chart, namespace, involved))
        patched = await kube.patch_event(namespace, event["metadata"]["name"], {"count": 2})
        assert patched["count"] == 2
    return {"create_event", "patch_event"}


async def test_the_node_daemon_can_make_every_call_as_its_service_account(chart: Chart) -> None:
    ns, resource = chart.namespace, f"/apis/{RESOURCE_API}/namespaces/{chart.namespace}"
    chart.post("/api/v1/nodes", {"metadata": {"name": chart.node_name}})
    claim = chart.post(f"{resource}/resourceclaims", claim_body("c1"))
    pod = {
        "metadata": {"name": "p1"},
        "spec": {"nodeName": chart.node_name, "containers": [{"name": "c", "image": "busybox"}]},
    }
    pod = chart.post(f"/api/v1/namespaces/{ns}/pods", pod)

    kube = KubeClient(impersonating(chart.server, chart.node_user))
    try:
        called = await write_events(kube, chart, pod)
        node = await kube.get_node(chart.node_name)
        called.add("get_node")
        assert (await kube.get_pod(ns, "p1"))["metadata"]["name"] == "p1"
        called.add("get_pod")
        assert (await kube.get_resource_claim(ns, "c1"))["metadata"]["uid"] == claim["metadata"]["uid"]
        called.add("get_resource_claim")
        patched = await kube.patch_resource_claim_metadata(
            ns, "c1", uid=claim["metadata"]["uid"], annotations={"vgpud.test/seen": "yes"}, labels={"n": "1"}
        )
        assert patched["metadata"]["annotations"]["vgpud.test/seen"] == "yes"
        called.add("patch_resource_claim_metadata")
        claims = await kube.list_resource_claims(labels={"n": "1"})
        assert [c["metadata"]["name"] for c in claims.items] == ["c1"]
        called.add("list_resource_claims")
        async with kube.watch_resource_claims(resource_version=claims.resource_version, labels={"n": "1"}):
            called.add("watch_resource_claims")  # entering means the server accepted the watch
        pods = await kube.list_node_pods(node_name=chart.node_name)
        assert [p["metadata"]["name"] for p in pods.items] == ["p1"]
        called.add("list_node_pods")
        async with kube.watch_node_pods(node_name=chart.node_name, resource_version=pods.resource_version):
            called.add("watch_node_pods")

        uid = node["metadata"]["uid"]
        with trio.fail_after(30):
            async with kube.watch_resource_slices(driver=chart.driver, node_name=chart.node_name) as events:
                called.add("watch_resource_slices")
                created = await kube.apply_resource_slice(slice_body(chart, uid, 1), field_manager="vgpud")
                called.add("apply_resource_slice")
                event = await events.__anext__()
                assert (event.type, event.object["metadata"]["uid"]) == (
                    WatchEventType.ADDED,
                    created["metadata"]["uid"],
                )
        listed = await kube.list_resource_slices(driver=chart.driver, node_name=chart.node_name)
        assert [s["metadata"]["name"] for s in listed] == [created["metadata"]["name"]]
        called.add("list_resource_slices")
        await kube.delete_resource_slice(created["metadata"]["name"])
        called.add("delete_resource_slice")
        assert await kube.list_resource_slices(driver=chart.driver, node_name=chart.node_name) == []

        # and what it was not granted is refused
        lookup = KubeLookup(impersonating(chart.server, chart.node_user))
        with pytest.raises(KubeError) as refused:
            await lookup.get_resource_claim_template(ns, "t1")
        assert refused.value.status == 403
        lookup.close()
    finally:
        kube.close()
    assert called == set(NODE_CALLS)


async def test_the_webhook_can_make_every_read_as_its_service_account(chart: Chart) -> None:
    ns, resource = chart.namespace, f"/apis/{RESOURCE_API}/namespaces/{chart.namespace}"
    chart.post(f"{resource}/resourceclaims", claim_body("c1"))
    template = {"metadata": {"name": "t1"}, "spec": {"spec": claim_body("")["spec"]}}
    chart.post(f"{resource}/resourceclaimtemplates", template)
    pod = {"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    chart.post(f"/api/v1/namespaces/{ns}/pods", pod)

    lookup = KubeLookup(impersonating(chart.server, chart.webhook_user))
    try:
        assert (await lookup.get_resource_claim(ns, "c1"))["metadata"]["name"] == "c1"
        assert (await lookup.get_resource_claim_template(ns, "t1"))["metadata"]["name"] == "t1"
        assert [p["metadata"]["name"] for p in await lookup.list_pods(ns)] == ["p1"]
        assert [p["metadata"]["name"] for p in await lookup.list_pods_named(ns, "p1")] == ["p1"]
        pods = await lookup.list_all_pods()
        assert any(p["metadata"]["name"] == "p1" for p in pods.items)
        async with lookup.watch_all_pods(pods.resource_version):
            pass  # entering means the server accepted the watch
        with trio.fail_after(30):
            async with lookup.watch_all_pods("") as events:  # the streaming list
                assert (await anext(events)).type is WatchEventType.ADDED
        # the node daemon's rights are not the webhook's
        with pytest.raises(KubeError) as refused:
            await lookup.list_resource_claims()
        assert refused.value.status == 403
        with pytest.raises(KubeError) as refused:
            await lookup.get_pod(ns, "p1")
        assert refused.value.status == 403
    finally:
        lookup.close()

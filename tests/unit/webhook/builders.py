"""Claims, templates and reviews for the webhook tests, on top of tests/objects.py: what the API server
holds at pod CREATE (claims not allocated yet) and the AdmissionReviews it sends."""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from tests import objects as o
from vgpud.kube.api import JsonObject, Listing, NotFound, WatchEvent
from vgpud.relaxations import Relaxation, nri_selector
from vgpud.webhook.claims import Policy
from vgpud.webhook.podcache import PodCache
from vgpud.webhook.podselect import select_pods

POLICY = Policy(driver=o.DRIVER)
#: the chart's DeviceClass for NRI nodes
NRI_CLASS = "vgpu-manager-nri"
#: both relaxations on; the chart's two classes
RELAXED = Policy(
    driver=o.DRIVER,
    vgpu_classes=frozenset({"vgpu-manager", NRI_CLASS}),
    nri_classes=frozenset({NRI_CLASS}),
    relaxations=frozenset(Relaxation),
)
POD3_UID = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"


def spec_claim(name: str, *requests: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    """A ResourceClaim as created by a user: spec only, not allocated."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": o.NAMESPACE, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": list(requests)}},
    }


def nri_request(
    name: str, device_class: str = "vgpu-manager", *, selector: Callable[[str], str] = nri_selector
) -> dict[str, Any]:
    """An `exactly` request that selects NRI nodes by its own selector (`nri_selector`, or
    `nri_selector_optional`)."""
    out = o.exactly(name, device_class)
    out["exactly"]["selectors"] = [{"cel": {"expression": selector(o.DRIVER)}}]
    return out


def allocated(
    claim: dict[str, Any], *, results: list[dict[str, Any]], reserved_for: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The claim after the scheduler allocated it (and reserved it for pods)."""
    out = copy.deepcopy(claim)
    out["status"] = {"allocation": {"devices": {"results": results}}, "reservedFor": reserved_for or []}
    return out


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": o.NAMESPACE, "uid": str(uuid.uuid4())},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def sidecar(name: str, *refs: dict[str, str]) -> dict[str, Any]:
    return o.container(name, *refs, restart="Always")


def finished(pod: dict[str, Any], phase: str = "Succeeded") -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["status"]["phase"] = phase
    return out


def review(
    obj: dict[str, Any] | None,
    *,
    resource: str = "pods",
    group: str = "",
    version: str = "v1",
    kind: str = "Pod",
    sub_resource: str = "",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview as the API server sends it."""
    meta = (obj or old or {}).get("metadata", {})
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", o.NAMESPACE),
        "operation": operation,
        "userInfo": {"username": "admin", "groups": ["system:masters", "system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
        request["requestSubResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def claim_review(claim: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return review(claim, resource="resourceclaims", group="resource.k8s.io", kind="ResourceClaim", **kwargs)


class FakeLookup:
    """Objects by (namespace, name); every call is logged; `fail` makes every call raise it. Pods are
    listed (`list_pods`) unless `synced`: then reviews read them as from the pod cache (`cached_pods`:
    the same choice, `select_pods`, over the namespace's pods in their order)."""

    def __init__(
        self,
        claims: Mapping[str, JsonObject] | None = None,
        templates: Mapping[str, JsonObject] | None = None,
        pods: list[JsonObject] | None = None,
    ) -> None:
        self.claims = dict(claims or {})
        self.templates = dict(templates or {})
        self.pods = pods or []
        self.calls: list[tuple[str, str]] = []
        self.fail: BaseException | None = None
        self.delay = 0.0
        self.synced = False

    async def _enter(self, call: str, name: str) -> None:
        self.calls.append((call, name))
        await trio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        await self._enter("claim", name)
        if name not in self.claims:
            raise NotFound(f"resourceclaims {name} not found", 404)
        return self.claims[name]

    async def get_resource_claim_template(self, namespace: str, name: str) -> JsonObject:
        await self._enter("template", name)
        if name not in self.templates:
            raise NotFound(f"resourceclaimtemplates {name} not found", 404)
        return self.templates[name]

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        await self._enter("pods", namespace)
        return [p for p in self.pods if _meta(p, "namespace") == namespace]

    async def list_pods_named(self, namespace: str, name: str) -> list[JsonObject]:
        await self._enter("pod", name)
        return [p for p in self.pods if _meta(p, "namespace") == namespace and _meta(p, "name") == name]

    def cached_pods(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject] | None:
        if not self.synced:
            return None
        self.calls.append(("cached pods", namespace))
        return select_pods(self.pods, namespace, claim_names, reserved_uids)


def _meta(pod: Any, key: str) -> Any:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    return meta.get(key) if isinstance(meta, Mapping) else None


class StaticPods:
    """A PodSource (vgpud.webhook.podcache) of fixed pods: a list of them, then a watch that stays
    open and sends nothing."""

    def __init__(self, pods: list[JsonObject]) -> None:
        self.pods = pods

    async def list_all_pods(self) -> Listing:
        return Listing(list(self.pods), "1")

    @asynccontextmanager
    async def watch_all_pods(self, resource_version: str) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        send, receive = trio.open_memory_channel[WatchEvent](0)
        async with send, receive:
            yield receive


class CachedLookup(FakeLookup):
    """A FakeLookup whose reviews read a real PodCache fed with its pods (trimmed, indexed, in name
    order), while `running()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache = PodCache(StaticPods(self.pods), stream_lists=False)
        self.synced = True
        #: every pod `cached_pods` returned
        self.returned: list[JsonObject] = []

    def cached_pods(
        self, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
    ) -> list[JsonObject] | None:
        self.calls.append(("cached pods", namespace))
        pods = self.cache.read(namespace, claim_names, reserved_uids)
        self.returned += pods or []
        return pods

    @asynccontextmanager
    async def running(self) -> AsyncIterator[CachedLookup]:
        """The cache listed, its watch open, until the block ends."""
        async with trio.open_nursery() as nursery:
            await nursery.start(run_informer, self.cache)
            yield self
            nursery.cancel_scope.cancel()


async def run_informer(
    cache: PodCache, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """The cache's informer, started once it has listed and its watch is open."""
    await cache.informer.run(task_status.started)

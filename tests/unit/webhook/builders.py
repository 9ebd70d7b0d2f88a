"""Claims, templates and reviews for the webhook tests, on top of tests/objects.py: what the API server
holds at pod CREATE (claims not allocated yet) and the AdmissionReviews it sends."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

import trio

from tests import objects as o
from vgpud.kube.api import JsonObject, NotFound
from vgpud.relaxations import Relaxation, nri_selector
from vgpud.webhook.claims import Policy

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


def nri_request(name: str, device_class: str = "vgpu-manager") -> dict[str, Any]:
    """An `exactly` request that selects NRI nodes by its own selector (`nri_selector`)."""
    out = o.exactly(name, device_class)
    out["exactly"]["selectors"] = [{"cel": {"expression": nri_selector(o.DRIVER)}}]
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
    """Objects by (namespace, name); every call is logged; `fail` makes every call raise it."""

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
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace]

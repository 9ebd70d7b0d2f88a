"""Builders of realistic API objects: resource.k8s.io/v1 ResourceClaims and core/v1 Pods as dicts,
shaped as the API server returns them (camelCase)."""

from __future__ import annotations

from typing import Any

DRIVER = "manager.nvidia.com"
OTHER_DRIVER = "dra.net"
NAMESPACE = "default"
CLAIM_UID = "5b0e7c1a-3f2d-4c8e-9a71-0d6f1e2b3c4d"
POD1_UID = "8f0c6a5e-1b2d-4e3f-a4b5-c6d7e8f90a1b"
POD2_UID = "1a2b3c4d-5e6f-4a8b-9c0d-e1f2a3b4c5d6"
GIB = 1 << 30


def exactly(name: str, device_class: str = "vgpu-manager") -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1},
    }


def first_available(name: str, *subs: str) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": s, "deviceClassName": "vgpu-manager"} for s in subs]}


def result(
    request: str,
    device: str = "vgpu-0",
    *,
    driver: str = DRIVER,
    share_id: str | None = None,
    cores: str | None = "40",
    memory: str | None = "4Gi",
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": "node-a", "device": device}
    if driver == DRIVER:
        out["shareID"] = share_id or f"{request.replace('/', '-')}-{device}-share"
        capacity = {k: v for k, v in (("cores", cores), ("memory", memory)) if v is not None}
        if capacity:
            out["consumedCapacity"] = capacity
    return out


def reserved(*pods: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods]


def claim(
    *,
    requests: list[dict[str, Any]],
    results: list[dict[str, Any]],
    reserved_for: list[dict[str, Any]] | None = None,
    name: str = "gpu-claim",
    uid: str = CLAIM_UID,
    annotations: dict[str, str] | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "42"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                    ]
                },
            },
            "reservedFor": reserved_for or [],
        },
    }


def ref(pod_claim: str, request: str | None = None) -> dict[str, str]:
    return {"name": pod_claim} if request is None else {"name": pod_claim, "request": request}


def container(name: str, *refs: dict[str, str], restart: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"}
    if refs:
        out["resources"] = {"claims": list(refs)}
    if restart:
        out["restartPolicy"] = restart
    return out


def pod(
    name: str,
    uid: str,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    claims: dict[str, str] | None = None,
    templates: dict[str, str | None] | None = None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    """`claims`: pod claim name -> ResourceClaim name; `templates`: pod claim name -> generated name."""
    claims = {"gpu": "gpu-claim"} if claims is None and templates is None else (claims or {})
    resource_claims = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    resource_claims += [{"name": k, "resourceClaimTemplateName": f"{k}-template"} for k in templates or {}]
    spec: dict[str, Any] = {"containers": containers, "resourceClaims": resource_claims}
    if init:
        spec["initContainers"] = init
    status: dict[str, Any] = {"phase": "Pending"}
    if templates:
        status["resourceClaimStatuses"] = [
            {"name": k} if v is None else {"name": k, "resourceClaimName": v} for k, v in templates.items()
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": spec,
        "status": status,
    }

"""The real kube-apiserver fixture serves what vgpud needs: resource.k8s.io/v1 with consumable capacity
(allowMultipleAllocations, requestPolicy validRange, consumedCapacity and shareID in allocations),
server-side apply, and a kubeconfig the `kubernetes` client accepts."""

from __future__ import annotations

import json
import uuid
from typing import Any

import kubernetes

from tests.kubeapi import ApiServer, api_request, kube_env

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "manager.nvidia.com"
MIB = 1 << 20


def unique(prefix: str) -> str:
    """A name no other test in the shared session server uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def resource_slice(name: str, node: str, generation: int = 1, cores: int = 100) -> dict[str, Any]:
    """The shape vgpud publishes: one shareable device with consumable cores and memory."""
    memory = 16 * 1024 * MIB
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "vgpu-0",
                    "attributes": {"type": {"string": "vgpu"}, "minor": {"int": 0}},
                    "capacity": {
                        "cores": {
                            "value": str(cores),
                            "requestPolicy": {
                                "default": str(cores),
                                "validRange": {"min": "0", "max": str(cores), "step": "1"},
                            },
                        },
                        "memory": {
                            "value": str(memory),
                            "requestPolicy": {
                                "default": str(memory),
                                "validRange": {"min": str(MIB), "max": str(memory), "step": str(MIB)},
                            },
                        },
                    },
                    "allowMultipleAllocations": True,
                }
            ],
        },
    }


def test_version_and_api_groups(kube_apiserver: ApiServer) -> None:
    version = api_request(kube_apiserver, "GET", "/version")
    assert version["gitVersion"] == kube_env()["KUBE_VERSION"]
    group = api_request(kube_apiserver, "GET", "/apis/resource.k8s.io")
    assert "v1" in [v["version"] for v in group["versions"]]


def test_kubeconfig_works_with_the_kubernetes_client(kube_apiserver: ApiServer) -> None:
    client = kubernetes.config.new_client_from_config(config_file=str(kube_apiserver.kubeconfig))
    try:
        names = [ns.metadata.name for ns in kubernetes.client.CoreV1Api(client).list_namespace().items]
    finally:
        client.close()
    assert {"default", "kube-system"} <= set(names)


def test_device_class_slice_and_claim_round_trip(kube_apiserver: ApiServer) -> None:
    class_name, slice_name, claim_name = unique("vgpu"), unique("node-a-slice"), unique("claim")
    api_request(kube_apiserver, "POST", f"{RESOURCE}/deviceclasses", device_class(class_name))
    api_request(kube_apiserver, "POST", f"{RESOURCE}/resourceslices", resource_slice(slice_name, "node-a"))
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": class_name,
                            "capacity": {"requests": {"cores": "30", "memory": "1Gi"}},
                        },
                    }
                ]
            }
        },
    }
    claims = f"{RESOURCE}/namespaces/default/resourceclaims"
    api_request(kube_apiserver, "POST", claims, claim)

    got_class = api_request(kube_apiserver, "GET", f"{RESOURCE}/deviceclasses/{class_name}")
    assert got_class["spec"] == device_class(class_name)["spec"]
    got_slice = api_request(kube_apiserver, "GET", f"{RESOURCE}/resourceslices/{slice_name}")
    device = got_slice["spec"]["devices"][0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["step"] in {"1Mi", str(MIB)}
    got_claim = api_request(kube_apiserver, "GET", f"{claims}/{claim_name}")
    requested = got_claim["spec"]["devices"]["requests"][0]["exactly"]
    assert requested["capacity"]["requests"] == {"cores": "30", "memory": "1Gi"}

    # What the scheduler writes for a shared device: a share id and the capacity it consumes.
    share_id = str(uuid.uuid4())
    allocation = {
        "devices": {
            "results": [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": "node-a",
                    "device": "vgpu-0",
                    "shareID": share_id,
                    "consumedCapacity": {"cores": "30", "memory": "1Gi"},
                }
            ]
        }
    }
    api_request(
        kube_apiserver,
        "PATCH",
        f"{claims}/{claim_name}/status",
        {"status": {"allocation": allocation}},
        content_type="application/merge-patch+json",
    )
    result = api_request(kube_apiserver, "GET", f"{claims}/{claim_name}")["status"]["allocation"]
    assert result["devices"]["results"][0]["shareID"] == share_id
    assert result["devices"]["results"][0]["consumedCapacity"] == {"cores": "30", "memory": "1Gi"}


def test_server_side_apply_of_a_slice_twice(kube_apiserver: ApiServer) -> None:
    name = unique("node-b-slice")
    path = f"{RESOURCE}/resourceslices/{name}?fieldManager=vgpud&force=true"
    apply = "application/apply-patch+yaml"
    first = api_request(kube_apiserver, "PATCH", path, json.dumps(resource_slice(name, "node-b")), apply)
    again = api_request(kube_apiserver, "PATCH", path, json.dumps(resource_slice(name, "node-b")), apply)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    changed = api_request(
        kube_apiserver,
        "PATCH",
        path,
        json.dumps(resource_slice(name, "node-b", generation=2, cores=50)),
        apply,
    )
    assert changed["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    assert changed["spec"]["pool"]["generation"] == 2
    assert changed["spec"]["devices"][0]["capacity"]["cores"]["value"] == "50"
    managers = [entry["manager"] for entry in changed["metadata"]["managedFields"]]
    assert managers == ["vgpud"]

"""The DRA half of vgpud against a real kube-apiserver: a claim allocated as the scheduler does it is
prepared through the DRA socket as the kubelet calls it (grpcio), in client-registration mode so the
register annotations go through the real API (merge patch with a UID precondition); the slice that
the kubelet would delete comes back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kubeapi import ApiServer, api_request, free_port
from tests.vgpudproc import DRIVER, Vgpud, create_allocated_claim, dra_call, ensure_node, node_slices
from vgpud.dra.cdi import spec_path

NODE = "e2e-node"
NAMESPACE = "default"


@pytest.fixture
def vgpud(short_tmp: Path, kube_apiserver: ApiServer) -> Iterator[Vgpud]:
    ensure_node(kube_apiserver, NODE)
    d = Vgpud(
        short_tmp,
        node=NODE,
        port=free_port(),
        kubeconfig=kube_apiserver.kubeconfig,
        extra=["--feature-gates", "DevicePluginClientMode=true"],
    )
    try:
        d.wait_serving()
        yield d
    finally:
        d.kill()


def _env(edits: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in edits.get("env", []))


def test_prepare_and_unprepare_a_real_claim(vgpud: Vgpud, kube_apiserver: ApiServer) -> None:
    api = kube_apiserver
    _, claim = create_allocated_claim(
        api,
        namespace=NAMESPACE,
        name="e2e-two-requests",
        node=NODE,
        containers={
            "trainer": {"memory": "8Gi", "cores": "50"},
            "evaluator": {"memory": "4Gi", "cores": "20"},
        },
    )
    uid = claim["metadata"]["uid"]
    reply = dra_call(vgpud.dra_socket, "Prepare", [claim])
    entry = reply.claims[uid]
    assert entry.error == ""
    assert sorted(d.request_names[0] for d in entry.devices) == ["r-evaluator", "r-trainer"]

    spec = json.loads(spec_path(vgpud.root / "var/run/cdi", DRIVER, uid).read_text())
    limits = {
        _env(d["containerEdits"])["CUDA_MEM_LIMIT_0"]: _env(d["containerEdits"]) for d in spec["devices"]
    }
    assert set(limits) == {"8192m", "4096m"}
    assert limits["8192m"]["CUDA_CORE_LIMIT_0"] == "50"
    assert limits["4096m"]["CUDA_CORE_LIMIT_0"] == "20"
    register_uuids = {env["MANAGER_CLIENT_REGISTER_UUID"] for env in limits.values()}
    assert len(register_uuids) == 2, "two containers, two partitions, two register identities"

    stored = api_request(
        api,
        "GET",
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{claim['metadata']['name']}",
    )
    annotations = stored["metadata"].get("annotations", {})
    assert {f"{DRIVER}/{u}" for u in register_uuids} <= set(annotations)

    unprepared = dra_call(vgpud.dra_socket, "Unprepare", [claim])
    assert unprepared.claims[uid].error == ""
    stored = api_request(
        api,
        "GET",
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{claim['metadata']['name']}",
    )
    assert not any(k.startswith(f"{DRIVER}/") for k in stored["metadata"].get("annotations", {}))
    assert not (vgpud.root / "etc/vgpu-manager/claims" / uid).exists()
    assert not spec_path(vgpud.root / "var/run/cdi", DRIVER, uid).exists()


def test_a_deleted_slice_comes_back(vgpud: Vgpud, kube_apiserver: ApiServer) -> None:
    (published,) = node_slices(kube_apiserver, NODE)
    api_request(
        kube_apiserver, "DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{published['metadata']['name']}"
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the log line may trail the API object by a moment
        slices = node_slices(kube_apiserver, NODE)
        recreated = bool(slices) and slices[0]["metadata"]["uid"] != published["metadata"]["uid"]
        if recreated and "deleted by someone: re-created" in vgpud.output():
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the ResourceSlice was not re-created (and said so):\n{vgpud.output()}")

"""The webhook relaxations on a real node, both tracks (issue 22): `vgpud webhook` with both switches on
(as the chart's `webhook.relaxations` sets them) in front of the node's API server, scoped to this
module's namespace.

- The ResourceSlice says which mode the node runs in (`nriMode`).
- Two claims in one container, each selecting NRI nodes (one by its own selector, one by the NRI
  DeviceClass the chart ships): admitted; on the NRI node the pod runs with both limits, one directory
  and one registration, unless the two claims got the same GPU, which Prepare refuses (one limit per GPU
  reaches a container); on the eager node the scheduler finds no device (the selector keeps it off).
- The same pod without the selector: denied, the message naming the rule and the fix.
- Forced onto the eager node (the claims allocated there by hand, the pod bound by name): the node's
  Prepare refuses each claim with the reason, and counts it; the same shapes run on the NRI node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import workload as w
from tests.e2e.admission import DENIED, call, registered
from tests.e2e.node import DEVICE_CLASS, DRIVER, LocalNode
from tests.kubeapi import free_port
from tests.unit.webhook.process import WebhookProcess
from vgpud.partition.nrionly import RefusalReason
from vgpud.relaxations import NRI_MODE_ATTRIBUTE, Relaxation, nri_selector, nri_selector_optional

RESOURCE = "/apis/resource.k8s.io/v1"
REFUSALS = "vgpud_prepare_refusals_total"
#: what an eager node's Prepare says of a use that needs NRI mode
NEEDS_NRI = "needs a node in NRI mode"
#: the DeviceClass for NRI nodes, as the chart renders it (helm/vgpud/templates/deviceclass.yaml)
NRI_CLASS = "vgpu-manager-nri"


@dataclass
class Relaxed:
    """The module's namespace, whose pods and claims the relaxing webhook reviews."""

    node: LocalNode
    ns: str
    webhook: WebhookProcess


@pytest.fixture(scope="module")
def relaxed(node: LocalNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relaxed]:
    ns = w.namespace(node, "relax")
    with relaxing_webhook(node, tmp_path_factory.mktemp("webhook"), ns) as webhook:
        yield Relaxed(node, ns, webhook)


@contextmanager
def relaxing_webhook(node: LocalNode, workdir: Path, ns: str) -> Iterator[WebhookProcess]:
    """`vgpud webhook` with both relaxations on, registered for namespace `ns` of the node's API
    server (a cluster's nodes share one) and in effect; the NRI DeviceClass installed."""
    assert node.api is not None
    webhook = WebhookProcess(
        workdir,
        port=free_port(),
        kubeconfig=node.api.kubeconfig,
        extra=[
            "--allow-multiple-vgpu-claims-per-container",
            "--allow-vgpu-claims-across-pods",
            f"--vgpu-device-classes={DEVICE_CLASS},{NRI_CLASS}",
            f"--nri-device-classes={NRI_CLASS}",
        ],
    )
    install_nri_class(node)
    try:
        webhook.wait_serving()
        with registered(node.api, "vgpud-relax", ns, webhook.url, webhook.ca_bundle()):
            _wait_in_effect(node, ns, webhook)
            yield webhook
    finally:
        webhook.kill()


def install_nri_class(node: LocalNode) -> None:
    """The chart's `vgpu-manager-nri` class: the node's vGPU class plus the NRI selector (its optional
    form, as the chart renders it)."""
    expressions = [
        f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vgpu'",
        nri_selector_optional(DRIVER),
    ]
    body = {
        "metadata": {"name": NRI_CLASS},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }
    assert node.api is not None
    answer = call(node.api, "POST", f"{RESOURCE}/deviceclasses", body)
    assert answer.status in (201, 409), answer.body


def _wait_in_effect(node: LocalNode, ns: str, webhook: WebhookProcess) -> None:
    """The API server loads a new configuration asynchronously: a dry-run pod that breaks a rule the
    switches leave on (two app containers on one request) is denied once it is in effect."""
    assert node.api is not None
    w.create_claim(node, ns, "probe", [w.vgpu_request("gpu", "1Gi", "5")])
    probe = pod_body("probe", {"probe": "probe"}, [("a", ["probe"]), ("b", ["probe"])])

    def denied() -> bool:
        assert node.api is not None
        answer = call(node.api, "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", probe)
        return answer.status == 403 and DENIED in answer.message

    try:
        w.wait_for(denied, what="the webhook configuration in effect")
    except AssertionError:
        raise AssertionError(f"the webhook never took effect:\n{webhook.output()}") from None


# --------------------------------------------------------------------------------------------------
# Building blocks


def pod_body(
    name: str,
    claims: dict[str, str],
    containers: list[tuple[str, list[str]]],
    *,
    node_name: str | None = None,
    requests: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A sleeping pod; `claims`: pod claim -> ResourceClaim; `containers`: (name, pod claims it uses);
    `requests`: pod claim -> the one request its containers use (whole claim otherwise)."""
    wanted = requests or {}
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": [w.container(ctr, [(c, wanted.get(c)) for c in refs]) for ctr, refs in containers],
        "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in claims.items()],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name}, "spec": spec}


def create_pod(relaxed: Relaxed, body: dict[str, Any]) -> dict[str, Any]:
    assert relaxed.node.api is not None
    answer = call(relaxed.node.api, "POST", f"/api/v1/namespaces/{relaxed.ns}/pods", body)
    assert answer.status == 201, answer.body
    return answer.body


def slice_devices(node: LocalNode) -> list[dict[str, Any]]:
    """The devices vgpud publishes for this node."""
    slices = node.get(f"{RESOURCE}/resourceslices")["items"]
    return [
        device
        for item in slices
        if item["spec"].get("driver") == DRIVER and item["spec"].get("nodeName") == node.name
        for device in item["spec"].get("devices", [])
    ]


def refusals(node: LocalNode, reason: RefusalReason) -> float:
    return sum(v for labels, v in node.metric_samples(REFUSALS) if labels.get("reason") == reason.value)


def allocate_by_hand(
    relaxed: Relaxed, claim: str, devices: dict[str, str], pods: list[dict[str, Any]]
) -> None:
    """Allocate `claim` (request -> device of this node) and reserve it for `pods`, as the scheduler
    would, whatever the claim's selectors say."""
    node = relaxed.node
    assert node.api is not None
    path = f"{RESOURCE}/namespaces/{relaxed.ns}/resourceclaims/{claim}"
    body = node.get(path)
    capacity = {r["name"]: r["exactly"]["capacity"]["requests"] for r in body["spec"]["devices"]["requests"]}
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": request,
                        "driver": DRIVER,
                        "pool": node.name,
                        "device": device,
                        "shareID": str(uuid.uuid4()),
                        "consumedCapacity": capacity[request],
                    }
                    for request, device in devices.items()
                ]
            }
        },
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
        ],
    }
    answer = call(node.api, "PUT", f"{path}/status", body)
    assert answer.status == 200, answer.body


def cleanup(relaxed: Relaxed, pods: list[str], claims: dict[str, str]) -> None:
    """Pods gone, then every claim's directory, CDI spec and checkpoint entry, then the claims."""
    node = relaxed.node
    for pod in pods:
        w.delete_pod(node, relaxed.ns, pod)
    for name, uid in claims.items():
        w.wait_for(lambda uid=uid: not node.claim_dir(uid).exists(), what=f"claim {name}: directory removed")
        w.wait_for(lambda uid=uid: not node.cdi_spec(uid).exists(), what=f"claim {name}: CDI spec removed")
        w.wait_for(lambda uid=uid: uid not in w.checkpoint_claims(node), what=f"claim {name}: checkpoint")
        w.release_claim(node, relaxed.ns, name)


def two_claims(relaxed: Relaxed, prefix: str, gpus: tuple[int, int], *, selected: bool) -> dict[str, str]:
    """Claims `<prefix>-a` (1Gi, 10 cores) and `<prefix>-b` (2Gi, 20 cores) on GPUs `gpus`; their UIDs.
    `selected`: a selects NRI nodes by its own selector, b by the NRI DeviceClass."""
    uids = {}
    for suffix, memory, cores, gpu in (("a", "1Gi", "10", gpus[0]), ("b", "2Gi", "20", gpus[1])):
        request = w.on_gpu(w.vgpu_request("gpu", memory, cores), gpu)
        if selected and suffix == "a":
            request = w.nri_only(request)
        elif selected:
            request["exactly"]["deviceClassName"] = NRI_CLASS
        created = w.create_claim(relaxed.node, relaxed.ns, f"{prefix}-{suffix}", [request])
        uids[f"{prefix}-{suffix}"] = created["metadata"]["uid"]
    return uids


# --------------------------------------------------------------------------------------------------
# The tests


def test_the_resource_slice_says_which_mode_the_node_runs(node: LocalNode) -> None:
    devices = slice_devices(node)
    assert devices, "vgpud published no device"
    for device in devices:
        assert device["attributes"][NRI_MODE_ATTRIBUTE] == {"bool": node.nri}, device


@pytest.mark.parametrize("gpus", [(0, 1), (0, 0)], ids=["two-gpus", "one-gpu"])
def test_two_claims_in_one_container(relaxed: Relaxed, gpus: tuple[int, int]) -> None:
    """NRI, two GPUs: it runs, each claim's limit applied, one directory, one registration. NRI, one
    GPU: Prepare refuses (the container would get only the later claim's limit), counted. Eager: the
    selector leaves the scheduler no device."""
    node, ns = relaxed.node, relaxed.ns
    prefix = w.unique("two")
    claims = two_claims(relaxed, prefix, gpus, selected=True)
    names = {"a": f"{prefix}-a", "b": f"{prefix}-b"}
    shared_before = refusals(node, RefusalReason.CLAIMS_SHARE_A_GPU)
    try:
        create_pod(relaxed, pod_body(prefix, names, [("main", ["a", "b"])]))
        if not node.nri:
            w.wait_for(
                lambda: any(e["reason"] == "FailedScheduling" for e in w.pod_events(node, ns, prefix)),
                what="the scheduler's FailedScheduling event",
            )
            assert not w.get_pod(node, ns, prefix)["spec"].get("nodeName")
            for name in names.values():
                assert not w.get_claim(node, ns, name).get("status", {}).get("allocation"), name
            return
        if gpus[0] == gpus[1]:
            events = wait_refused(relaxed, prefix, RefusalReason.CLAIMS_SHARE_A_GPU)
            assert any("on the same GPU vgpu-0" in e["message"] for e in events), events
            assert refusals(node, RefusalReason.CLAIMS_SHARE_A_GPU) > shared_before
            return
        pod = w.wait_running(node, ns, prefix)
        pod_uid, cid = pod["metadata"]["uid"], w.container_id(pod, "main")
        limits = w.vgpu_limits(w.container_env(node, cid))
        assert limits["CUDA_MEM_LIMIT_0"] == "1024m" and limits["CUDA_CORE_LIMIT_0"] == "10", limits
        assert limits["CUDA_MEM_LIMIT_1"] == "2048m" and limits["CUDA_CORE_LIMIT_1"] == "20", limits
        directories = {name: w.claim_subdirs(node, uid) for name, uid in claims.items()}
        assert sorted(d for dirs in directories.values() for d in dirs) == [f"{pod_uid}_main"], directories
        registration = w.register_from_container(node, cid, hold_s=3)
        assert registration.returncode == 0, registration.output
        assert registration.shell_host_pid in registration.pids
    finally:
        cleanup(relaxed, [prefix], claims)


def wait_refused(relaxed: Relaxed, pod: str, reason: RefusalReason) -> list[dict[str, Any]]:
    """The pod waits, its events say Prepare refused a claim for `reason`: the kubelet's
    FailedPrepareDynamicResources and vgpud's own VGPUClaimRefused (the refusal without the kubelet's
    wrapping); those events."""
    node, ns = relaxed.node, relaxed.ns

    def refused() -> list[dict[str, Any]]:
        events = [e for e in w.pod_events(node, ns, pod) if f"({reason.value})" in e.get("message", "")]
        return (
            events
            if {e["reason"] for e in events} >= {"FailedPrepareDynamicResources", "VGPUClaimRefused"}
            else []
        )

    events = w.wait_for(refused, timeout=60, what=f"pod {pod}: Prepare's refusal ({reason.value}) as events")
    assert {e["reason"] for e in events} == {"FailedPrepareDynamicResources", "VGPUClaimRefused"}, events
    own = [e for e in events if e["reason"] == "VGPUClaimRefused"]  # one per refused claim
    assert all(e["type"] == "Warning" and e["source"]["component"] == "vgpud" for e in own), own
    assert w.get_pod(node, ns, pod)["status"]["phase"] == "Pending"
    return events


def test_without_the_selector_the_pod_is_denied(relaxed: Relaxed) -> None:
    node, ns = relaxed.node, relaxed.ns
    assert node.api is not None
    prefix = w.unique("plain")
    claims = two_claims(relaxed, prefix, (0, 1), selected=False)
    try:
        body = pod_body(prefix, {"a": f"{prefix}-a", "b": f"{prefix}-b"}, [("main", ["a", "b"])])
        answer = call(node.api, "POST", f"/api/v1/namespaces/{ns}/pods", body)
        assert answer.status == 403, answer.body
        assert answer.message.startswith(
            f'{DENIED}pod {ns}/{prefix}: app container "main" uses 2 vGPU claims'
        )
        assert nri_selector(DRIVER) in answer.message, answer.message
        assert call(node.api, "GET", f"/api/v1/namespaces/{ns}/pods/{prefix}").status == 404
    finally:
        for name in claims:
            w.release_claim(node, ns, name)


@pytest.mark.parametrize("shape", list(Relaxation))
def test_forced_onto_a_node_the_eager_prepare_refuses(relaxed: Relaxed, shape: Relaxation) -> None:
    """Claims that select NRI nodes, allocated by hand to this node's devices and the pods bound to it:
    an eager node refuses each claim at Prepare (the pod waits, the event names the reason, the counter
    goes up) and creates nothing for it; the NRI node runs the pods."""
    node, ns = relaxed.node, relaxed.ns
    prefix = w.unique("forced")
    if shape is Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER:
        claims = two_claims(relaxed, prefix, (0, 1), selected=True)
        pod = create_pod(
            relaxed,
            pod_body(
                prefix, {"a": f"{prefix}-a", "b": f"{prefix}-b"}, [("main", ["a", "b"])], node_name=node.name
            ),
        )
        pods = [pod]
        allocations = {f"{prefix}-a": ({"gpu": "vgpu-0"}, pods), f"{prefix}-b": ({"gpu": "vgpu-1"}, pods)}
    else:
        requests = [
            w.nri_only(w.on_gpu(w.vgpu_request(r, "1Gi", "10"), i)) for i, r in enumerate(("r0", "r1"))
        ]
        claims = {prefix: w.create_claim(node, ns, prefix, requests)["metadata"]["uid"]}
        pods = [
            create_pod(
                relaxed,
                pod_body(
                    f"{prefix}-{r}",
                    {"gpu": prefix},
                    [("main", ["gpu"])],
                    node_name=node.name,
                    requests={"gpu": r},
                ),
            )
            for r in ("r0", "r1")
        ]
        allocations = {prefix: ({"r0": "vgpu-0", "r1": "vgpu-1"}, pods)}
    names = [p["metadata"]["name"] for p in pods]
    reason = RefusalReason(shape.value)
    before = refusals(node, reason)
    try:
        for claim, (devices, reserved) in allocations.items():
            allocate_by_hand(relaxed, claim, devices, reserved)
        if node.nri:
            for name in names:
                w.wait_running(node, ns, name)
            return
        for name in names:
            events = wait_refused(relaxed, name, reason)
            assert any(NEEDS_NRI in e["message"] for e in events), events
        assert refusals(node, reason) > before
        for uid in claims.values():
            assert not node.claim_dir(uid).exists()
            assert not node.cdi_spec(uid).exists()
            assert uid not in w.checkpoint_claims(node)
    finally:
        cleanup(relaxed, names, claims)

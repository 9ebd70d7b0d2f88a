"""The webhook against a real kube-apiserver: a ValidatingWebhookConfiguration points at `vgpud webhook`
(self-signed, 127.0.0.1), and the API server itself rejects what breaks the vGPU rules with our message
and admits the equivalent valid objects. Scoped to one namespace of its own, because the session's API
server is shared: nothing outside that namespace ever reaches the webhook, and the configuration is
deleted at the end."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.admission import DENIED, Answer, call, configuration
from tests.kubeapi import ApiServer, free_port
from tests.unit.webhook.builders import review
from tests.unit.webhook.process import WebhookProcess
from vgpud.webhook.tls import ensure_self_signed

DRIVER = "manager.nvidia.com"
NODE = "webhook-e2e-node"
RESOURCE = "/apis/resource.k8s.io/v1"


def gpu_claim(name: str, *requests: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": r, "exactly": {"deviceClassName": "vgpu-manager"}} for r in requests]
            }
        },
    }


def pod(name: str, claim: str, *containers: tuple[str, str | None]) -> dict[str, Any]:
    """Containers (name, request or None for the whole claim) of one pod on one named claim."""

    def claims(request: str | None) -> list[dict[str, str]]:
        return [{"name": "gpu"} if request is None else {"name": "gpu", "request": request}]

    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": ctr, "image": "busybox", "resources": {"claims": claims(request)}}
                for ctr, request in containers
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


@dataclass
class Cluster:
    api: ApiServer
    namespace: str
    webhook: WebhookProcess

    def path(self, kind: str, name: str = "") -> str:
        base = RESOURCE if kind.startswith("resourceclaim") else "/api/v1"
        return f"{base}/namespaces/{self.namespace}/{kind}" + (f"/{name}" if name else "")


def _ensure(api: ApiServer, path: str, body: dict[str, Any]) -> None:
    answer = call(api, "POST", path, body)
    assert answer.status in (201, 409), answer.body


def _wait_in_effect(cluster: Cluster, deadline: float = 30) -> None:
    """The API server picks up a new configuration asynchronously: probe with a dry-run violating pod
    (sideEffects None lets dry runs reach the webhook; nothing is stored)."""
    probe = pod("probe", "probe-claim", ("a", "r0"), ("b", "r0"))
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        answer = call(cluster.api, "POST", cluster.path("pods") + "?dryRun=All", probe)
        if answer.status == 403 and DENIED in answer.message:
            return
        time.sleep(0.2)
    raise AssertionError(f"the webhook configuration never took effect:\n{cluster.webhook.output()}")


@pytest.fixture(scope="module")
def cluster(kube_apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    api = kube_apiserver
    suffix = uuid.uuid4().hex[:8]
    namespace = f"vgpud-webhook-{suffix}"
    _ensure(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
    _ensure(
        api,
        f"{RESOURCE}/deviceclasses",
        {
            "metadata": {"name": "vgpu-manager"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    workdir: Path = tmp_path_factory.mktemp("webhook")
    webhook = WebhookProcess(workdir, port=free_port(), kubeconfig=api.kubeconfig)
    config_name = f"vgpud-e2e-{suffix}"
    config_path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{config_name}"
    try:
        webhook.wait_serving()
        created = call(
            api,
            "POST",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            configuration(config_name, namespace, webhook.url, webhook.ca_bundle()),
        )
        assert created.status == 201, created.body
        cluster = Cluster(api, namespace, webhook)
        # the probe's claim: a vGPU claim the dry-run pods can break a rule on
        assert call(api, "POST", cluster.path("resourceclaims"), gpu_claim("probe-claim", "r0")).status == 201
        _wait_in_effect(cluster)
        yield cluster
    finally:
        call(api, "DELETE", config_path)
        webhook.kill()
        call(api, "DELETE", f"/api/v1/namespaces/{namespace}")  # stays Terminating: no controllers here


def test_the_api_server_rejects_a_violating_pod_with_our_message(cluster: Cluster) -> None:
    claim = call(cluster.api, "POST", cluster.path("resourceclaims"), gpu_claim("gpu-claim", "r0", "r1"))
    assert claim.status == 201, claim.body

    bad = call(cluster.api, "POST", cluster.path("pods"), pod("bad", "gpu-claim", ("a", "r0"), ("b", "r0")))
    assert bad.status == 403, bad.body
    assert bad.body["reason"] == "Forbidden"
    assert bad.message == (
        f'{DENIED}pod {cluster.namespace}/bad: app container "b" uses request "r0" of vGPU claim '
        '"gpu-claim", which app container "a" also uses; a vGPU request may be used by at most one app '
        "container"
    )
    assert call(cluster.api, "GET", cluster.path("pods", "bad")).status == 404

    good = call(cluster.api, "POST", cluster.path("pods"), pod("good", "gpu-claim", ("a", "r0"), ("b", "r1")))
    assert good.status == 201, good.body
    assert good.warnings == []

    # the pod holds both requests now: another pod may use neither
    thief = call(cluster.api, "POST", cluster.path("pods"), pod("thief", "gpu-claim", ("x", "r1")))
    assert thief.status == 403, thief.body
    assert thief.message == (
        f'{DENIED}pod {cluster.namespace}/thief: app container "x" uses request "r1" of vGPU claim '
        f'"gpu-claim", which app container "b" of pod {cluster.namespace}/good also uses; a vGPU request '
        "may be used by one pod only"
    )


def test_a_template_claim_is_checked_from_the_template(cluster: Cluster) -> None:
    template = {"metadata": {"name": "gpu-template"}, "spec": {"spec": gpu_claim("unused", "r0")["spec"]}}
    path = cluster.path("resourceclaimtemplates")
    assert call(cluster.api, "POST", path, template).status == 201
    body = pod("templated", "unused", ("a", None), ("b", None))
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu-template"}]
    denied = call(cluster.api, "POST", cluster.path("pods"), body)
    assert denied.status == 403, denied.body
    assert denied.message == (
        f'{DENIED}pod {cluster.namespace}/templated: app container "b" uses request "r0" of vGPU claim "gpu" '
        '(generated from template "gpu-template"), which app container "a" also uses; a vGPU request may be '
        "used by at most one app container"
    )
    body["spec"]["containers"][1]["resources"] = {}
    assert call(cluster.api, "POST", cluster.path("pods"), body).status == 201


def test_a_reservation_is_rechecked_against_the_allocation(cluster: Cluster) -> None:
    """Pods created before their claim exists are admitted with a warning; when the scheduler would
    reserve the claim for two pods on one request, the API server refuses the status update."""
    api = cluster.api
    pods = {}
    for name in ("early-a", "early-b"):
        answer = call(api, "POST", cluster.path("pods"), pod(name, "late-claim", ("main", "r0")))
        assert answer.status == 201, answer.body
        # the Warning header quotes the text, so our quotes come back escaped
        warned = 'ResourceClaim \\"late-claim\\" does not exist yet'
        assert any(warned in warning for warning in answer.warnings), answer.warnings
        pods[name] = answer.body
    claim = call(api, "POST", cluster.path("resourceclaims"), gpu_claim("late-claim", "r0"))
    assert claim.status == 201, claim.body

    share_id = str(uuid.uuid4())  # an allocation is immutable once made

    def reserve(*names: str) -> Answer:
        body = dict(claim.body)
        body["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r0",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": "vgpu-0",
                            "shareID": share_id,
                        }
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": n, "uid": pods[n]["metadata"]["uid"]} for n in names
            ],
        }
        current = call(api, "GET", cluster.path("resourceclaims", "late-claim")).body
        body["metadata"] = current["metadata"]
        return call(api, "PUT", cluster.path("resourceclaims", "late-claim") + "/status", body)

    both = reserve("early-a", "early-b")
    assert both.status == 403, both.body
    assert both.message == (
        f'{DENIED}pod {cluster.namespace}/early-b: app container "main" uses request "r0" of vGPU claim '
        f'"late-claim", which app container "main" of pod {cluster.namespace}/early-a also uses; a vGPU '
        "request may be used by one pod only"
    )
    one = reserve("early-a")
    assert one.status == 200, one.body
    assert [r["name"] for r in one.body["status"]["reservedFor"]] == ["early-a"]
    assert reserve("early-a", "early-b").status == 403


def test_outside_the_namespace_nothing_reaches_the_webhook(cluster: Cluster) -> None:
    other = f"other-{uuid.uuid4().hex[:8]}"
    body = pod(other, "gpu-claim", ("a", "r0"), ("b", "r0"))
    answer = call(cluster.api, "POST", "/api/v1/namespaces/default/pods?dryRun=All", body)
    assert answer.status == 201, answer.body


TRUNCATED = json.dumps(review({"metadata": {"name": "x"}})).encode()[:-30]
NO_REQUEST = b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}'


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"garbage", 400, "bad AdmissionReview: the body is not JSON"),
        (TRUNCATED, 400, "bad AdmissionReview: the body is not JSON"),
        (NO_REQUEST, 400, "bad AdmissionReview: AdmissionReview.request is missing"),
        (b" " * (7 << 20), 400, f"request body of {7 << 20} bytes is over the limit of {6 << 20}"),
    ],
    ids=["garbage", "truncated", "no request", "oversized"],
)
def test_bad_bodies_get_a_clear_error_and_the_server_goes_on(
    cluster: Cluster, body: bytes, status: int, reason: str
) -> None:
    answer_status, answer = cluster.webhook.request("POST", "/validate", body)
    assert answer_status == status
    assert answer.decode().startswith(reason), answer
    config_map = {"metadata": {"name": "cm", "namespace": cluster.namespace}}
    assert (
        cluster.webhook.review(review(config_map, resource="configmaps", kind="ConfigMap"))["allowed"] is True
    )
    assert cluster.webhook.proc.poll() is None
    # and the API server still gets its answers
    probe = pod("p", "probe-claim", ("a", "r0"), ("b", "r0"))
    dry = call(cluster.api, "POST", cluster.path("pods") + "?dryRun=All", probe)
    assert (dry.status, dry.message.startswith(DENIED)) == (403, True), dry.body


def test_a_wrong_ca_bundle_is_logged_by_the_webhook_with_its_cause(cluster: Cluster, tmp_path: Path) -> None:
    """A configuration whose caBundle is another CA: the API server's TLS client (Go) refuses the
    serving certificate, every call fails, and the webhook's log says why, naming the caBundle."""
    api = cluster.api
    suffix = uuid.uuid4().hex[:8]
    namespace, config_name = f"vgpud-webhook-ca-{suffix}", f"vgpud-e2e-ca-{suffix}"
    config_path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{config_name}"
    other_ca = ensure_self_signed(tmp_path / "other", ["127.0.0.1"]).ca_bundle()
    _ensure(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        created = call(
            api,
            "POST",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            configuration(config_name, namespace, cluster.webhook.url, other_ca),
        )
        assert created.status == 201, created.body
        probe = pod("probe", "probe-claim", ("a", "r0"))
        end, answer = time.monotonic() + 30, None
        while time.monotonic() < end:  # until the API server has picked the configuration up
            answer = call(api, "POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
            if "failed calling webhook" in answer.message:
                break
            time.sleep(0.2)
        assert answer is not None and "failed calling webhook" in answer.message, answer
        assert "certificate signed by unknown authority" in answer.message
        expected = (  # the API server's Go client answers an unknown CA with a bad_certificate alert
            "failed: the client rejected the serving certificate (is the caBundle of the webhook "
            "configuration its CA, and does it name the host the client dials?) (SSLV3_ALERT_BAD_CERTIFICATE)"
        )
        end = time.monotonic() + 10
        while expected not in cluster.webhook.output() and time.monotonic() < end:
            time.sleep(0.1)
        lines = [line for line in cluster.webhook.output().splitlines() if expected in line]
        assert lines, cluster.webhook.output()
        assert "WARNING" in lines[0] and "TLS handshake with 127.0.0.1:" in lines[0]
    finally:
        call(api, "DELETE", config_path)
        call(api, "DELETE", f"/api/v1/namespaces/{namespace}")

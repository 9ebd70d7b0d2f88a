"""The webhook against a real kube-apiserver: a ValidatingWebhookConfiguration points at `vgpud webhook`
(self-signed, 127.0.0.1), and the API server itself rejects what breaks the vGPU rules with our message
and admits the equivalent valid objects. Scoped to one namespace of its own, because the session's API
server is shared: nothing outside that namespace ever reaches the webhook, and the configuration is
deleted at the end. A second webhook with both relaxations on (its own namespace) admits the relaxed
shapes for claims that select NRI nodes and denies them, with the fix, for claims that do not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.admission import DENIED, Answer, call, configuration
from tests.kubeapi import ApiServer, free_port
from tests.unit.webhook.builders import review
from tests.unit.webhook.process import WebhookProcess
from vgpud.relaxations import nri_selector, nri_selector_optional
from vgpud.webhook.tls import ensure_self_signed

DRIVER = "manager.nvidia.com"
NODE = "webhook-e2e-node"
RESOURCE = "/apis/resource.k8s.io/v1"
NRI_CLASS = "vgpu-manager-nri"


def gpu_claim(name: str, *requests: str, nri: bool = False) -> dict[str, Any]:
    """A vGPU claim; `nri`: each request selects NRI nodes by its own selector."""
    exactly: dict[str, Any] = {"deviceClassName": "vgpu-manager"}
    if nri:
        exactly["selectors"] = [{"cel": {"expression": nri_selector(DRIVER)}}]
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": r, "exactly": exactly} for r in requests]}},
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


@contextmanager
def webhook_cluster(
    api: ApiServer, tmp_path_factory: pytest.TempPathFactory, extra: Sequence[str] = ()
) -> Iterator[Cluster]:
    """A namespace of its own whose pods and claims go to a `vgpud webhook` run with `extra` flags."""
    suffix = uuid.uuid4().hex[:8]
    namespace = f"vgpud-webhook-{suffix}"
    _ensure(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
    for name, selectors in (("vgpu-manager", []), (NRI_CLASS, [nri_selector_optional(DRIVER)])):
        expressions = [f"device.driver == '{DRIVER}'", *selectors]
        spec = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
        _ensure(api, f"{RESOURCE}/deviceclasses", {"metadata": {"name": name}, "spec": spec})
    workdir: Path = tmp_path_factory.mktemp("webhook")
    webhook = WebhookProcess(workdir, port=free_port(), kubeconfig=api.kubeconfig, extra=extra)
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


@pytest.fixture(scope="module")
def cluster(kube_apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The webhook as deployed by default: no relaxation."""
    with webhook_cluster(kube_apiserver, tmp_path_factory) as cluster:
        yield cluster


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


def allocation(requests: Sequence[str]) -> list[dict[str, Any]]:
    """Allocation results of our driver for `requests`, one device each (an allocation is immutable
    once made: the same results are sent with every reservation)."""
    return [
        {"request": r, "driver": DRIVER, "pool": NODE, "device": f"vgpu-{n}", "shareID": str(uuid.uuid4())}
        for n, r in enumerate(requests)
    ]


def reserve_for(
    cluster: Cluster, claim: str, results: list[dict[str, Any]], pods: Sequence[dict[str, Any]]
) -> Answer:
    """The scheduler's status update: the claim allocated with `results` and reserved for `pods`."""
    body = call(cluster.api, "GET", cluster.path("resourceclaims", claim)).body
    body["status"] = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in pods
        ],
    }
    return call(cluster.api, "PUT", cluster.path("resourceclaims", claim) + "/status", body)


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

    results = allocation(("r0",))

    def reserve(*names: str) -> Answer:
        return reserve_for(cluster, "late-claim", results, [pods[n] for n in names])

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


# --------------------------------------------------------------------------------------------------
# Both relaxations on

RELAXED_FLAGS = (
    "--allow-multiple-vgpu-claims-per-container",
    "--allow-vgpu-claims-across-pods",
    "--vgpu-device-classes",
    f"vgpu-manager,{NRI_CLASS}",
    "--nri-device-classes",
    NRI_CLASS,
)
SELECTOR = nri_selector(DRIVER)
#: the fix a denial names: both selector forms
ADD = (
    f'add the selector "{SELECTOR}" (or, while some nodes run a vgpud that does not publish nriMode, '
    f'"{nri_selector_optional(DRIVER)}")'
)


@pytest.fixture(scope="module")
def relaxed(kube_apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with webhook_cluster(kube_apiserver, tmp_path_factory, RELAXED_FLAGS) as cluster:
        yield cluster


def two_claims_pod(name: str, first: str, second: str) -> dict[str, Any]:
    """One container on two named claims (one request of each)."""
    return {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {
                        "claims": [{"name": "one", "request": "r0"}, {"name": "two", "request": "r0"}]
                    },
                }
            ],
            "resourceClaims": [
                {"name": "one", "resourceClaimName": first},
                {"name": "two", "resourceClaimName": second},
            ],
        },
    }


def create_claims(cluster: Cluster, *claims: dict[str, Any]) -> None:
    for claim in claims:
        answer = call(cluster.api, "POST", cluster.path("resourceclaims"), claim)
        assert answer.status == 201, answer.body


def test_relaxed_two_claims_in_a_container_need_the_selector(relaxed: Cluster) -> None:
    by_class = {
        "metadata": {"name": "nri-b"},
        "spec": {"devices": {"requests": [{"name": "r0", "exactly": {"deviceClassName": NRI_CLASS}}]}},
    }
    create_claims(
        relaxed,
        gpu_claim("nri-a", "r0", nri=True),
        by_class,
        gpu_claim("nri-c", "r0", nri=True),
        gpu_claim("plain-a", "r0"),
    )
    admitted = call(relaxed.api, "POST", relaxed.path("pods"), two_claims_pod("nri", "nri-a", "nri-b"))
    assert admitted.status == 201, admitted.body

    denied = call(relaxed.api, "POST", relaxed.path("pods"), two_claims_pod("mixed", "nri-c", "plain-a"))
    assert denied.status == 403, denied.body
    assert denied.message == (
        f'{DENIED}pod {relaxed.namespace}/mixed: app container "main" uses 2 vGPU claims (claim "nri-c" '
        '(request "r0"), claim "plain-a" (request "r0")); a container may use several vGPU claims only when '
        f'each selects NRI nodes, and claim "plain-a" does not: {ADD} to each of its vGPU requests, or '
        f'request the NRI DeviceClass "{NRI_CLASS}"'
    )
    assert call(relaxed.api, "GET", relaxed.path("pods", "mixed")).status == 404


def test_relaxed_a_claim_across_pods_needs_the_selector_and_each_request_stays_one_pods(
    relaxed: Cluster,
) -> None:
    api = relaxed.api
    create_claims(relaxed, gpu_claim("shared", "r0", "r1", nri=True), gpu_claim("plain", "r0", "r1"))
    first = call(api, "POST", relaxed.path("pods"), pod("first", "shared", ("main", "r0")))
    assert first.status == 201, first.body
    second = call(api, "POST", relaxed.path("pods"), pod("second", "shared", ("main", "r1")))
    assert second.status == 201, second.body
    same = call(api, "POST", relaxed.path("pods"), pod("same", "shared", ("main", "r0")))
    assert same.status == 403, same.body
    assert same.message.endswith("a vGPU request may be used by one pod only"), same.message

    assert call(api, "POST", relaxed.path("pods"), pod("plain-1", "plain", ("main", "r0"))).status == 201
    denied = call(api, "POST", relaxed.path("pods"), pod("plain-2", "plain", ("main", "r1")))
    assert denied.status == 403, denied.body
    assert denied.message == (
        f'{DENIED}pod {relaxed.namespace}/plain-2: app container "main" uses request "r1" of vGPU claim '
        f'"plain", whose request "r0" app container "main" of pod {relaxed.namespace}/plain-1 uses; several '
        f'pods may use one vGPU claim only when it selects NRI nodes, and claim "plain" does not: {ADD} to '
        f'each of its vGPU requests, or request the NRI DeviceClass "{NRI_CLASS}"'
    )


def test_default_a_claim_across_pods_is_denied_naming_the_switch(cluster: Cluster) -> None:
    api = cluster.api
    create_claims(cluster, gpu_claim("nri-shared", "r0", "r1", nri=True))
    assert call(api, "POST", cluster.path("pods"), pod("holder", "nri-shared", ("main", "r0"))).status == 201
    denied = call(api, "POST", cluster.path("pods"), pod("other", "nri-shared", ("main", "r1")))
    assert denied.status == 403, denied.body
    assert denied.message == (
        f'{DENIED}pod {cluster.namespace}/other: app container "main" uses request "r1" of vGPU claim '
        f'"nri-shared", whose request "r0" app container "main" of pod {cluster.namespace}/holder uses; a '
        "vGPU claim may be used by one pod only; the webhook's switch --allow-vgpu-claims-across-pods lifts "
        "this for claims that select NRI nodes"
    )


def test_relaxed_a_reservation_for_several_pods_needs_the_selector(relaxed: Cluster) -> None:
    """Pods created before their claims (admitted with a warning); the scheduler's reservation of a
    claim for two pods, one request each, is admitted for a claim that selects NRI nodes only."""
    api = relaxed.api
    pods = {}
    for name, claim, request in (
        ("la", "late-nri", "r0"),
        ("lb", "late-nri", "r1"),
        ("pa", "late-plain", "r0"),
        ("pb", "late-plain", "r1"),
    ):
        answer = call(api, "POST", relaxed.path("pods"), pod(name, claim, ("main", request)))
        assert answer.status == 201, answer.body
        pods[name] = answer.body
    create_claims(relaxed, gpu_claim("late-nri", "r0", "r1", nri=True), gpu_claim("late-plain", "r0", "r1"))
    nri = reserve_for(relaxed, "late-nri", allocation(("r0", "r1")), [pods["la"], pods["lb"]])
    assert nri.status == 200, nri.body
    plain = reserve_for(relaxed, "late-plain", allocation(("r0", "r1")), [pods["pa"], pods["pb"]])
    assert plain.status == 403, plain.body
    assert plain.message.startswith(
        f'{DENIED}pod {relaxed.namespace}/pb: app container "main" uses request "r1" of vGPU claim '
        f'"late-plain", whose request "r0" app container "main" of pod {relaxed.namespace}/pa uses; several '
        "pods may use one vGPU claim only when it selects NRI nodes"
    ), plain.message

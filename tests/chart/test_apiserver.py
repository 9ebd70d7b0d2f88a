"""The rendered chart against a real kube-apiserver: every manifest of every variant passes a
server-side dry run with strict field validation (schemas, CEL selectors, pod security fields, webhook
configuration rules), and an upgrade keeps the webhook certificate the cluster already has."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import yaml

from tests.chart.apiserver import create, create_namespace, install_crds
from tests.chart.chart import CHART, VARIANTS, Values, Variant, one, render, run_helm
from tests.kubeapi import ApiServer


def isolated(values: Values, tag: str) -> dict[str, Any]:
    """`values` with DeviceClass names of this test's own: the session's API server is shared, and a
    dry-run create of a name that exists (another test's `vgpu-manager`) is refused as a conflict."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    classes = values.get("deviceClasses", defaults["deviceClasses"])
    return {**values, "deviceClasses": [{**c, "name": f"{c['name']}-{tag}"} for c in classes]}


@pytest.fixture(scope="module")
def namespace(kube_apiserver: ApiServer) -> str:
    """The release namespace, created for real (a dry run of namespaced objects needs it)."""
    name = f"vgpud-chart-{secrets.token_hex(3)}"
    create_namespace(kube_apiserver, name)
    return name


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_every_manifest_passes_a_server_side_dry_run(
    kube_apiserver: ApiServer, namespace: str, variant: Variant
) -> None:
    if variant.crds:
        install_crds(kube_apiserver, variant.crds)
    tag = secrets.token_hex(3)
    manifests = render(isolated(variant.values, tag), release=f"dry-{tag}", namespace=namespace)
    assert manifests
    for manifest in manifests:
        answer = create(kube_apiserver, manifest, dry_run=True)
        assert answer["kind"] == manifest["kind"]
        assert answer["metadata"]["name"] == manifest["metadata"]["name"]


def test_upgrade_keeps_the_webhook_certificate_in_the_cluster(kube_apiserver: ApiServer) -> None:
    """The first install makes a CA and serving certificate; a later render with the cluster at hand
    (an upgrade: `lookup` sees the Secret) keeps both, so the caBundle stays what the webhook serves."""
    tag = secrets.token_hex(3)
    namespace, release, values = f"vgpud-upgrade-{tag}", f"up-{tag}", isolated({}, tag)
    create_namespace(kube_apiserver, namespace)
    first = render(values, release=release, namespace=namespace)
    secret = one(first, "Secret", "-webhook-tls")
    # without the cluster every render makes a new CA: the comparison below can fail
    again = render(values, release=release, namespace=namespace)
    assert one(again, "Secret", "-webhook-tls")["data"] != secret["data"]
    # what the first `helm install` leaves: the Secret, owned by the release
    secret["metadata"]["annotations"] = {
        "meta.helm.sh/release-name": release,
        "meta.helm.sh/release-namespace": namespace,
    }
    create(kube_apiserver, secret, dry_run=False)

    done = run_helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--dry-run=server",
        "--kubeconfig",
        str(kube_apiserver.kubeconfig),
        values=values,
    )
    assert done.returncode == 0, done.stderr
    upgraded = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert one(upgraded, "Secret", "-webhook-tls")["data"] == secret["data"]
    (hook,) = one(upgraded, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]

"""Talking to a real kube-apiserver through a `vgpud webhook` (tests/unit/webhook/process.py): the
ValidatingWebhookConfiguration scoped to one namespace, and API calls that return 4xx answers instead of
raising, so a test reads the API server's own denial. Shared by the webhook's apiserver test and the
node e2e of the relaxations."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.kubeapi import ApiServer

WEBHOOK_NAME = "vgpu.manager.nvidia.com"
DENIED = f'admission webhook "{WEBHOOK_NAME}" denied the request: '


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    warnings: list[str]

    @property
    def message(self) -> str:
        return self.body.get("message", "")


def call(api: ApiServer, method: str, path: str, body: Any = None) -> Answer:
    """One API request; the status, the JSON body and the Warning headers, for 4xx answers too."""
    request = urllib.request.Request(
        f"{api.url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=api.ssl_context()) as response:
            return Answer(
                response.status, json.loads(response.read()), response.headers.get_all("Warning") or []
            )
    except urllib.error.HTTPError as err:
        return Answer(err.code, json.loads(err.read() or b"{}"), err.headers.get_all("Warning") or [])


def configuration(name: str, namespace: str, url: str, ca_bundle: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "clientConfig": {"url": url, "caBundle": ca_bundle},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    },
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaims/status"],
                        "scope": "Namespaced",
                    },
                ],
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
                # the session's API server is shared: only this test's namespace goes to the webhook
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            }
        ],
    }


CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


@contextmanager
def registered(api: ApiServer, prefix: str, namespace: str, url: str, ca_bundle: str) -> Iterator[str]:
    """A ValidatingWebhookConfiguration `<prefix>-<random>` sending `namespace`'s reviews to `url`,
    deleted at the end; its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        created = call(api, "POST", CONFIGURATIONS, configuration(name, namespace, url, ca_bundle))
        assert created.status == 201, created.body
        yield name
    finally:
        call(api, "DELETE", f"{CONFIGURATIONS}/{name}")

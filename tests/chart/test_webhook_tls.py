"""The certificate the chart makes at install, served by `vgpud webhook` started with the chart's own
environment: a client that trusts only the configuration's caBundle and checks the Service's DNS name
(as the API server does) gets an answer on the readiness probe's path."""

from __future__ import annotations

import base64
import http.client
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.chart.chart import NAMESPACE, RELEASE, container, one, render, resolved_env
from tests.kubeapi import free_port

SERVE_TIMEOUT_S = 30.0
#: the port, a client context trusting only the caBundle, the log
Served = tuple[int, ssl.SSLContext, Path]


def kubeconfig(path: Path) -> Path:
    """A kubeconfig the webhook can load; it makes no API call before its first review."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """`vgpud webhook` with the rendered env (the pod IP is 127.0.0.1, the Secret's files under tmp)."""
    manifests = render()
    secret = one(manifests, "Secret", "-webhook-tls")
    deployment = one(manifests, "Deployment", "-webhook")
    mount = Path(container(deployment)["volumeMounts"][0]["mountPath"])
    env = resolved_env(deployment)
    port = free_port()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    env |= {
        "POD_IP": "127.0.0.1",
        "WEBHOOK_ADDRESS": "127.0.0.1",
        "WEBHOOK_PORT": str(port),
        "WEBHOOK_TLS_CERT_FILE": str(tmp_path / Path(env["WEBHOOK_TLS_CERT_FILE"]).relative_to(mount)),
        "WEBHOOK_TLS_KEY_FILE": str(tmp_path / Path(env["WEBHOOK_TLS_KEY_FILE"]).relative_to(mount)),
        "KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig")),
    }
    (hook,) = one(manifests, "ValidatingWebhookConfiguration")["webhooks"]
    context = ssl.create_default_context(cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode())
    log = tmp_path / "webhook.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vgpud", "webhook"],
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield port, context, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def healthz(port: int, context: ssl.SSLContext, hostname: str) -> tuple[int, bytes]:
    """GET /healthz on 127.0.0.1, with TLS checked against `hostname` (the name the API server dials)."""
    sock = ssl.create_connection(("127.0.0.1", port), timeout=5)
    tls = context.wrap_socket(sock, server_hostname=hostname)
    conn = http.client.HTTPSConnection(hostname, port, timeout=5)
    conn.sock = tls
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_vgpud_webhook_serves_the_certificate_made_at_install(served: Served) -> None:
    port, context, log = served
    service = f"{RELEASE}-webhook.{NAMESPACE}.svc"
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    last = "nothing yet"
    while time.monotonic() < deadline:
        try:
            status, body = healthz(port, context, service)
            assert (status, body) == (200, b"ok\n")
            break
        except (ConnectionRefusedError, ConnectionResetError) as err:
            last = repr(err)  # not listening yet
            time.sleep(0.1)
    else:
        raise AssertionError(f"not serving in {SERVE_TIMEOUT_S:g}s ({last}):\n{log.read_text()}")
    # a name the certificate does not hold is refused: the check above could fail
    with pytest.raises(ssl.SSLCertVerificationError):
        healthz(port, context, "vgpud-webhook.elsewhere.svc")

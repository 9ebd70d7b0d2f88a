"""`vgpud webhook` as a process: usage errors, start-up failures, a run from start to SIGTERM with a
self-signed certificate and an API server that does not answer (so every look-up fails closed), and the
drain between SIGTERM and the stop (--shutdown-delay)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import objects as o
from tests.kubeapi import free_port
from tests.unit.webhook.builders import review
from tests.unit.webhook.process import ENTRY, WebhookProcess

#: a short --shutdown-delay, long enough to see the drain from outside
DELAY_S = 1.5


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *ENTRY, *argv], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def dead_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that loads but whose API server does not answer."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def webhook(
    tmp_path: Path, dead_kubeconfig: Path, request: pytest.FixtureRequest
) -> Iterator[WebhookProcess]:
    """Its --shutdown-delay is the test's parameter (indirect); without one 0: it stops at SIGTERM."""
    delay = str(getattr(request, "param", 0))
    process = WebhookProcess(
        tmp_path, port=free_port(), kubeconfig=dead_kubeconfig, extra=("--shutdown-delay", delay)
    )
    try:
        process.wait_serving()
        yield process
    finally:
        process.kill()


def test_help_and_usage_errors() -> None:
    assert run("--help").returncode == 0
    done = run("--port", "1")
    assert done.returncode == 2
    assert done.stderr == (
        "vgpud webhook: error: the webhook serves HTTPS: give --tls-cert-file and --tls-key-file, "
        "or --self-signed DIR\n"
    )


def test_unreadable_certificates_exit_1(tmp_path: Path) -> None:
    done = run("--tls-cert-file", str(tmp_path / "no.crt"), "--tls-key-file", str(tmp_path / "no.key"))
    assert done.returncode == 1
    assert "cannot load certificate" in done.stderr


def test_no_kubernetes_configuration_exits_1(tmp_path: Path) -> None:
    done = run("--self-signed", str(tmp_path / "tls"), "--kubeconfig", str(tmp_path / "missing"))
    assert done.returncode == 1
    assert "no Kubernetes API" in done.stderr


def test_a_taken_port_exits_1(tmp_path: Path, dead_kubeconfig: Path, webhook: WebhookProcess) -> None:
    done = run(
        "--self-signed", str(tmp_path / "tls2"), "--kubeconfig", str(dead_kubeconfig),
        "--address", "127.0.0.1", "--port", str(webhook.port),
    )  # fmt: skip
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{webhook.port}" in done.stderr


def test_serves_until_sigterm(webhook: WebhookProcess) -> None:
    assert webhook.ca_bundle()  # printed for the webhook configuration
    not_ours = review(
        {"metadata": {"name": "cm", "namespace": "default"}}, resource="configmaps", kind="ConfigMap"
    )
    assert webhook.review(not_ours)["allowed"] is True
    pod = o.pod("p", o.POD1_UID, containers=[o.container("a", o.ref("gpu"))])
    failed = webhook.review(review(pod))
    assert (failed["allowed"], failed["status"]["code"]) == (False, 500)
    assert failed["status"]["message"].startswith("vgpud webhook could not check pods default/p: ")
    assert webhook.request("POST", "/validate", b"{not json")[0] == 400
    # the pod cache cannot list either; the webhook stays healthy through its grace period (reviews
    # list their namespace meanwhile, and fail closed here)
    assert webhook.request("GET", "/healthz")[0] == 200
    status, metrics = webhook.request("GET", "/metrics")
    assert status == 200
    assert b'vgpud_webhook_reviews_total{kind="pods",operation="CREATE",result="error"} 1.0' in metrics
    assert webhook.stop() == 0
    assert "SIGTERM received: stopping" in webhook.output()
    assert "serving admission reviews on https://127.0.0.1:" in webhook.output()
    assert "component webhook-pod-cache is healthy (ready)" in webhook.output()
    assert "webhook stopped" in webhook.output()


def wait_draining(webhook: WebhookProcess, deadline: float = 10) -> None:
    """Poll /healthz until it stops answering 200 (the signal is handled); it must answer 503
    "draining" then."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        status, body = webhook.request("GET", "/healthz")
        if status != 200:
            assert (status, body) == (503, b"draining\n")
            return
        time.sleep(0.05)
    raise AssertionError(f"/healthz still 200 {deadline}s after SIGTERM:\n{webhook.output()}")


@pytest.mark.parametrize("webhook", [DELAY_S], indirect=True)
def test_sigterm_drains_for_the_shutdown_delay_then_stops(webhook: WebhookProcess) -> None:
    """During the delay the process still answers (a review, /healthz with 503), then exits 0."""
    signalled = time.monotonic()
    webhook.proc.send_signal(signal.SIGTERM)
    wait_draining(webhook)
    not_ours = review(
        {"metadata": {"name": "cm", "namespace": "default"}}, resource="configmaps", kind="ConfigMap"
    )
    assert webhook.review(not_ours)["allowed"] is True
    assert webhook.proc.wait(timeout=DELAY_S + 15) == 0
    assert time.monotonic() - signalled >= DELAY_S  # it did not stop before the delay was over
    output = webhook.output()
    assert (
        f"SIGTERM received: draining for {DELAY_S:g} s (readiness fails, each connection closes after "
        "its answer), then stopping" in output
    )
    assert f"drained for {DELAY_S:g} s: stopping" in output
    assert "webhook stopped" in output


@pytest.mark.parametrize("webhook", [300], indirect=True)
def test_a_second_signal_stops_a_drain_at_once(webhook: WebhookProcess) -> None:
    webhook.proc.send_signal(signal.SIGTERM)
    wait_draining(webhook)  # the first signal is handled: a second is not folded into it
    webhook.proc.send_signal(signal.SIGINT)
    assert webhook.proc.wait(timeout=15) == 0  # far within the 300 s delay
    output = webhook.output()
    assert "SIGINT received while draining: stopping now" in output
    assert "drained for" not in output
    assert "webhook stopped" in output

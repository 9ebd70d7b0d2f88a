"""`vgpud webhook`: the admission webhook as its own process (in a cluster, a Deployment behind a Service).

What can fail for good is checked before Trio starts and ends the process with exit 1: the serving
certificate (or making the self-signed one), the Kubernetes API configuration and the listening
socket. Then three supervised components run until SIGTERM or SIGINT, each restarting with backoff:
the HTTPS server, the certificate watcher and the pod cache (vgpud.webhook.podcache: every pod of the
cluster, trimmed and indexed by claim, which reviews read instead of listing their namespace). The
pod cache's restarts are jittered, so the webhook's replicas do not call the API server in step; its
failures make the webhook unhealthy only after a grace period, as the node daemon's API components'
do (reviews list their namespace meanwhile), and it is healthy while it lists at start for the same
reason.

On the first SIGTERM or SIGINT the webhook drains for `--shutdown-delay` seconds (5; 0: not at all)
before it stops: /healthz answers 503, every answer closes its connection, kept-alive connections idle
between requests close (WebhookServer.drain), and reviews are still answered meanwhile, as the API
server stops sending them only a moment after the pod is marked terminating. Then the supervisor
cancels every component (SHUTDOWN_TIMEOUT_S to close). A second signal during the delay stops at once.

`python -m vgpud.webhook.main ARGS` runs the same thing as `vgpud webhook ARGS`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from functools import partial

import trio

from vgpud import __version__
from vgpud.kube.api import KubeError
from vgpud.logs import configure_logging
from vgpud.options import ConfigError
from vgpud.recorder import Recorder
from vgpud.supervisor import Backoff, HealthAfter, Restart, Supervisor
from vgpud.webhook.admit import Admitter
from vgpud.webhook.config import WebhookSettings, add_webhook_arguments, webhook_settings_from
from vgpud.webhook.lookup import KubeLookup
from vgpud.webhook.metrics import WebhookMetrics
from vgpud.webhook.server import WebhookServer
from vgpud.webhook.tls import ReloadingTls, TlsError, ensure_self_signed

log = logging.getLogger("vgpud.webhook")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
SHUTDOWN_TIMEOUT_S = 10.0


def run_webhook(settings: WebhookSettings) -> int:
    """Serve until SIGTERM/SIGINT; the exit code."""
    log.info("vgpud %s webhook starting (%s)", __version__, settings.policy)
    metrics = WebhookMetrics()
    try:
        tls = _tls(settings, metrics)
        tls.load()
    except TlsError as err:
        log.error("%s", err)
        return EXIT_FAILURE
    try:
        lookup = KubeLookup.from_config(settings.kubeconfig)
    except KubeError as err:
        log.error("no Kubernetes API: %s", err)
        return EXIT_FAILURE
    try:
        return trio.run(_main, settings, tls, lookup, metrics)
    finally:
        lookup.close()


def _tls(settings: WebhookSettings, metrics: WebhookMetrics) -> ReloadingTls:
    if settings.self_signed_dir is None:
        assert settings.tls_cert_file is not None and settings.tls_key_file is not None
        return ReloadingTls(settings.tls_cert_file, settings.tls_key_file, metrics)
    made = ensure_self_signed(settings.self_signed_dir, settings.certificate_hosts, settings.service_name)
    # stdout carries exactly this line: what the webhook configuration's clientConfig.caBundle needs
    print(f"caBundle: {made.ca_bundle()}", flush=True)
    return ReloadingTls(made.cert, made.key, metrics)


async def _main(
    settings: WebhookSettings, tls: ReloadingTls, lookup: KubeLookup, metrics: WebhookMetrics
) -> int:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            listeners = await trio.open_tcp_listeners(settings.port, host=settings.address)
        except OSError as err:
            log.error("cannot listen on %s:%d: %s", settings.address, settings.port, err)
            return EXIT_FAILURE
        try:
            recorder = Recorder()
            admitter = Admitter(lookup, settings.policy, recorder=recorder)
            async with Supervisor(shutdown_timeout=SHUTDOWN_TIMEOUT_S) as supervisor:
                server = WebhookServer(
                    admitter, lambda: tls.context, metrics, healthy=supervisor.health.all_healthy
                )
                supervisor.supervise("webhook", partial(server.serve, listeners), Restart())
                supervisor.supervise(
                    "webhook-tls", partial(tls.watch, settings.tls_reload_interval), Restart()
                )
                supervisor.supervise(
                    "webhook-pod-cache",
                    lookup.pod_cache.run,
                    Restart(Backoff(jitter=0.5)),
                    HealthAfter(),
                )
                host, port = listeners[0].socket.getsockname()[:2]
                log.info("serving admission reviews on https://%s:%d/validate", host, port)
                await _until_stopped(signals, server, settings.shutdown_delay)
                supervisor.cancel()
            recorder.close()
        finally:
            for listener in listeners:
                await listener.aclose()
    log.info("webhook stopped")
    return EXIT_OK


async def _until_stopped(signals: AsyncIterator[int], server: WebhookServer, delay: float) -> None:
    """Return on the first signal when `delay` is 0; otherwise drain the server for `delay` seconds
    first (the API server keeps calling for a moment), or until a second signal."""
    name = signal.Signals(await anext(signals)).name
    if delay <= 0:
        log.info("%s received: stopping", name)
        return
    log.info(
        "%s received: draining for %g s (readiness fails, each connection closes after its answer), "
        "then stopping",
        name,
        delay,
    )
    server.drain()
    with trio.move_on_after(delay):
        again = signal.Signals(await anext(signals)).name
        log.info("%s received while draining: stopping now", again)
        return
    log.info("drained for %g s: stopping", delay)


def command(args: argparse.Namespace) -> int:
    """`vgpud webhook` once argparse has run: settings (ConfigError propagates), logging, serve."""
    settings = webhook_settings_from(args)
    configure_logging(settings.log_level, settings.log_format)
    return run_webhook(settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vgpud webhook",
        description="Serve the vGPU admission rules as a validating webhook (admission.k8s.io/v1).",
    )
    add_webhook_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except ConfigError as err:
        print(f"vgpud webhook: error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())

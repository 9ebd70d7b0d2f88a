"""Settings of `vgpud webhook`, in the style of `vgpud run` (vgpud.config): every setting a flag and an
environment variable, flag over environment over default, all checked before anything starts, a bad
value a `ConfigError` naming the flag (the CLI prints one line and exits 2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from vgpud.config import OPTIONS
from vgpud.options import ConfigError, Option, add_arguments, resolve
from vgpud.parsers import (
    absolute_path,
    boolean,
    dns_subdomain,
    dns_subdomain_list,
    dns_subdomains,
    hosts,
    int_in,
    ip_address,
    number_in,
)
from vgpud.relaxations import Relaxation
from vgpud.webhook.claims import DEFAULT_VGPU_CLASSES, Policy
from vgpud.webhook.violations import SWITCHES


def _switch(dest: str, relaxation: Relaxation, what: str) -> Option:
    """The switch of a relaxation: its flag from `violations.SWITCHES`, its variable the flag in capitals."""
    flag = SWITCHES[relaxation]
    env = flag.removeprefix("--").replace("-", "_").upper()
    return Option(dest, flag, env, boolean, "false", what, switch=True)


#: options shared with `vgpud run`, declared once in vgpud.config
_SHARED_DESTS = ("driver_name", "kubeconfig", "log_level", "log_format")
_SHARED = {option.dest: option for option in OPTIONS if option.dest in _SHARED_DESTS}

WEBHOOK_OPTIONS: tuple[Option, ...] = (
    Option("address", "--address", "WEBHOOK_ADDRESS", ip_address, "0.0.0.0", "address to listen on", "ADDR"),
    Option(
        "port", "--port", "WEBHOOK_PORT", int_in(0, 65535), "9443", "HTTPS port (0: any free port)", "PORT"
    ),
    Option(
        "tls_cert_file",
        "--tls-cert-file",
        "WEBHOOK_TLS_CERT_FILE",
        absolute_path,
        None,
        "serving certificate (PEM, chain allowed); reloaded when it changes",
        "FILE",
        unset="none: give it with --tls-key-file, or --self-signed",
    ),
    Option(
        "tls_key_file",
        "--tls-key-file",
        "WEBHOOK_TLS_KEY_FILE",
        absolute_path,
        None,
        "private key of --tls-cert-file (PEM); reloaded when it changes",
        "FILE",
        unset="none",
    ),
    Option(
        "tls_reload_interval",
        "--tls-reload-interval",
        "WEBHOOK_TLS_RELOAD_INTERVAL",
        int_in(1, 3600),
        "10",
        "seconds between checks whether the certificate or key file changed",
        "SECONDS",
    ),
    Option(
        "shutdown_delay",
        "--shutdown-delay",
        "WEBHOOK_SHUTDOWN_DELAY",
        number_in(0, 300),
        "5",
        "seconds the webhook keeps answering after SIGTERM, with /healthz failing and each connection "
        "closed after its answer, while the API server stops sending it reviews (0: stop at once)",
        "SECONDS",
    ),
    Option(
        "self_signed_dir",
        "--self-signed",
        "WEBHOOK_SELF_SIGNED_DIR",
        absolute_path,
        None,
        "development: make a CA and serving certificate in DIR (reused when there), print the caBundle "
        "for the webhook configuration; instead of --tls-cert-file/--tls-key-file",
        "DIR",
        unset="none",
    ),
    Option(
        "self_signed_hosts",
        "--self-signed-hosts",
        "WEBHOOK_SELF_SIGNED_HOSTS",
        hosts,
        "",
        "extra comma-separated DNS names and IPs for the self-signed certificate "
        "(always: localhost, 127.0.0.1 and the Service's names); only with --self-signed",
        "HOSTS",
        unset="none",
    ),
    Option(
        "service_name",
        "--service-name",
        "WEBHOOK_SERVICE_NAME",
        dns_subdomain,
        "vgpud-webhook",
        "the webhook's Service, for the self-signed certificate's names (used with --self-signed)",
        "NAME",
    ),
    Option(
        "service_namespace",
        "--service-namespace",
        "POD_NAMESPACE",
        dns_subdomain,
        "default",
        "the Service's namespace, for the self-signed certificate's names (used with --self-signed)",
        "NAMESPACE",
    ),
    Option(
        "vgpu_device_classes",
        "--vgpu-device-classes",
        "VGPU_DEVICE_CLASSES",
        dns_subdomains,
        ",".join(sorted(DEFAULT_VGPU_CLASSES)),
        "comma-separated DeviceClass names whose requests are vGPU requests",
        "CLASSES",
    ),
    Option(
        "nri_device_classes",
        "--nri-device-classes",
        "VGPU_NRI_DEVICE_CLASSES",
        dns_subdomain_list,
        "",
        "comma-separated vGPU DeviceClasses (of --vgpu-device-classes) that select only devices of NRI "
        "nodes: a request of one selects NRI nodes, as one with the nriMode selector does; only with a "
        "relaxation switch on",
        "CLASSES",
        unset="none",
    ),
    _switch(
        "allow_multiple_vgpu_claims_per_container",
        Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER,
        "let a container use several vGPU claims when each of them selects NRI nodes (an eager node "
        "gives such a container colliding register identities and mounts)",
    ),
    _switch(
        "allow_vgpu_claims_across_pods",
        Relaxation.CLAIM_ACROSS_PODS,
        "let several pods use one vGPU claim (each request still by one pod) when it selects NRI nodes "
        "(an eager node's partitions cannot span pods)",
    ),
    *(_SHARED[dest] for dest in _SHARED_DESTS),
)


@dataclass(frozen=True)
class WebhookSettings:
    address: str
    port: int
    tls_cert_file: Path | None
    tls_key_file: Path | None
    tls_reload_interval: int
    shutdown_delay: float
    self_signed_dir: Path | None
    self_signed_hosts: tuple[str, ...]
    service_name: str
    service_namespace: str
    vgpu_device_classes: tuple[str, ...]
    nri_device_classes: tuple[str, ...]
    allow_multiple_vgpu_claims_per_container: bool
    allow_vgpu_claims_across_pods: bool
    driver_name: str
    kubeconfig: Path | None
    log_level: str
    log_format: str

    @property
    def relaxations(self) -> frozenset[Relaxation]:
        switches = {
            Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER: self.allow_multiple_vgpu_claims_per_container,
            Relaxation.CLAIM_ACROSS_PODS: self.allow_vgpu_claims_across_pods,
        }
        return frozenset(relaxation for relaxation, on in switches.items() if on)

    @property
    def policy(self) -> Policy:
        return Policy(
            driver=self.driver_name,
            vgpu_classes=frozenset(self.vgpu_device_classes),
            nri_classes=frozenset(self.nri_device_classes),
            relaxations=self.relaxations,
        )

    @property
    def certificate_hosts(self) -> tuple[str, ...]:
        """SANs of the self-signed certificate: loopback, the Service's DNS names, the extra hosts."""
        name, namespace = self.service_name, self.service_namespace
        service = (
            name,
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
        )
        return tuple(dict.fromkeys(("localhost", "127.0.0.1", *service, *self.self_signed_hosts)))

    def summary(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}


def add_webhook_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options; values stay raw strings until `webhook_settings_from` resolves them."""
    add_arguments(parser, WEBHOOK_OPTIONS)


def webhook_settings_from(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> WebhookSettings:
    """Resolve flag > environment > default for every option, validate, and check combinations."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {option.dest: resolve(option, args, environ, None) for option in WEBHOOK_OPTIONS}
    settings = WebhookSettings(**values)
    _check(settings)
    return settings


def _check(settings: WebhookSettings) -> None:
    _check_nri_classes(settings)
    files = (settings.tls_cert_file, settings.tls_key_file)
    if settings.self_signed_dir is not None:
        if any(path is not None for path in files):
            raise ConfigError(
                "--self-signed replaces --tls-cert-file and --tls-key-file: give one or the other"
            )
        return
    if settings.self_signed_hosts:
        raise ConfigError("--self-signed-hosts is only used with --self-signed")
    if files == (None, None):
        raise ConfigError(
            "the webhook serves HTTPS: give --tls-cert-file and --tls-key-file, or --self-signed DIR"
        )
    if None in files:
        raise ConfigError("--tls-cert-file and --tls-key-file go together: give both")


def _check_nri_classes(settings: WebhookSettings) -> None:
    """NRI classes are vGPU classes, and only serve a relaxation (a setting that does nothing is refused)."""
    if not settings.nri_device_classes:
        return
    if not settings.relaxations:
        switches = " or ".join(SWITCHES[relaxation] for relaxation in Relaxation)
        raise ConfigError(f"--nri-device-classes is only used with {switches}")
    for name in settings.nri_device_classes:
        if name not in settings.vgpu_device_classes:
            raise ConfigError(
                f"--nri-device-classes: {name!r} is not one of --vgpu-device-classes "
                f"({','.join(settings.vgpu_device_classes)})"
            )

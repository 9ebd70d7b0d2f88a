"""`vgpud webhook` settings: defaults, flag over environment over default, and refused combinations."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vgpud.options import ConfigError
from vgpud.relaxations import Relaxation
from vgpud.webhook.claims import Policy
from vgpud.webhook.config import WebhookSettings, add_webhook_arguments, webhook_settings_from

TLS = ["--tls-cert-file", "/etc/tls/tls.crt", "--tls-key-file", "/etc/tls/tls.key"]


def _settings(argv: list[str], env: dict[str, str] | None = None) -> WebhookSettings:
    parser = argparse.ArgumentParser()
    add_webhook_arguments(parser)
    return webhook_settings_from(parser.parse_args(argv), env or {})


def test_defaults() -> None:
    s = _settings(TLS)
    assert (s.address, s.port, s.tls_reload_interval, s.shutdown_delay) == ("0.0.0.0", 9443, 10, 5.0)
    assert (s.tls_cert_file, s.tls_key_file) == (Path("/etc/tls/tls.crt"), Path("/etc/tls/tls.key"))
    assert s.policy == Policy(driver="manager.nvidia.com", vgpu_classes=frozenset({"vgpu-manager"}))
    assert (s.policy.nri_classes, s.policy.relaxations) == (frozenset(), frozenset())
    assert s.self_signed_dir is None
    assert (s.kubeconfig, s.log_level, s.log_format) == (None, "info", "text")
    assert _settings(TLS, {"LOG_FORMAT": "json"}).log_format == "json"


def test_flags_beat_the_environment() -> None:
    env = {
        "WEBHOOK_PORT": "8443",
        "WEBHOOK_ADDRESS": "10.0.0.1",
        "VGPU_DEVICE_CLASSES": "a, b,a",
        "VGPU_NRI_DEVICE_CLASSES": "b",
        "ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER": "true",
        "ALLOW_VGPU_CLAIMS_ACROSS_PODS": "true",
        "DRIVER_NAME": "vgpu.example.com",
        "WEBHOOK_TLS_CERT_FILE": "/env/tls.crt",
        "WEBHOOK_TLS_KEY_FILE": "/env/tls.key",
        "WEBHOOK_SHUTDOWN_DELAY": "2.5",
    }
    s = _settings(["--port", "7443", "--allow-vgpu-claims-across-pods"], env)
    assert (s.port, s.address, s.tls_cert_file) == (7443, "10.0.0.1", Path("/env/tls.crt"))
    assert s.shutdown_delay == 2.5
    assert _settings(["--shutdown-delay", "0"], env).shutdown_delay == 0  # 0: stop at once
    assert s.policy == Policy(
        "vgpu.example.com", frozenset({"a", "b"}), frozenset({"b"}), frozenset(Relaxation)
    )
    assert s.vgpu_device_classes == ("a", "b")


@pytest.mark.parametrize(
    ("argv", "env", "relaxations"),
    [
        ([], {}, set()),
        (["--allow-multiple-vgpu-claims-per-container"], {}, {Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER}),
        (["--allow-vgpu-claims-across-pods"], {}, {Relaxation.CLAIM_ACROSS_PODS}),
        (
            [],
            {"ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER": "true"},
            {Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER},
        ),
        ([], {"ALLOW_VGPU_CLAIMS_ACROSS_PODS": "yes"}, {Relaxation.CLAIM_ACROSS_PODS}),
        ([], {"ALLOW_VGPU_CLAIMS_ACROSS_PODS": "false"}, set()),
        (
            ["--allow-vgpu-claims-across-pods"],
            {"ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER": "on"},
            set(Relaxation),
        ),
        # the flag beats the environment
        (
            ["--allow-vgpu-claims-across-pods"],
            {"ALLOW_VGPU_CLAIMS_ACROSS_PODS": "false"},
            {Relaxation.CLAIM_ACROSS_PODS},
        ),
    ],
)
def test_each_relaxation_has_its_own_switch(
    argv: list[str], env: dict[str, str], relaxations: set[Relaxation]
) -> None:
    assert _settings([*TLS, *argv], env).policy.relaxations == relaxations


def test_nri_classes_are_vgpu_classes_that_serve_a_relaxation() -> None:
    s = _settings(
        [*TLS, "--vgpu-device-classes", "vgpu-manager,vgpu-manager-nri", "--allow-vgpu-claims-across-pods"],
        {"VGPU_NRI_DEVICE_CLASSES": "vgpu-manager-nri"},
    )
    assert s.policy.nri_classes == {"vgpu-manager-nri"}
    # an empty variable is unset: the chart passes the nriOnly classes, possibly none
    assert (
        _settings(
            [*TLS, "--allow-vgpu-claims-across-pods"], {"VGPU_NRI_DEVICE_CLASSES": ""}
        ).policy.nri_classes
        == frozenset()
    )


def test_self_signed_names_the_service_and_the_extra_hosts() -> None:
    s = _settings(
        [
            "--self-signed",
            "/tmp/x",
            "--self-signed-hosts",
            "10.1.2.3,hook.example.com",
            "--service-name",
            "wh",
        ],
        {"POD_NAMESPACE": "kube-system"},
    )
    assert s.self_signed_dir == Path("/tmp/x")
    assert s.certificate_hosts == (
        "localhost",
        "127.0.0.1",
        "wh",
        "wh.kube-system",
        "wh.kube-system.svc",
        "wh.kube-system.svc.cluster.local",
        "10.1.2.3",
        "hook.example.com",
    )


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        ([], {}, "give --tls-cert-file and --tls-key-file, or --self-signed DIR"),
        (["--tls-cert-file", "/a.crt"], {}, "--tls-cert-file and --tls-key-file go together"),
        ([*TLS, "--self-signed", "/tmp/x"], {}, "--self-signed replaces --tls-cert-file and --tls-key-file"),
        ([*TLS, "--self-signed-hosts", "a"], {}, "--self-signed-hosts is only used with --self-signed"),
        ([*TLS, "--port", "70000"], {}, "--port: 70000 is outside 0..65535"),
        ([*TLS, "--address", "localhost"], {}, "--address: 'localhost' is not an IP address"),
        (["--tls-cert-file", "rel.crt", "--tls-key-file", "/k"], {}, "'rel.crt' is not an absolute path"),
        ([*TLS, "--vgpu-device-classes", " , "], {}, "--vgpu-device-classes: the list is empty"),
        ([*TLS, "--vgpu-device-classes", "Bad_Class"], {}, "'Bad_Class' is not a DNS subdomain"),
        (["--self-signed", "/x", "--self-signed-hosts", "a_b"], {}, "'a_b' is not a DNS subdomain"),
        (
            TLS,
            {"ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER": "maybe"},
            "ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER (environment): 'maybe' is not true or false",
        ),
        ([*TLS, "--tls-reload-interval", "0"], {}, "--tls-reload-interval: 0 is outside 1..3600"),
        ([*TLS, "--shutdown-delay", "-1"], {}, "--shutdown-delay: -1 is outside 0..300"),
        ([*TLS, "--shutdown-delay", "301"], {}, "--shutdown-delay: 301 is outside 0..300"),
        (TLS, {"WEBHOOK_SHUTDOWN_DELAY": "5s"}, "WEBHOOK_SHUTDOWN_DELAY (environment): '5s' is not a number"),
        ([*TLS, "--shutdown-delay", "nan"], {}, "--shutdown-delay: 'nan' is not a number"),
        ([*TLS, "--shutdown-delay", "inf"], {}, "--shutdown-delay: 'inf' is not a number"),
        (
            [*TLS, "--allow-vgpu-claims-across-pods", "--nri-device-classes", "vgpu-nri"],
            {},
            "--nri-device-classes: 'vgpu-nri' is not one of --vgpu-device-classes (vgpu-manager)",
        ),
        (
            [*TLS, "--nri-device-classes", "vgpu-manager"],
            {},
            "--nri-device-classes is only used with --allow-multiple-vgpu-claims-per-container or "
            "--allow-vgpu-claims-across-pods",
        ),
        (
            [*TLS, "--allow-multiple-vgpu-claims-per-container"],
            {"VGPU_NRI_DEVICE_CLASSES": "Bad_Class"},
            "VGPU_NRI_DEVICE_CLASSES (environment): 'Bad_Class' is not a DNS subdomain",
        ),
        (
            TLS,
            {"ALLOW_VGPU_CLAIMS_ACROSS_PODS": "sometimes"},
            "ALLOW_VGPU_CLAIMS_ACROSS_PODS (environment): 'sometimes' is not true or false",
        ),
    ],
)
def test_bad_settings_name_the_flag(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _settings(argv, env)
    assert fragment in str(caught.value)


def test_help_names_every_environment_variable() -> None:
    parser = argparse.ArgumentParser(prog="vgpud webhook")
    add_webhook_arguments(parser)
    text = " ".join(parser.format_help().split())
    for env in (
        "WEBHOOK_PORT",
        "WEBHOOK_ADDRESS",
        "WEBHOOK_TLS_CERT_FILE",
        "WEBHOOK_TLS_KEY_FILE",
        "WEBHOOK_SELF_SIGNED_DIR",
        "WEBHOOK_SHUTDOWN_DELAY",
        "VGPU_DEVICE_CLASSES",
        "VGPU_NRI_DEVICE_CLASSES",
        "ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER",
        "ALLOW_VGPU_CLAIMS_ACROSS_PODS",
        "DRIVER_NAME",
        "KUBECONFIG",
    ):
        assert f"[env {env}]" in text
    assert text.count("when it selects NRI nodes") + text.count("when each of them selects NRI nodes") == 2

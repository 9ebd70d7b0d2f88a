"""Values the chart must refuse, each with a message that names the setting: what vgpud itself refuses
(the gates it cannot honour), unknown keys, values out of range, and settings that do nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.chart import CHART, env_of, one, render, render_error
from vgpud.gates import GATES, parse_feature_gates

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "VGPUSupport off",
        {"featureGates": {"VGPUSupport": False}},
        "/featureGates/VGPUSupport': value must be true",
    ),
    (
        "NVMLDeviceHealthCheck not a bool",
        {"featureGates": {"NVMLDeviceHealthCheck": "on"}},
        "/featureGates/NVMLDeviceHealthCheck'",
    ),
    (
        "SharedSMUtilizationWatcher on",
        {"featureGates": {"SharedSMUtilizationWatcher": True}},
        "/featureGates/SharedSMUtilizationWatcher': value must be false",
    ),
    ("unknown gate", {"featureGates": {"NRISuport": True}}, "additional properties 'NRISuport' not allowed"),
    ("gate not a bool", {"featureGates": {"NRISupport": "yes"}}, "/featureGates/NRISupport'"),
    (
        "unknown top-level key",
        {"webhooks": {"enabled": False}},
        "additional properties 'webhooks' not allowed",
    ),
    ("unknown nested key", {"node": {"hostPid": False}}, "additional properties 'hostPid' not allowed"),
    ("port too big", {"node": {"healthcheckPort": 70000}}, "/node/healthcheckPort': maximum"),
    ("port zero", {"webhook": {"port": 0}}, "/webhook/port': minimum"),
    ("port not a number", {"metrics": {"port": "http"}}, "/metrics/port'"),
    ("relative host path", {"hostPaths": {"cdiRoot": "var/run/cdi"}}, "/hostPaths/cdiRoot'"),
    (
        "a variable outside the node root",
        {"hostPaths": {"cdiRoot": "/srv/$(NODE_NAME)/cdi"}},
        "hostPaths.cdiRoot (/srv/$(NODE_NAME)/cdi) names a variable: only a path under hostPaths.nodeRoot",
    ),
    (
        "a node root nothing lies under",
        {"hostPaths": {"nodeRoot": "/srv/nodes"}},
        "hostPaths.nodeRoot (/srv/nodes) is set but no host path lies under it",
    ),
    (
        "the whole host as node root",
        {"hostPaths": {"nodeRoot": "/", "cdiRoot": "/srv/$(NODE_NAME)/cdi"}},
        "hostPaths.nodeRoot (/) must be an absolute directory other than /",
    ),
    ("relative node root", {"hostPaths": {"nodeRoot": "srv"}}, "/hostPaths/nodeRoot'"),
    (
        "a variable in the dev root",
        {"node": {"devRoot": "/srv/$(NODE_NAME)/dev-root"}},
        "node.devRoot (/srv/$(NODE_NAME)/dev-root) names a variable",
    ),
    ("bad log level", {"node": {"logLevel": "trace"}}, "/node/logLevel'"),
    ("bad log format", {"node": {"logFormat": "logfmt"}}, "/node/logFormat'"),
    ("bad webhook log format", {"webhook": {"logFormat": "JSON"}}, "/webhook/logFormat'"),
    ("unknown GPU backend", {"node": {"gpu": {"backend": "rocm"}}}, "/node/gpu/backend'"),
    ("bad driver name", {"driverName": "Manager_NVIDIA"}, "/driverName'"),
    ("no DeviceClass", {"deviceClasses": []}, "/deviceClasses'"),
    (
        "unknown DeviceClass key",
        {"deviceClasses": [{"name": "vgpu-manager", "nri": True}]},
        "additional properties 'nri' not allowed",
    ),
    ("nriOnly not a bool", {"deviceClasses": [{"name": "v", "nriOnly": "yes"}]}, "/deviceClasses/0/nriOnly'"),
    (
        "unknown relaxation",
        {"webhook": {"relaxations": {"multipleClaims": True}}},
        "additional properties 'multipleClaims' not allowed",
    ),
    (
        "the old relaxation value",
        {"webhook": {"allowMultipleVgpuClaimsPerContainer": True}},
        "additional properties 'allowMultipleVgpuClaimsPerContainer' not allowed",
    ),
    (
        "relaxation not a bool",
        {"webhook": {"relaxations": {"claimsAcrossPods": "true"}}},
        "/webhook/relaxations/claimsAcrossPods'",
    ),
    (
        "relaxation without the webhook",
        {"webhook": {"enabled": False, "relaxations": {"claimsAcrossPods": True}}},
        "webhook.relaxations lift webhook rules: they need webhook.enabled",
    ),
    ("bad NRI index", {"node": {"nriPluginIdx": "5"}}, "/node/nriPluginIdx'"),
    (
        "mock without profile",
        {"node": {"gpu": {"backend": "mock"}}},
        "node.gpu.backend=mock needs node.gpu.profile",
    ),
    (
        "profile with nvml",
        {"node": {"gpu": {"profile": "a100-40gb-x2"}}},
        "node.gpu.profile is only used with",
    ),
    (
        "NVML library with mock",
        {
            "node": {
                "gpu": {"backend": "mock", "profile": "a100-40gb-x2", "nvmlLibrary": "/lib/libnvidia-ml.so.1"}
            }
        },
        "node.gpu.nvmlLibrary is only used with node.gpu.backend=nvml",
    ),
    (
        "cgroup driver without client mode or NRI",
        {"node": {"cgroupDriver": "systemd"}},
        "node.cgroupDriver is only used",
    ),
    (
        "hot-plug without NRI",
        {"node": {"hotplug": {"enabled": True}}},
        "node.hotplug.enabled needs featureGates.NRISupport=true",
    ),
    ("hot-plug not a bool", {"node": {"hotplug": {"enabled": "yes"}}}, "/node/hotplug/enabled'"),
    ("API host without port", {"kubernetesServiceHost": "10.0.0.1"}, "without kubernetesServicePort"),
    ("API port without host", {"kubernetesServicePort": 6443}, "without kubernetesServiceHost"),
    (
        "grace not above shutdown",
        {"node": {"terminationGracePeriodSeconds": 10, "shutdownTimeoutSeconds": 10}},
        "node.terminationGracePeriodSeconds (10) must exceed node.shutdownTimeoutSeconds (10)",
    ),
    (
        "webhook grace not above its drain and close",
        {"webhook": {"terminationGracePeriodSeconds": 15, "shutdownDelaySeconds": 5}},
        "webhook.terminationGracePeriodSeconds (15) must exceed webhook.shutdownDelaySeconds (5) + 10",
    ),
    (
        "webhook grace not above a fractional drain",
        {"webhook": {"terminationGracePeriodSeconds": 12, "shutdownDelaySeconds": 2.5}},
        "webhook.terminationGracePeriodSeconds (12) must exceed webhook.shutdownDelaySeconds (2.5) + 10",
    ),
    (
        "webhook grace not above its close alone",
        {"webhook": {"terminationGracePeriodSeconds": 10, "shutdownDelaySeconds": 0}},
        "webhook.terminationGracePeriodSeconds (10) must exceed webhook.shutdownDelaySeconds (0) + 10",
    ),
    ("negative drain", {"webhook": {"shutdownDelaySeconds": -1}}, "/webhook/shutdownDelaySeconds': minimum"),
    ("drain not a number", {"webhook": {"shutdownDelaySeconds": "5s"}}, "/webhook/shutdownDelaySeconds'"),
    ("drain too long", {"webhook": {"shutdownDelaySeconds": 301}}, "/webhook/shutdownDelaySeconds': maximum"),
    ("metrics on the health port", {"metrics": {"port": 51515}}, "metrics.port and node.healthcheckPort"),
    (
        "ServiceMonitor without metrics",
        {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}},
        "metrics.serviceMonitor.enabled needs metrics.enabled",
    ),
    (
        "alert rules without metrics",
        {"prometheusRule": {"enabled": True}, "metrics": {"enabled": False}, "webhook": {"enabled": False}},
        "prometheusRule.enabled needs metrics.enabled or webhook.enabled",
    ),
    (
        "for of no alert",
        {"prometheusRule": {"for": {"VgpudDwon": "5m"}}},
        "additional properties 'VgpudDwon' not allowed",
    ),
    (
        "for not a duration",
        {"prometheusRule": {"for": {"VgpudDown": "5 min"}}},
        "/prometheusRule/for/VgpudDown'",
    ),
    (
        "for units out of order",
        {"prometheusRule": {"for": {"VgpudDown": "5m1h"}}},
        "/prometheusRule/for/VgpudDown'",
    ),
    ("empty for", {"prometheusRule": {"for": {"VgpudDown": ""}}}, "/prometheusRule/for/VgpudDown'"),
    ("job with a quote", {"prometheusRule": {"nodeJob": 'a"b'}}, "/prometheusRule/nodeJob'"),
    (
        "runbook URL with a fragment",
        {"prometheusRule": {"runbookBaseUrl": "https://example.com/alerts.md#top"}},
        "/prometheusRule/runbookBaseUrl'",
    ),
    (
        "latency threshold zero",
        {"prometheusRule": {"hookLatencySeconds": 0}},
        "/prometheusRule/hookLatencySeconds'",
    ),
]


@pytest.mark.parametrize(("values", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_with_a_message_naming_the_setting(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_schema_gates_are_vgpuds_gates() -> None:
    """The schema's feature gates and the values it allows are those vgpud.gates accepts: a gate vgpud
    gains or learns to honour shows up here until the schema follows."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    gates = schema["properties"]["featureGates"]
    assert gates["additionalProperties"] is False
    assert set(gates["properties"]) == {gate.name for gate in GATES}
    for gate in GATES:
        declared = gates["properties"][gate.name]
        if gate.settable:
            assert declared["type"] == "boolean", gate.name
        else:
            (only,) = gate.accepts
            assert declared == {"const": only, "description": declared["description"]}, gate.name


def test_values_vgpud_accepts_for_the_fixed_gates_render() -> None:
    """Setting a fixed gate to the one value vgpud runs with is accepted (it is the truth)."""
    fixed = {gate.name: gate.accepts[0] for gate in GATES if not gate.settable}
    gates = parse_feature_gates(env_of(one(render({"featureGates": fixed}), "DaemonSet"))["FEATURE_GATES"])
    assert all(gates.enabled(name) is on for name, on in fixed.items())

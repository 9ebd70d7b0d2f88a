"""Render the chart with the real `helm` (HELM_BIN in kube.env) and pick objects out of the result.

`VARIANTS` are the value sets every chart test covers: the defaults, each feature-gate combination
(NRISupport x DevicePluginClientMode), the local test node's settings, and the optional parts switched
on or off. Values travel to helm as a JSON file (`--values`), exactly as a user's values file would.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.kubeapi import helm_binary
from tests.support import REPO, require

CHART = REPO / "helm" / "vgpud"
HELM_HINT = "run hack/install-kube.sh (it builds helm; the test command does it)"
RELEASE = "vgpud"
NAMESPACE = "vgpud-system"
HELM_TIMEOUT_S = 120

Values = Mapping[str, Any]
Manifest = dict[str, Any]


def helm() -> Path:
    """The helm binary; skips locally, fails under CI, when it is not installed."""
    path = helm_binary()
    require(path is not None, "helm", HELM_HINT)
    assert path is not None
    return path


def run_helm(*args: str, values: Values | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with `values` as a values file; the completed process (never raises on exit status)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="values-") as file:
        json.dump(dict(values or {}), file)
        file.flush()
        return subprocess.run(
            [str(helm()), *args, "--values", file.name],
            capture_output=True,
            text=True,
            timeout=HELM_TIMEOUT_S,
            check=False,
        )


def render(
    values: Values | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> list[Manifest]:
    """`helm template` the chart; the manifests it renders (a failure fails the test with helm's stderr)."""
    done = run_helm("template", release, str(CHART), "--namespace", namespace, values=values)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_error(values: Values) -> str:
    """`helm template` with values it must refuse; helm's error message."""
    done = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
    assert done.returncode != 0, f"helm template accepted {values}:\n{done.stdout[:2000]}"
    return done.stderr


def find(manifests: list[Manifest], kind: str, name_suffix: str = "") -> list[Manifest]:
    """The manifests of `kind` whose name ends with `name_suffix`."""
    return [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)]


def one(manifests: list[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    found = find(manifests, kind, name_suffix)
    assert len(found) == 1, (
        f"expected one {kind} *{name_suffix}, found {[m['metadata']['name'] for m in found]}"
    )
    return found[0]


def container(workload: Manifest) -> dict[str, Any]:
    """The one container of a DaemonSet or Deployment."""
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def env_of(workload: Manifest) -> dict[str, Any]:
    """name -> value (a string) or valueFrom (a dict) of the workload's container."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload).get("env", [])}


#: what the kubelet would fill in for the downward-API fields in the tests' resolved env
POD_IP = "10.9.8.7"
NODE = "gpu-node-1"


def resolved_env(workload: Manifest) -> dict[str, str]:
    """The container's environment as the kubelet gives it: fieldRefs filled in, $(VAR) expanded."""
    fields = {"spec.nodeName": NODE, "status.podIP": POD_IP}
    env: dict[str, str] = {}
    for name, value in env_of(workload).items():
        if isinstance(value, dict):
            env[name] = fields[value["fieldRef"]["fieldPath"]]
        else:
            env[name] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    return env


def merge(*layers: Values) -> dict[str, Any]:
    """Deep-merge value layers, later ones winning (as helm merges several --values files)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
    return merged


@dataclass(frozen=True)
class Variant:
    name: str
    values: Values
    #: CRDs the variant's objects need on the API server (group names), besides the built-in kinds
    crds: tuple[str, ...] = ()


def gate_variants() -> Iterator[Variant]:
    for nri, client in itertools.product((False, True), repeat=2):
        gates = {"NRISupport": nri, "DevicePluginClientMode": client}
        yield Variant(f"nri={str(nri).lower()},client={str(client).lower()}", {"featureGates": gates})


#: the settings a local test node needs: its own host paths, simulated GPUs, the API server on loopback
LOCAL_NODE: Values = {
    "hostPaths": {
        "managerDir": "/tmp/vgnTEST/vgpu",
        "cdiRoot": "/tmp/vgnTEST/cdi",
        "nriRoot": "/tmp/vgnTEST/nri",
        "kubeletRegistrarDir": "/tmp/vgnTEST/kubelet/plugins_registry",
        "kubeletPluginsDir": "/tmp/vgnTEST/kubelet/plugins",
    },
    "featureGates": {"NRISupport": True},
    "kubernetesServiceHost": "127.0.0.1",
    "kubernetesServicePort": 6443,
    "image": {"tag": "test"},
    "node": {"gpu": {"backend": "mock", "profile": "a100-40gb-x2"}, "healthcheckPort": 40123},
    "metrics": {"port": 40124},
    "webhook": {"hostNetwork": True, "replicas": 1, "port": 40125},
}

VARIANTS: tuple[Variant, ...] = (
    Variant("default", {}),
    *gate_variants(),
    Variant("local-node", LOCAL_NODE),
    Variant("webhook-off", {"webhook": {"enabled": False}}),
    Variant("metrics-off", {"metrics": {"enabled": False}}),
    Variant(
        "everything",
        {
            "featureGates": {"NRISupport": True, "DevicePluginClientMode": True},
            "node": {
                "cgroupDriver": "systemd",
                "hotplug": {"enabled": True},
                "extraEnv": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                "extraVolumes": [
                    {"name": "fake-gpu", "hostPath": {"path": "/opt/fake-gpu", "type": "Directory"}}
                ],
                "extraVolumeMounts": [{"name": "fake-gpu", "mountPath": "/opt/fake-gpu", "readOnly": True}],
            },
            "deviceClasses": [
                {"name": "vgpu-manager"},
                {
                    "name": "vgpu-a100",
                    "extraSelectors": ["device.attributes['manager.nvidia.com'].model == 'A100'"],
                },
                {"name": "vgpu-manager-nri", "nriOnly": True},
            ],
            "webhook": {
                "excludedNamespaces": ["batch"],
                "replicas": 3,
                "relaxations": {"multipleClaimsPerContainer": True, "claimsAcrossPods": True},
            },
            "imagePullSecrets": ["registry"],
        },
    ),
    Variant(
        "gpu-operator",
        {
            "node": {
                "driverRoot": "/run/nvidia/driver",
                "devRoot": "/",
                "cdiHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
                "runtimeClassName": "nvidia",
            }
        },
    ),
    Variant("no-cdi-hook", {"node": {"cdiHookPath": "off", "affinity": None}}),
    Variant("cert-manager", {"webhook": {"certManager": {"enabled": True}}}, crds=("cert-manager.io",)),
    Variant(
        "prometheus",
        {"metrics": {"serviceMonitor": {"enabled": True}}, "prometheusRule": {"enabled": True}},
        crds=("monitoring.coreos.com",),
    ),
)

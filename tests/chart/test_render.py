"""What `helm template` renders, checked against vgpud itself: the env the workloads get is parsed by
vgpud's own settings code (so a name or value vgpud would refuse fails here, not on a node), every host
path is mounted at the same path, and the optional parts appear exactly when switched on."""

from __future__ import annotations

import argparse
import base64
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart import (
    CHART,
    NAMESPACE,
    NODE,
    POD_IP,
    RELEASE,
    VARIANTS,
    Manifest,
    Variant,
    container,
    env_of,
    find,
    merge,
    one,
    render,
    resolved_env,
    run_helm,
)
from tests.support import REPO
from vgpud.config import OPTIONS, Settings, settings_from
from vgpud.relaxations import Relaxation, nri_selector_optional
from vgpud.webhook.config import WEBHOOK_OPTIONS, WebhookSettings, webhook_settings_from
from vgpud.webhook.main import SHUTDOWN_TIMEOUT_S

#: the driver's roots, mounted elsewhere in the container: vgpud maps what it sees there to host paths
DRIVER_ROOT_VOLUMES = {"driver-root": "/driver-root", "dev-root": "/dev-root/dev"}
#: the chart's default driver name
DRIVER = yaml.safe_load((CHART / "values.yaml").read_text())["driverName"]
#: env the chart sets that is not a vgpud setting: the pod IP for $(POD_IP), the API server override
NOT_SETTINGS = {"POD_IP", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
ids = [v.name for v in VARIANTS]


def daemon_settings(manifests: list[Manifest]) -> Settings:
    return settings_from(argparse.Namespace(), resolved_env(one(manifests, "DaemonSet")))


def values_of(variant: Variant) -> dict[str, Any]:
    """The chart's defaults with the variant's values over them."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(defaults, variant.values)


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_helm_lint_strict_is_clean(variant: Variant) -> None:
    done = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, values=variant.values)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_daemon_env_is_what_vgpud_run_reads_and_accepts(variant: Variant) -> None:
    manifests = render(variant.values)
    values = values_of(variant)
    env = env_of(one(manifests, "DaemonSet"))
    extra = {e["name"] for e in values["node"]["extraEnv"]}
    known = {option.env for option in OPTIONS}
    assert set(env) - NOT_SETTINGS - extra <= known, (
        f"not read by vgpud run: {set(env) - NOT_SETTINGS - known}"
    )

    settings = daemon_settings(manifests)  # raises ConfigError on anything vgpud would refuse
    gates = values["featureGates"]
    assert settings.feature_gates.enabled("NRISupport") is gates["NRISupport"]
    assert settings.feature_gates.enabled("DevicePluginClientMode") is gates["DevicePluginClientMode"]
    assert settings.node_name == NODE
    assert settings.driver_name == values["driverName"]
    paths = values["hostPaths"]
    assert str(settings.manager_dir) == paths["managerDir"]
    assert str(settings.cdi_root) == paths["cdiRoot"]
    assert str(settings.kubelet_registrar_dir) == paths["kubeletRegistrarDir"]
    assert str(settings.kubelet_plugins_dir) == paths["kubeletPluginsDir"]
    assert ("NRI_ROOT" in env) is gates["NRISupport"]
    if gates["NRISupport"]:
        assert str(settings.nri_root) == paths["nriRoot"]
    # the probes' port, bound on the pod IP only
    assert (settings.healthcheck_address, settings.healthcheck_port) == (
        POD_IP,
        values["node"]["healthcheckPort"],
    )
    if values["metrics"]["enabled"]:
        assert settings.metrics_address == (POD_IP, values["metrics"]["port"])
    else:
        assert settings.metrics_address is None
    assert settings.gpu_backend == values["node"]["gpu"]["backend"]
    # the hot-plug socket in the plugin dir, and the cgroup tree writable, only when asked for
    hotplug = values["node"]["hotplug"]["enabled"]
    assert settings.hotplug_socket_path == (settings.plugin_dir / "hotplug.sock" if hotplug else None)
    (cgroup,) = [m for m in container(one(manifests, "DaemonSet"))["volumeMounts"] if m["name"] == "cgroup"]
    assert cgroup["readOnly"] is not hotplug


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_daemonset_runs_vgpud_as_the_reference_does(variant: Variant) -> None:
    manifests = render(variant.values)
    values = values_of(variant)
    daemon = one(manifests, "DaemonSet")
    pod = daemon["spec"]["template"]["spec"]
    ctr = container(daemon)
    assert ctr["args"] == ["run"]
    assert pod["hostPID"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is values["node"]["hostNetwork"]
    assert ctr["securityContext"]["privileged"] is True
    assert pod["serviceAccountName"] == one(manifests, "ServiceAccount", "-node")["metadata"]["name"]
    port = daemon_settings(manifests).healthcheck_port
    for probe in ("startupProbe", "livenessProbe"):
        assert ctr[probe]["grpc"] == {"port": port, "service": "liveness"}
    # the kubelet's liveness restart (tier 2) comes after vgpud's own 3-minute grace, not instead of it
    liveness = ctr["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30
    assert pod["terminationGracePeriodSeconds"] > daemon_settings(manifests).shutdown_timeout
    assert daemon["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    tag = values["image"]["tag"] or yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert ctr["image"] == f"{values['image']['repository']}:{tag}"


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_every_host_path_is_mounted_at_the_same_path(variant: Variant) -> None:
    daemon = one(render(variant.values), "DaemonSet")
    values = values_of(variant)
    volumes = {v["name"]: v["hostPath"] for v in daemon["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container(daemon)["volumeMounts"]}
    assert set(volumes) == set(mounts)
    for name, host in volumes.items():
        if name not in DRIVER_ROOT_VOLUMES:  # vgpud maps those itself (DRIVER_ROOT_CTR_PATH ...)
            assert mounts[name]["mountPath"] == host["path"], name
    by_path = {host["path"]: mounts[name] for name, host in volumes.items()}
    paths = values["hostPaths"]
    for key in ("kubeletRegistrarDir", "kubeletPluginsDir"):
        assert by_path[paths[key]].get("mountPropagation") == "Bidirectional"
    for key in ("managerDir", "cdiRoot"):
        assert not by_path[paths[key]].get("readOnly")
    # writable only for the hot-plug API, which changes containers' device cgroups
    assert by_path["/sys/fs/cgroup"]["readOnly"] is not values["node"]["hotplug"]["enabled"]
    nri = values["featureGates"]["NRISupport"]
    assert (paths["nriRoot"] in by_path) is nri
    if nri:
        assert by_path[paths["nriRoot"]]["readOnly"] is True


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.name != "webhook-off"], ids=lambda v: v.name)
def test_webhook_env_is_what_vgpud_webhook_reads_and_accepts(variant: Variant) -> None:
    manifests = render(variant.values)
    values = values_of(variant)
    deployment = one(manifests, "Deployment", "-webhook")
    env = resolved_env(deployment)
    known = {option.env for option in WEBHOOK_OPTIONS}
    assert set(env) - NOT_SETTINGS <= known, f"not read by vgpud webhook: {set(env) - NOT_SETTINGS - known}"
    settings: WebhookSettings = webhook_settings_from(argparse.Namespace(), env)
    classes = [c["name"] for c in values["deviceClasses"]]
    assert settings.policy.vgpu_classes == frozenset(classes)
    assert {m["metadata"]["name"] for m in find(manifests, "DeviceClass")} == set(classes)
    switches = values["webhook"]["relaxations"]
    relaxations = {
        Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER: switches["multipleClaimsPerContainer"],
        Relaxation.CLAIM_ACROSS_PODS: switches["claimsAcrossPods"],
    }
    assert settings.policy.relaxations == {r for r, on in relaxations.items() if on}
    nri = {c["name"] for c in values["deviceClasses"] if c.get("nriOnly")}
    assert settings.policy.nri_classes == (nri if settings.policy.relaxations else frozenset())
    assert settings.address == POD_IP and settings.port == values["webhook"]["port"]
    assert settings.driver_name == values["driverName"]
    # the drain, then the supervisor's close, before the kubelet's SIGKILL
    assert settings.shutdown_delay == values["webhook"]["shutdownDelaySeconds"] > 0
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == values["webhook"]["terminationGracePeriodSeconds"]
    assert grace > settings.shutdown_delay + SHUTDOWN_TIMEOUT_S
    ctr = container(deployment)
    assert ctr["args"] == ["webhook"]
    # the certificate files come from the Secret the TLS template writes, mounted whole (reloadable)
    (mount,) = ctr["volumeMounts"]
    assert mount.get("subPath") is None
    assert Path(mount["mountPath"]) == settings.tls_cert_file.parent == settings.tls_key_file.parent
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"].endswith("-webhook-tls")
    for probe in ("readinessProbe", "livenessProbe"):
        assert ctr[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert ctr["ports"] == [{"name": "https", "containerPort": settings.port, "protocol": "TCP"}]
    pdbs = find(manifests, "PodDisruptionBudget")
    assert len(pdbs) == (1 if values["webhook"]["replicas"] > 1 else 0)


def test_a_fractional_shutdown_delay_reaches_the_webhook() -> None:
    deployment = one(
        render({"webhook": {"shutdownDelaySeconds": 2.5, "terminationGracePeriodSeconds": 13}}),
        "Deployment",
        "-webhook",
    )
    assert webhook_settings_from(argparse.Namespace(), resolved_env(deployment)).shutdown_delay == 2.5
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 13


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.name != "webhook-off"], ids=lambda v: v.name)
def test_webhook_configuration(variant: Variant) -> None:
    manifests = render(variant.values)
    values = values_of(variant)
    (hook,) = one(manifests, "ValidatingWebhookConfiguration")["webhooks"]
    service = one(manifests, "Service", "-webhook")
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NAMESPACE,
        "path": "/validate",
        "port": 443,
    }
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]
    rules = {(tuple(r["apiGroups"]), tuple(r["operations"]), tuple(r["resources"])) for r in hook["rules"]}
    assert rules == {
        (("",), ("CREATE",), ("pods",)),
        (("resource.k8s.io",), ("CREATE", "UPDATE"), ("resourceclaims", "resourceclaims/status")),
    }
    (namespaces,) = hook["namespaceSelector"]["matchExpressions"]
    assert namespaces["key"] == "kubernetes.io/metadata.name" and namespaces["operator"] == "NotIn"
    assert set(namespaces["values"]) == {"kube-system", NAMESPACE, *values["webhook"]["excludedNamespaces"]}
    label = values["webhook"]["optOutLabel"]
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": label["key"], "operator": "NotIn", "values": [label["value"]]}]
    }


def openssl(*args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_self_signed_certificate_made_at_install_matches_the_ca_bundle(tmp_path: Path) -> None:
    manifests = render()
    secret = one(manifests, "Secret", "-webhook-tls")
    (hook,) = one(manifests, "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    files = {key: tmp_path / key for key in ("ca.crt", "tls.crt", "tls.key")}
    for key, path in files.items():
        path.write_bytes(base64.b64decode(secret["data"][key]))
    host = f"{RELEASE}-webhook.{NAMESPACE}.svc"
    for name in (host, f"{host}.cluster.local"):
        out = openssl(
            "verify", "-CAfile", str(files["ca.crt"]), "-verify_hostname", name, str(files["tls.crt"])
        )
        assert out.strip().endswith(": OK")
    # the key is the certificate's
    modulus = openssl("x509", "-noout", "-pubkey", "-in", str(files["tls.crt"]))
    assert openssl("pkey", "-pubout", "-in", str(files["tls.key"])) == modulus


def test_cert_manager_issues_the_same_secret_and_injects_the_ca() -> None:
    manifests = render({"webhook": {"certManager": {"enabled": True}}})
    assert not find(manifests, "Secret")
    issuer = one(manifests, "Issuer")
    certificate = one(manifests, "Certificate")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    host = f"{RELEASE}-webhook.{NAMESPACE}.svc"
    assert certificate["spec"]["dnsNames"] == [host, f"{host}.cluster.local"]
    deployment = one(manifests, "Deployment", "-webhook")
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    config = one(manifests, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def selectors(device_class: Manifest) -> list[str]:
    return [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]


def test_default_device_classes_and_relaxations() -> None:
    """Two classes by default, the second only for devices of NRI nodes (by CEL's optional form, false
    rather than an error on a node whose vgpud does not publish nriMode yet, during a rolling upgrade);
    both relaxations off, so the webhook is not told of NRI classes (it refuses them without a
    relaxation)."""
    manifests = render()
    vgpu = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vgpu'"
    classes = {m["metadata"]["name"]: selectors(m) for m in find(manifests, "DeviceClass")}
    assert classes == {"vgpu-manager": [vgpu], "vgpu-manager-nri": [vgpu, nri_selector_optional(DRIVER)]}
    env = env_of(one(manifests, "Deployment", "-webhook"))
    assert (env["ALLOW_MULTIPLE_VGPU_CLAIMS_PER_CONTAINER"], env["ALLOW_VGPU_CLAIMS_ACROSS_PODS"]) == (
        "false",
        "false",
    )
    assert "VGPU_NRI_DEVICE_CLASSES" not in env
    assert env["VGPU_DEVICE_CLASSES"] == "vgpu-manager,vgpu-manager-nri"


@pytest.mark.parametrize(
    ("switches", "relaxations"),
    [
        ({"multipleClaimsPerContainer": True}, {Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER}),
        ({"claimsAcrossPods": True}, {Relaxation.CLAIM_ACROSS_PODS}),
        ({"multipleClaimsPerContainer": True, "claimsAcrossPods": True}, set(Relaxation)),
    ],
)
def test_relaxations_on_reach_the_webhook_with_the_nri_classes(
    switches: dict[str, bool], relaxations: set[Relaxation]
) -> None:
    classes = [
        {"name": "vgpu-manager"},
        {
            "name": "vgpu-a100-nri",
            "nriOnly": True,
            "extraSelectors": ["device.attributes['x'].model == 'A100'"],
        },
        {"name": "vgpu-manager-nri", "nriOnly": True},
    ]
    manifests = render({"deviceClasses": classes, "webhook": {"relaxations": switches}})
    env = resolved_env(one(manifests, "Deployment", "-webhook"))
    assert env["VGPU_NRI_DEVICE_CLASSES"] == "vgpu-a100-nri,vgpu-manager-nri"
    policy = webhook_settings_from(argparse.Namespace(), env).policy
    assert policy.relaxations == relaxations
    assert policy.nri_classes == {"vgpu-a100-nri", "vgpu-manager-nri"}
    by_name = {m["metadata"]["name"]: selectors(m) for m in find(manifests, "DeviceClass")}
    assert by_name["vgpu-a100-nri"][1:] == [
        nri_selector_optional(DRIVER),
        "device.attributes['x'].model == 'A100'",
    ]
    assert nri_selector_optional(DRIVER) not in by_name["vgpu-manager"]
    # without an nriOnly class the webhook still runs: claims select NRI nodes by the selector
    plain = render({"deviceClasses": classes[:1], "webhook": {"relaxations": switches}})
    env = resolved_env(one(plain, "Deployment", "-webhook"))
    assert env["VGPU_NRI_DEVICE_CLASSES"] == ""
    assert webhook_settings_from(argparse.Namespace(), env).policy.nri_classes == frozenset()


@pytest.mark.parametrize("host_network", [False, True])
def test_webhook_update_fits_the_network(host_network: bool) -> None:
    """A host-network replica holds its port on the node: the update may not start a new one beside
    it (maxSurge 0, or the rollout never ends on a one-node cluster); otherwise a new replica is
    Ready before an old one goes."""
    manifests = render({"webhook": {"hostNetwork": host_network}})
    rolling = one(manifests, "Deployment", "-webhook")["spec"]["strategy"]["rollingUpdate"]
    expected = {"maxSurge": 0, "maxUnavailable": 1} if host_network else {"maxSurge": 1, "maxUnavailable": 0}
    assert rolling == expected


def test_webhook_disabled_renders_none_of_it() -> None:
    manifests = render({"webhook": {"enabled": False}})
    kinds = {m["kind"] for m in manifests}
    assert not kinds & {"Deployment", "ValidatingWebhookConfiguration", "Secret", "PodDisruptionBudget"}
    assert not [m for m in manifests if m["metadata"]["name"].endswith("-webhook")]
    assert one(manifests, "DaemonSet") and find(manifests, "DeviceClass")


def test_metrics_service_and_service_monitor() -> None:
    manifests = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    service = one(manifests, "Service", "-metrics")
    daemon = one(manifests, "DaemonSet")
    pod_labels = daemon["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in container(daemon)["ports"]
    monitor = one(manifests, "ServiceMonitor", "-metrics")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["relabelings"] == [NODE_RELABELING]

    off = render({"metrics": {"enabled": False}})
    assert not find(off, "Service", "-metrics")
    assert all(p["name"] != "metrics" for p in container(one(off, "DaemonSet"))["ports"])


#: what the ServiceMonitors add to every series: the scraped pod's node as `node`
NODE_RELABELING = {
    "action": "replace",
    "sourceLabels": ["__meta_kubernetes_pod_node_name"],
    "targetLabel": "node",
}


def test_webhook_service_monitor_scrapes_https_verified_by_the_webhooks_ca(tmp_path: Path) -> None:
    """The webhook's /metrics is on its HTTPS port: the ServiceMonitor names the Service's port, and
    its tlsConfig verifies the serving certificate with the Secret's ca.crt under the Service's name
    (checked with openssl against the certificate the chart made)."""
    manifests = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    service = one(manifests, "Service", "-webhook")
    monitor = one(manifests, "ServiceMonitor", "-webhook")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    assert endpoint["relabelings"] == [NODE_RELABELING]
    tls = endpoint["tlsConfig"]
    secret = one(manifests, "Secret", "-webhook-tls")
    assert tls["ca"]["secret"]["name"] == secret["metadata"]["name"]
    assert tls["serverName"] == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    files = {key: tmp_path / key for key in ("ca.crt", "tls.crt")}
    for key, path in files.items():
        path.write_bytes(base64.b64decode(secret["data"][key]))
    ca = files[tls["ca"]["secret"]["key"]]
    out = openssl("verify", "-CAfile", str(ca), "-verify_hostname", tls["serverName"], str(files["tls.crt"]))
    assert out.strip().endswith(": OK")

    # cert-manager writes the same Secret, with ca.crt, for a certificate of the same names
    managed = render(
        {"metrics": {"serviceMonitor": {"enabled": True}}, "webhook": {"certManager": {"enabled": True}}}
    )
    certificate = one(managed, "Certificate")
    tls = one(managed, "ServiceMonitor", "-webhook")["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["ca"]["secret"]["name"] == certificate["spec"]["secretName"]
    assert tls["serverName"] in certificate["spec"]["dnsNames"]

    off = render({"metrics": {"serviceMonitor": {"enabled": True}}, "webhook": {"enabled": False}})
    assert [m["metadata"]["name"] for m in find(off, "ServiceMonitor")] == [f"{RELEASE}-metrics"]


def test_api_server_override_reaches_both_workloads() -> None:
    manifests = render({"kubernetesServiceHost": "127.0.0.1", "kubernetesServicePort": 6443})
    for workload in (one(manifests, "DaemonSet"), one(manifests, "Deployment")):
        env = env_of(workload)
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", "6443")
    for workload in (one(render(), "DaemonSet"), one(render(), "Deployment")):
        assert "KUBERNETES_SERVICE_HOST" not in env_of(workload)


def test_log_format_reaches_both_workloads_as_vgpud_reads_it() -> None:
    """text by default; json set for each workload on its own, read by vgpud's own settings code."""
    defaults = render()
    assert daemon_settings(defaults).log_format == "text"
    webhook_env = resolved_env(one(defaults, "Deployment", "-webhook"))
    assert webhook_settings_from(argparse.Namespace(), webhook_env).log_format == "text"
    node_only = render({"node": {"logFormat": "json"}})
    assert daemon_settings(node_only).log_format == "json"
    assert env_of(one(node_only, "Deployment", "-webhook"))["LOG_FORMAT"] == "text"
    both = render({"node": {"logFormat": "json"}, "webhook": {"logFormat": "json"}})
    webhook_env = resolved_env(one(both, "Deployment", "-webhook"))
    assert webhook_settings_from(argparse.Namespace(), webhook_env).log_format == "json"
    assert env_of(one(both, "DaemonSet"))["LOG_FORMAT"] == "json"


def test_labels_follow_helm_conventions() -> None:
    for manifest in render():
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "vgpud"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"].startswith("vgpud-")


def test_app_version_is_vgpuds_version() -> None:
    """The default image tag is the appVersion: it must be the version the image's vgpud reports."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart["apiVersion"] == "v2"


def test_chart_metadata_names_the_project_and_its_license() -> None:
    """What Artifact Hub and `helm show chart` show: the project, its maintainers, and the license
    pyproject.toml declares (one license, stated in both places)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["home"] in chart["sources"]
    assert all(m["name"] and m["url"].startswith("https://") for m in chart["maintainers"])
    annotations = chart["annotations"]
    assert annotations["artifacthub.io/license"] == project["license"]
    assert annotations["artifacthub.io/operator"] == "false"
    links = yaml.safe_load(annotations["artifacthub.io/links"])
    assert links and all(link["name"] and link["url"].startswith(chart["home"]) for link in links)


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_the_driver_root_is_mounted_read_only_and_mapped_to_the_hosts(variant: Variant) -> None:
    manifests = render(variant.values)
    node = values_of(variant)["node"]
    daemon = one(manifests, "DaemonSet")
    volumes = {v["name"]: v["hostPath"] for v in daemon["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container(daemon)["volumeMounts"]}
    assert volumes["driver-root"] == {"path": node["driverRoot"], "type": "Directory"}
    assert mounts["driver-root"]["mountPath"] == DRIVER_ROOT_VOLUMES["driver-root"]
    assert mounts["driver-root"]["readOnly"] is True
    assert mounts["driver-root"]["mountPropagation"] == "HostToContainer"
    roots = daemon_settings(manifests).driver_roots
    assert str(roots.driver_host) == node["driverRoot"]
    assert str(roots.driver_seen) == "/driver-root"
    if node["devRoot"]:
        assert volumes["dev-root"]["path"] == node["devRoot"].rstrip("/") + "/dev"
        assert mounts["dev-root"]["mountPath"] == DRIVER_ROOT_VOLUMES["dev-root"]
        assert (str(roots.dev_host), str(roots.dev_seen)) == (node["devRoot"], "/dev-root")
    else:
        assert "dev-root" not in volumes
    hook = node["cdiHookPath"]
    settings = daemon_settings(manifests)
    if hook in ("", "off"):
        assert "cdi-hook" not in volumes
        assert settings.nvidia_cdi_hook_path == ("off" if hook else None)
    else:  # at its own path: vgpud checks it there and writes that path into the CDI hooks
        assert volumes["cdi-hook"] == {"path": hook, "type": "File"}
        assert mounts["cdi-hook"]["mountPath"] == hook and mounts["cdi-hook"]["readOnly"] is True
        assert str(settings.nvidia_cdi_hook_path) == hook
    pod = daemon["spec"]["template"]["spec"]
    assert pod.get("runtimeClassName", "") == node["runtimeClassName"]


def test_by_default_vgpud_runs_on_gpu_nodes_only() -> None:
    pod = one(render({}), "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    labels = {(t["matchExpressions"][0]["key"], tuple(t["matchExpressions"][0]["values"])) for t in terms}
    # either label makes a GPU node (the terms are ORed): GPU feature discovery's, node feature discovery's
    assert labels == {
        ("nvidia.com/gpu.present", ("true",)),
        ("feature.node.kubernetes.io/pci-10de.present", ("true",)),
    }
    # null removes a default map in helm (an empty map would merge into it and change nothing)
    pod = one(render({"node": {"affinity": None}}), "DaemonSet")["spec"]["template"]["spec"]
    assert "affinity" not in pod


#: several kubelets on one host: every node's paths under one directory, named by $(NODE_NAME)
NODE_ROOT = "/srv/nodes"
PER_NODE = {
    "hostPaths": {
        "nodeRoot": NODE_ROOT,
        "managerDir": f"{NODE_ROOT}/$(NODE_NAME)/vgpu",
        "cdiRoot": f"{NODE_ROOT}/$(NODE_NAME)/cdi",
        "nriRoot": f"{NODE_ROOT}/$(NODE_NAME)/nri",
        "kubeletRegistrarDir": f"{NODE_ROOT}/$(NODE_NAME)/kubelet/plugins_registry",
        "kubeletPluginsDir": f"{NODE_ROOT}/$(NODE_NAME)/kubelet/plugins",
    },
    "node": {"driverRoot": f"{NODE_ROOT}/$(NODE_NAME)/driver"},
    "featureGates": {"NRISupport": True},
}


def test_node_root_mounts_one_directory_and_each_pod_resolves_its_own_nodes_paths() -> None:
    manifests = render(PER_NODE)
    daemon = one(manifests, "DaemonSet")
    volumes = {v["name"]: v["hostPath"] for v in daemon["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container(daemon)["volumeMounts"]}
    assert volumes == {"node-root": {"path": NODE_ROOT, "type": "Directory"}, "cgroup": volumes["cgroup"]}
    assert set(mounts) == set(volumes)
    assert mounts["node-root"]["mountPath"] == NODE_ROOT
    assert mounts["node-root"]["mountPropagation"] == "Bidirectional"
    settings = daemon_settings(manifests)
    mine = f"{NODE_ROOT}/{NODE}"
    assert str(settings.manager_dir) == f"{mine}/vgpu"
    assert str(settings.cdi_root) == f"{mine}/cdi"
    assert str(settings.kubelet_plugins_dir) == f"{mine}/kubelet/plugins"
    # the driver root is seen at its host path, inside the one mount
    assert (
        str(settings.driver_roots.driver_host) == str(settings.driver_roots.driver_seen) == f"{mine}/driver"
    )
    env = resolved_env(daemon)
    assert (
        env["NRI_ROOT"] == f"{mine}/nri"
        and env["KUBELET_REGISTRAR_DIR"] == f"{mine}/kubelet/plugins_registry"
    )


def test_node_root_mounts_only_the_paths_under_it() -> None:
    values = {"hostPaths": {"nodeRoot": NODE_ROOT, "cdiRoot": f"{NODE_ROOT}/$(NODE_NAME)/cdi"}}
    daemon = one(render(values), "DaemonSet")
    volumes = {v["name"]: v["hostPath"]["path"] for v in daemon["spec"]["template"]["spec"]["volumes"]}
    assert volumes["node-root"] == NODE_ROOT and "cdi-root" not in volumes
    assert volumes["manager-dir"] == "/etc/vgpu-manager" and volumes["driver-root"] == "/"

"""Settings and feature gates: precedence, validation, and the gates' dependency rules."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vgpud.config import add_settings_arguments, gpu_source_from, settings_from
from vgpud.gates import GATES, gates_help, parse_feature_gates
from vgpud.gpu.mock import PROFILES_DIR
from vgpud.options import ConfigError


def _settings(argv: list[str], env: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return settings_from(parser.parse_args(argv), env or {})


def test_defaults_match_the_reference_system() -> None:
    s = _settings(["--node-name", "node-a"])
    assert s.driver_name == "manager.nvidia.com"
    assert s.manager_dir == Path("/etc/vgpu-manager")
    assert s.cdi_root == Path("/var/run/cdi")
    assert s.nri_socket == Path("/var/run/nri/nri.sock")
    assert s.registration_socket == Path("/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock")
    assert s.dra_socket == Path("/var/lib/kubelet/plugins/manager.nvidia.com/dra.sock")
    assert s.nri_plugin_idx == "00"
    assert s.healthcheck_port == 51515
    assert s.cgroup_driver is None and s.systemd_cgroups is None  # either layout
    assert s.gpu_backend == "nvml"
    assert s.feature_gates.enabled("VGPUSupport")
    assert not s.feature_gates.enabled("NRISupport")
    assert not s.feature_gates.enabled("DevicePluginClientMode")
    assert s.feature_gates.enabled("NVMLDeviceHealthCheck") and s.device_health_check
    assert s.health_ignored_xids == frozenset({13, 31, 43, 45, 68, 109})  # NVIDIA's device plugin's
    assert s.health_recovery_seconds == 300


def test_device_health_settings() -> None:
    s = _settings(["--health-ignored-xids", " 13, 79 ,13", "--health-recovery-seconds", "5"])
    assert s.health_ignored_xids == frozenset({13, 79}) and s.health_recovery_seconds == 5
    assert _settings([], {"HEALTH_IGNORED_XIDS": "none"}).health_ignored_xids == frozenset()
    assert not _settings(["--feature-gates", "NVMLDeviceHealthCheck=false"]).device_health_check


def test_the_health_gate_on_by_default_does_not_apply_to_the_mock_backend() -> None:
    s = _settings(["--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2"])
    assert s.feature_gates.enabled("NVMLDeviceHealthCheck") and not s.device_health_check


def test_flag_beats_environment_beats_default() -> None:
    env = {"NODE_NAME": "from-env", "HEALTHCHECK_PORT": "6000", "CGROUP_DRIVER": "systemd"}
    s = _settings(["--healthcheck-port", "7000"], env)
    assert s.node_name == "from-env"
    assert s.healthcheck_port == 7000
    assert s.cgroup_driver == "systemd" and s.systemd_cgroups is True


def test_log_format_is_text_unless_set_to_json() -> None:
    assert (_settings([]).log_format, _settings([]).log_level) == ("text", "info")
    assert _settings([], {"LOG_FORMAT": "JSON"}).log_format == "json"
    assert _settings(["--log-format", "text"], {"LOG_FORMAT": "json"}).log_format == "text"


def test_empty_environment_value_means_unset() -> None:
    assert _settings(["--node-name", "n"], {"HEALTHCHECK_PORT": ""}).healthcheck_port == 51515


def test_root_prefix_moves_default_paths_but_not_explicit_ones(short_tmp: Path) -> None:
    s = _settings(["--node-name", "n", "--root-prefix", str(short_tmp), "--cdi-root", "/elsewhere/cdi"])
    assert s.manager_dir == short_tmp / "etc/vgpu-manager"
    assert s.nri_root == short_tmp / "var/run/nri"
    assert s.kubelet_plugins_dir == short_tmp / "var/lib/kubelet/plugins"
    assert s.cdi_root == Path("/elsewhere/cdi")
    assert s.proc_root == Path("/proc")  # the host's /proc is read, never created


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["--healthcheck-port", "70000"], {}, "--healthcheck-port: 70000 is outside -1..65535"),
        (["--healthcheck-port", "x"], {}, "'x' is not an integer"),
        ([], {"HEALTHCHECK_PORT": "abc"}, "HEALTHCHECK_PORT (environment): 'abc' is not an integer"),
        (["--nri-plugin-idx", "1"], {}, "not exactly two digits"),
        (["--nri-plugin-idx", "0a"], {}, "not exactly two digits"),
        (["--host-manager-dir", "relative/dir"], {}, "is not an absolute path"),
        (["--cgroup-driver", "openrc"], {}, "not one of cgroupfs, systemd"),
        (["--driver-name", "Bad_Name"], {}, "is not a DNS subdomain"),
        (["--gpu-backend", "mock"], {}, "--gpu-backend mock needs --gpu-profile"),
        (["--gpu-profile", "a100-40gb-x2"], {}, "--gpu-profile is only used with --gpu-backend mock"),
        (["--gpu-backend", "mock", "--gpu-profile", "/no/such.yaml"], {}, "nor a readable file"),
        (["--device-cores-ratio", "0"], {}, "outside 1..10000"),
        (["--healthcheck-address", "localhost"], {}, "is not an IP address"),
        ([], {"FEATURE_GATES": "NRISupport=maybe"}, "the value must be true or false"),
        (["--kubelet-plugins-dir", "/" + "p" * 100], {}, "longer than the 107 bytes"),
        (["--health-ignored-xids", "13,x"], {}, "--health-ignored-xids: 'x' is not an XID"),
        ([], {"HEALTH_IGNORED_XIDS": "13,,31"}, "HEALTH_IGNORED_XIDS (environment): '' is not an XID"),
        (["--health-ignored-xids", "0"], {}, "'0' is not an XID (1..65535)"),
        (["--health-recovery-seconds", "0"], {}, "--health-recovery-seconds: 0 is outside 1..86400"),
        ([], {"LOG_FORMAT": "logfmt"}, "LOG_FORMAT (environment): 'logfmt' is not one of text, json"),
        (
            [
                "--gpu-backend",
                "mock",
                "--gpu-profile",
                "a100-40gb-x2",
                "--feature-gates",
                "NVMLDeviceHealthCheck=true",
            ],
            {},
            "NVMLDeviceHealthCheck=true needs --gpu-backend nvml: the mock GPU backend has no NVML",
        ),
    ],
)
def test_bad_values_name_the_setting(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(["--node-name", "n", *argv], env)
    assert fragment in str(info.value)


def test_observability_defaults_and_switches(short_tmp: Path) -> None:
    s = _settings(["--node-name", "n"])
    assert s.metrics_address == ("127.0.0.1", 9464)
    assert s.debug_socket_path == Path("/var/lib/kubelet/plugins/manager.nvidia.com/debug.sock")
    assert s.debug_address is None
    assert s.drift_interval == 60
    assert s.usage_interval == 10
    s = _settings(
        [
            "--node-name",
            "n",
            "--root-prefix",
            str(short_tmp),
            "--metrics-address",
            "",
            "--debug-socket",
            "off",
        ],
        {"DEBUG_ADDRESS": "[::1]:9465", "DRIFT_INTERVAL": "0", "USAGE_INTERVAL": "0"},
    )
    assert s.metrics_address is None and s.debug_socket_path is None
    assert s.debug_address == ("::1", 9465)
    assert s.drift_interval == 0
    assert s.usage_interval == 0
    s = _settings(["--node-name", "n", "--root-prefix", str(short_tmp), "--metrics-address", "0.0.0.0:0"])
    assert s.metrics_address == ("0.0.0.0", 0)
    assert s.debug_socket_path == short_tmp / "var/lib/kubelet/plugins/manager.nvidia.com/debug.sock"
    assert _settings(["--node-name", "n", "--metrics-address", "-1"]).metrics_address is None
    assert _settings(["--node-name", "n", "--debug-socket", "/run/x.sock"]).debug_socket_path == Path(
        "/run/x.sock"
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--metrics-address", "9464"], "--metrics-address: '9464' is not HOST:PORT"),
        (["--metrics-address", "localhost:9464"], "is not an IP address"),
        (["--metrics-address", "127.0.0.1:70000"], "outside 0..65535"),
        (["--debug-address", "0.0.0.0:9465"], "must be a loopback address"),
        (["--debug-socket", "debug.sock"], "is not an absolute path"),
        (["--debug-socket", "/" + "d" * 120], "longer than the 107 bytes"),
        (["--drift-interval", "-5"], "outside 0..86400"),
    ],
)
def test_bad_observability_settings(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings(["--node-name", "n", *argv])
    assert fragment in str(info.value)


def test_builtin_profile_names_resolve_to_shipped_files() -> None:
    s = _settings(["--node-name", "n", "--gpu-backend", "mock", "--gpu-profile", "h100-80gb-x8"])
    assert s.gpu_profile == PROFILES_DIR / "h100-80gb-x8.yaml"
    assert s.gpu_profile.is_file()


def test_gpu_source_ignores_unrelated_bad_settings() -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, ("gpu_backend", "gpu_profile", "nvml_library"))
    args = parser.parse_args(["--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2"])
    source = gpu_source_from(args, {"HEALTHCHECK_PORT": "not-a-port"})
    assert source.backend == "mock"
    assert source.profile == PROFILES_DIR / "a100-40gb-x2.yaml"


class TestFeatureGates:
    def test_defaults(self) -> None:
        gates = parse_feature_gates("")
        assert {g.name: gates.enabled(g.name) for g in GATES} == {
            "VGPUSupport": True,
            "NVMLDeviceHealthCheck": True,  # as the reference
            "DevicePluginClientMode": False,
            "NRISupport": False,
            "SharedSMUtilizationWatcher": False,
        }

    def test_kubernetes_syntax_with_spaces_and_case(self) -> None:
        gates = parse_feature_gates(" NRISupport=TRUE, DevicePluginClientMode=1 ,")
        assert gates.enabled("NRISupport") and gates.enabled("DevicePluginClientMode")

    @pytest.mark.parametrize(
        "dependent", ["NRISupport", "DevicePluginClientMode", "SharedSMUtilizationWatcher"]
    )
    def test_each_dependent_gate_requires_vgpu_support(self, dependent: str) -> None:
        """The reference's rule, checked before the refusal of VGPUSupport=false."""
        with pytest.raises(ConfigError, match=f"{dependent} requires VGPUSupport"):
            parse_feature_gates(f"VGPUSupport=false,{dependent}=true")

    @pytest.mark.parametrize(
        ("text", "fragment"),
        [
            ("VGPUSupport=false", "VGPUSupport=false is not supported: vgpud only shares GPUs as vGPUs"),
            ("SharedSMUtilizationWatcher=1", "SharedSMUtilizationWatcher=true is not supported: vgpud"),
        ],
    )
    def test_a_gate_vgpud_cannot_honour_is_refused(self, text: str, fragment: str) -> None:
        with pytest.raises(ConfigError, match=fragment):
            parse_feature_gates(text)

    def test_setting_what_is_true_anyway_is_accepted(self) -> None:
        text = "VGPUSupport=true,NVMLDeviceHealthCheck=true,SharedSMUtilizationWatcher=false"
        assert parse_feature_gates(text) == parse_feature_gates("")

    def test_the_gates_set_explicitly_are_kept(self) -> None:
        assert parse_feature_gates("NVMLDeviceHealthCheck=true").explicit == {"NVMLDeviceHealthCheck"}
        assert parse_feature_gates("").explicit == frozenset()

    def test_only_gates_that_work_are_offered(self) -> None:
        assert [g.name for g in GATES if g.settable] == [
            "NVMLDeviceHealthCheck",
            "DevicePluginClientMode",
            "NRISupport",
        ]
        assert gates_help() == (
            "NVMLDeviceHealthCheck (on): watch NVML for XIDs and lost GPUs; a sick GPU is marked unhealthy; "
            "DevicePluginClientMode (off): the library registers with vgpud (bit 200); "
            "NRISupport (off): per-container directories through containerd NRI"
        )

    @pytest.mark.parametrize(
        ("text", "fragment"),
        [
            ("NRISuport=true", "unknown feature gate 'NRISuport'"),
            ("NRISupport", "not of the form Name=true|false"),
            ("=true", "not of the form"),
        ],
    )
    def test_malformed(self, text: str, fragment: str) -> None:
        with pytest.raises(ConfigError, match=fragment):
            parse_feature_gates(text)

    def test_unknown_name_lookup_is_a_bug(self) -> None:
        with pytest.raises(KeyError):
            parse_feature_gates("").enabled("NoSuchGate")

    def test_str_round_trips(self) -> None:
        gates = parse_feature_gates("NRISupport=true")
        assert parse_feature_gates(str(gates)) == gates


def test_driver_roots_follow_the_toolkits_names(tmp_path: Path) -> None:
    from pathlib import PurePosixPath

    s = _settings([])
    assert s.driver_root == Path("/") and not s.driver_root_explicit
    roots = s.driver_roots
    assert (roots.driver_seen, roots.driver_host) == (Path("/"), PurePosixPath("/"))
    assert roots.dev_host == PurePosixPath("/")
    # the GPU Operator's layout: the host's /run/nvidia/driver mounted at /driver-root in vgpud's pod
    (tmp_path / "dev").mkdir()
    env = {"NVIDIA_DRIVER_ROOT": "/run/nvidia/driver", "DRIVER_ROOT_CTR_PATH": str(tmp_path)}
    s = _settings([], env)
    assert s.driver_root_explicit
    roots = s.driver_roots
    assert (roots.driver_seen, roots.driver_host) == (tmp_path, PurePosixPath("/run/nvidia/driver"))
    # its dev/ makes it the dev root too, unless one is set
    assert (roots.dev_seen, roots.dev_host) == (tmp_path, PurePosixPath("/run/nvidia/driver"))
    roots = _settings(["--dev-root", "/", "--dev-root-ctr-path", "/dev-root"], env).driver_roots
    assert (roots.dev_seen, roots.dev_host) == (Path("/dev-root"), PurePosixPath("/"))
    (tmp_path / "dev").rmdir()
    assert _settings([], env).driver_roots.dev_host == PurePosixPath("/")


def test_the_hook_setting_is_a_path_or_off() -> None:
    assert _settings([]).nvidia_cdi_hook_path is None
    assert _settings(["--nvidia-cdi-hook-path", "off"]).nvidia_cdi_hook_path == "off"
    hook = {"NVIDIA_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}
    assert _settings([], hook).nvidia_cdi_hook_path == Path("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    with pytest.raises(ConfigError, match="--nvidia-cdi-hook-path"):
        _settings(["--nvidia-cdi-hook-path", "relative/hook"])


def test_under_a_root_prefix_the_default_driver_root_moves_and_is_not_explicit(short_tmp: Path) -> None:
    s = _settings(["--root-prefix", str(short_tmp)])
    assert s.driver_root == short_tmp and not s.driver_root_explicit
    assert _settings(["--root-prefix", str(short_tmp), "--driver-root", "/opt/d"]).driver_root_explicit

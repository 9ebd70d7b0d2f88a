"""The `vgpud` command as a user runs it: help, usage errors, `gpus`, `version`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import built, unreachable_kubeconfig


def vgpud(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpud", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["gpus", "--help"],
        ["driver", "--help"],
        ["health", "--help"],
        ["debug", "tail", "--help"],
        ["debug", "state", "--help"],
        ["top", "--help"],
    ],
)
def test_help_exits_zero_and_documents_options(argv: list[str]) -> None:
    result = vgpud(*argv)
    assert result.returncode == 0, result.stderr
    assert "usage: vgpud" in result.stdout


def test_run_help_names_the_environment_variables() -> None:
    out = " ".join(vgpud("run", "--help").stdout.split())  # argparse wraps lines
    for env in (
        "NODE_NAME",
        "FEATURE_GATES",
        "HOST_MANAGER_DIR",
        "CDI_ROOT",
        "NRI_ROOT",
        "CGROUP_DRIVER",
        "HEALTHCHECK_PORT",
    ):
        assert f"[env {env}]" in out


def _help_entries(command: str) -> dict[str, str]:
    """`vgpud COMMAND --help`: each option's flag -> its help text, joined onto one line."""
    result = vgpud(command, "--help")
    assert result.returncode == 0, result.stderr
    entries: dict[str, str] = {}
    flag = ""
    for line in result.stdout.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            flag, _, text = line.strip().partition(" ")
            entries[flag] = text.strip()
        elif flag:
            entries[flag] += " " + line.strip()
    return {flag: " ".join(text.split()) for flag, text in entries.items()}


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_every_option_says_what_it_does_its_default_and_its_variable(command: str) -> None:
    from vgpud.config import OPTIONS
    from vgpud.webhook.config import WEBHOOK_OPTIONS

    options = OPTIONS if command == "run" else WEBHOOK_OPTIONS
    entries = _help_entries(command)
    for option in options:
        text = entries[option.flag]
        assert option.help.split()[0] in text, (option.flag, text)
        assert f"[env {option.env}]" in text, (option.flag, text)
        assert "(default: " in text, (option.flag, text)


@pytest.mark.parametrize("command", ["run", "webhook"])
def test_help_offers_both_log_formats(command: str) -> None:
    text = _help_entries(command)["--log-format"]
    assert "text" in text and "json" in text and "(default: text)" in text and "[env LOG_FORMAT]" in text


def test_run_help_lists_only_gates_that_work() -> None:
    gates = _help_entries("run")["--feature-gates"]
    assert "DevicePluginClientMode (off)" in gates and "NRISupport (off)" in gates
    assert "VGPUSupport is always on" in gates
    assert "NVMLDeviceHealthCheck (on)" in gates
    for refused in ("SharedSMUtilizationWatcher", "VGPUSupport (on)"):
        assert refused not in gates


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        (["run", "--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (["run", "--healthcheck-port", "99999"], {}, "--healthcheck-port: 99999 is outside -1..65535"),
        (["run"], {"FEATURE_GATES": "VGPUSupport=false,NRISupport=true"}, "NRISupport requires VGPUSupport"),
        (["run", "--feature-gates", "VGPUSupport=false"], {}, "VGPUSupport=false is not supported"),
        (
            ["run", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2"],
            {"FEATURE_GATES": "NVMLDeviceHealthCheck=true"},
            "NVMLDeviceHealthCheck=true needs --gpu-backend nvml",
        ),
        (
            ["run"],
            {"HEALTH_IGNORED_XIDS": "13;31"},
            "HEALTH_IGNORED_XIDS (environment): '13;31' is not an XID",
        ),
        (["run"], {"FEATURE_GATES": "SharedSMUtilizationWatcher=true"}, "no SM utilization watcher"),
        (["run", "--cgroup-driver", "openrc"], {}, "--cgroup-driver: 'openrc' is not one of"),
        (["run", "--log-format", "bogus"], {}, "--log-format: 'bogus' is not one of text, json"),
        (
            ["webhook", "--self-signed", "/tmp/unused"],
            {"LOG_FORMAT": "yaml"},
            "LOG_FORMAT (environment): 'yaml' is not one of text, json",
        ),
        (["run", "--gpu-backend", "mock"], {}, "--gpu-backend mock needs --gpu-profile"),
        (["frobnicate"], {}, "invalid choice: 'frobnicate'"),
        (["debug"], {}, "the following arguments are required: SUBCOMMAND"),
        (["debug", "tail", "--address", "nowhere"], {}, "--address: 'nowhere' is not HOST:PORT"),
        (["debug", "tail", "--outcome", "fine"], {}, "is not one of ok, error"),
        (["debug", "state", "--socket", "/a", "--address", "127.0.0.1:1"], {}, "not allowed with argument"),
        (["top", "--interval", "0"], {}, "argument --interval: 0 must be > 0 seconds"),
        (["top", "--interval", "-1"], {}, "argument --interval: -1 must be > 0 seconds"),
        (["top", "--interval", "soon"], {}, "argument --interval: 'soon' is not a number of seconds"),
        (["top", "--once", "--json"], {}, "argument --json: not allowed with argument --once"),
        (["top", "--address", "nowhere", "--once"], {}, "--address: 'nowhere' is not HOST:PORT"),
        (["top"], {}, "the live view needs a terminal: --once or --json print one reading"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], fragment: str
) -> None:
    result = vgpud(*argv, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


def test_debug_without_a_running_vgpud_is_one_line_and_exit_1(short_tmp) -> None:
    for argv in (["debug", "state"], ["debug", "tail", "--json"], ["top", "--once"], ["top", "--json"]):
        result = vgpud(*argv, env={"DEBUG_SOCKET": str(short_tmp / "debug.sock")})
        assert result.returncode == 1, result
        (line,) = result.stderr.strip().splitlines()
        assert str(short_tmp / "debug.sock") in line


def test_no_command_prints_help_and_exits_2() -> None:
    result = vgpud()
    assert result.returncode == 2
    assert "COMMAND" in result.stderr


def test_version() -> None:
    result = vgpud("version")
    assert result.returncode == 0
    assert result.stdout.startswith("vgpud ")


def test_gpus_mock_table_lists_both_a100s() -> None:
    result = vgpud("gpus", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "A100" in line]
    assert len(rows) == 2
    assert "2 GPU(s) from mock" in result.stdout


def test_gpus_shows_which_gpus_are_in_mig_mode() -> None:
    fake = built("fakenvml/libnvidia-ml.so.1")
    from vgpud.gpu.mock import PROFILES_DIR

    result = vgpud("gpus", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2-mig")
    assert result.returncode == 0, result.stderr
    header, gpu0, gpu1 = result.stdout.splitlines()[:3]
    assert header.split()[-1] == "MIG"
    assert gpu0.endswith("on (4 MIG devices)") and gpu1.split()[-1] == "-"
    assert "1 GPU(s) in MIG mode: vgpud does not share them" in result.stdout
    mock = vgpud("gpus", "--json", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2-mig")
    profile = str(PROFILES_DIR / "a100-40gb-x2-mig.yaml")
    nvml = vgpud("gpus", "--json", "--nvml-library", str(fake), env={"FAKE_NVML_PROFILE": profile})
    assert nvml.returncode == 0, nvml.stderr
    assert json.loads(nvml.stdout) == json.loads(mock.stdout)
    assert [len(g["mig_devices"]) for g in json.loads(mock.stdout)] == [4, 0]
    assert [g["excluded"] for g in json.loads(mock.stdout)] == [
        {"reason": "mig", "detail": "in MIG mode (4 MIG devices): vgpud does not share MIG GPUs"},
        None,
    ]


def test_gpus_json_mock_and_fake_nvml_agree() -> None:
    """The same profile through the mock backend and through pynvml + the fake libnvidia-ml."""
    fake = built("fakenvml/libnvidia-ml.so.1")
    mock = vgpud("gpus", "--json", "--gpu-backend", "mock", "--gpu-profile", "h100-80gb-x8")
    assert mock.returncode == 0, mock.stderr
    from vgpud.gpu.mock import PROFILES_DIR

    nvml = vgpud(
        "gpus",
        "--json",
        "--nvml-library",
        str(fake),
        env={"FAKE_NVML_PROFILE": str(PROFILES_DIR / "h100-80gb-x8.yaml")},
    )
    assert nvml.returncode == 0, nvml.stderr
    assert json.loads(nvml.stdout) == json.loads(mock.stdout)
    assert len(json.loads(mock.stdout)) == 8


def test_gpus_without_nvml_names_the_library(short_tmp) -> None:
    missing = short_tmp / "libnvidia-ml.so.1"
    result = vgpud("gpus", "--nvml-library", str(missing))
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_gpus_finds_nvml_in_the_driver_root_or_says_where_it_looked(short_tmp) -> None:
    result = vgpud("gpus", "--driver-root", str(short_tmp))
    assert result.returncode == 1
    assert f"no libnvidia-ml.so.1 under the driver root {short_tmp}" in result.stderr
    from tests.unit.nvdriver.roots import driver
    from vgpud.gpu.mock import PROFILES_DIR

    driver(short_tmp, lib_dir="usr/lib64")  # the fake NVML as libnvidia-ml.so.1 there, env mode
    found = vgpud(
        "gpus",
        "--json",
        "--driver-root",
        str(short_tmp),
        env={"FAKE_NVML_PROFILE": str(PROFILES_DIR / "a100-40gb-x2.yaml")},
    )
    assert found.returncode == 0, found.stderr
    assert len(json.loads(found.stdout)) == 2


def test_driver_prints_what_a_container_gets_or_why_not(short_tmp) -> None:
    mock = ("--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2")
    missing = vgpud("driver", *mock, "--driver-root", str(short_tmp))
    assert missing.returncode == 1
    assert "no libcuda.so.550.54.15 or libnvidia-ml.so.550.54.15 under the driver root" in missing.stderr
    from tests.unit.nvdriver.roots import driver, gpu_nodes

    driver(short_tmp)
    gpu_nodes(short_tmp)
    shown = vgpud("driver", *mock, "--driver-root", str(short_tmp), "--json")
    assert shown.returncode == 0, shown.stderr
    out = json.loads(shown.stdout)
    assert out["driverVersion"] == "550.54.15" and out["driverRoot"] == str(short_tmp)
    assert [d["minor"] for d in out["devices"]] == [0, 1]
    assert out["devices"][1]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia1"
    assert "NVIDIA_VISIBLE_DEVICES=void" in out["containerEdits"]["env"]
    table = vgpud("driver", *mock, "--driver-root", str(short_tmp), "--nvidia-cdi-hook-path", "off")
    assert table.returncode == 0, table.stderr
    assert f"{short_tmp}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15 -> " in table.stdout
    assert "no nvidia-cdi-hook: the links are bind mounts" in table.stdout


def test_run_with_json_logs_writes_only_json_lines(short_tmp: Path) -> None:
    """`vgpud run --log-format json` as a node runs it (mock GPUs, every path under a temp root, an API
    server that is not there): every line on stderr is one JSON object, until SIGTERM stops it."""
    kubeconfig = unreachable_kubeconfig(short_tmp / "kubeconfig")
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "LIBRARY_SOURCE": str(built("libvgpu/libvgpu-control.so")),
        "REGISTER_CLIENT_SOURCE": str(built("libvgpu/vgpu-register")),
    }
    argv = [
        *("run", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2", "--log-format", "json"),
        *("--root-prefix", str(short_tmp / "host"), "--kubeconfig", str(kubeconfig)),
        *("--healthcheck-address", "127.0.0.1", "--healthcheck-port", "0", "--metrics-address", "off"),
    ]
    log = short_tmp / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "vgpud", *argv], stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + 60
        while "is healthy" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, f"vgpud exited {proc.returncode}:\n{log.read_text()}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0]["logger"] == "vgpud" and lines[0]["message"].startswith("vgpud ")
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in lines)
    assert any(line["message"] == "vgpud stopped" for line in lines)

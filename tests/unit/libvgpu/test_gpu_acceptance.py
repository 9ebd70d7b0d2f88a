"""bench/gpu/acceptance.py end to end on the fake driver + NVML (--fake): every check of the real-GPU
run is in its JSON and passes, except what a fake cannot do (PTX JIT, PyTorch), which is skipped
with its reason; with a library that enforces nothing in LD_PRELOAD the memory checks fail and the
script exits 1. Phase `driver` on a fake driver root (root and nvidia-ctk needed): vgpud's edits as
the toolkit's, a container given one GPU's edits sees it alone under its limit, and a container given
the wrong GPU or no limit fails. Plus the pure rules that judge the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import edits, verdict
from bench.gpu.acceptance import parse
from bench.gpu.driver import default_tools
from bench.gpu.target import module_flavour
from tests.cudaclients import clients_python
from tests.support import REPO, built, require

SCRIPT = REPO / "bench" / "gpu" / "acceptance.py"
GIB = 1 << 30
DOORS = ("cuMemAlloc_v2", "cuGetProcAddress_v2", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemCreate")
TORCH = ("torch[default]", "torch[expandable_segments:True]", "torch[backend:cudaMallocAsync]")
CLIENTS = ("clients[cuda-bindings]", "clients[numba-cuda]", "clients[numba-cuda].view")
#: the fake's MIG-mode GPU (vgpud/gpu/profiles/a100-40gb-x2-mig.yaml, index 0)
MIG_CHECK = "mig[GPU-5c1e0a37-8d2b-4f60-a1e9-3b7f2c94d018]"
PASSING = (
    "build",
    "memory_views",
    *(f"alloc_{d}" for d in DOORS),
    "two_processes",
    *CLIENTS,
    MIG_CHECK,
    "core_unlimited",
    "core_30",
    "core_60",
    "overhead",
    "duration",
)
SKIPPED = ("ptx_jit", *TORCH)
DRIVER = ("driver_edits", "container")
#: the fake driver root's GPU the container gets (a100-40gb-x2, index 1) and the one it must not see
CONTAINER_GPU = "GPU-bdad1e16-755f-41d4-985c-16737eb6e907"
OTHER_GPU = "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479"


def driver_phase_runs() -> bool:
    """Phase driver's checks can run here: root (mknod, namespaces) and nvidia-ctk + nvidia-cdi-hook."""
    return os.geteuid() == 0 and None not in default_tools()


def require_driver_phase() -> None:
    require(os.geteuid() == 0, "root (mknod, mount and PID namespaces)", "run the tests as root")
    require(
        None not in default_tools(),
        "nvidia-ctk and nvidia-cdi-hook",
        "run hack/install-nvidia-ctk.sh (make node-deps, which the test command runs)",
    )


def acceptance(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    built("fakecuda/libcuda.so.1"), built("fakenvml/libnvidia-ml.so.1"), built("libvgpu/libvgpu-control.so")
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc.returncode, json.loads(out.read_text()), proc.stderr


@pytest.mark.needs_build
def test_fake_run_passes_every_check(tmp_path: Path) -> None:
    rc, report, log = acceptance(tmp_path)
    checks = {c["name"]: c for c in report["checks"]}
    assert sorted(checks) == sorted(PASSING + SKIPPED + DRIVER), log
    assert report["phases"][0] == "driver" and [c["name"] for c in report["checks"][1:3]] == list(DRIVER)
    passing = PASSING + DRIVER if driver_phase_runs() else PASSING
    failing = {n: checks[n]["detail"] for n in passing if checks[n]["status"] != "pass"}
    assert not failing, log
    for name in set(SKIPPED + DRIVER) - set(passing):
        assert checks[name]["status"] == "skip" and checks[name]["detail"], checks[name]
    assert rc == 0 and report["ok"] is True, log

    assert set(checks["memory_views"]["totals"].values()) == {4 * GIB}
    for door in DOORS:
        check = checks[f"alloc_{door}"]
        assert check["error"] == 2 and 0 < check["total"] <= 4 * GIB, check
        assert check["owner"].endswith("libvgpu-control.so"), check
    assert (checks["two_processes"]["first"], checks["two_processes"]["second"]) == (0, 2)
    core = report["figures"]["core"]
    assert core["core_unlimited"]["utilization"]["n"] > 0
    assert core["core_unlimited"]["grid"] == 4 * 132  # 4 blocks per SM of the H200-like profile
    assert abs(checks["core_30"]["ratio"] - 0.3) <= 0.15 and abs(checks["core_60"]["ratio"] - 0.6) <= 0.15
    assert set(report["figures"]["overhead"]["added_ns"]) == {"launch", "alloc_free"}
    env = report["environment"]
    assert env["name"] == "NVIDIA H200" and env["sms"] == 132
    assert env["libcuda"].endswith("fakecuda/libcuda.so.1")


@pytest.mark.needs_build
def test_the_gpu_path_over_a_fake_driver_found_by_soname(tmp_path: Path) -> None:
    """Without --fake the script finds libcuda.so.1 / libnvidia-ml.so.1 as an application does (here
    the fakes, through LD_LIBRARY_PATH) and GPU 0's UUID through NVML: the path a GPU machine takes,
    with its 100,000 launches (core runs shortened; NVIDIA's clients run in the --fake test)."""
    phases = "driver,memory,torch,core,overhead,mig"
    fakecuda = built("fakecuda/libcuda.so.1").parent
    fakenvml = built("fakenvml/libnvidia-ml.so.1").parent
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "MANAGER_", "VGPU_", "FAKE_"))},
        "LD_LIBRARY_PATH": f"{fakecuda}:{fakenvml}",
        "FAKE_NVML_PROFILE": str(REPO / "vgpud" / "gpu" / "profiles" / "a100-40gb-x2.yaml"),
        "FAKE_GPU_STATE": str(tmp_path / "gpu.state"),
        "FAKE_GPU_NS_PER_BLOCK": "4000",
    }
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--core-seconds",
            "3",
            "--no-build",
            "--out",
            str(out),
            "--phases",
            phases,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert proc.returncode == 0 and report["mode"] == "gpu", proc.stderr
    expected = [name for name in PASSING if name != MIG_CHECK and name not in CLIENTS] + ["mig"]
    assert sorted(checks) == sorted(expected + list(SKIPPED + DRIVER)), proc.stderr
    for name in DRIVER:  # no driver root holds a GPU found through FAKE_NVML_PROFILE
        assert checks[name]["status"] == "skip" and "FAKE_NVML_PROFILE" in checks[name]["detail"]
    assert checks["ptx_jit"]["status"] == "pass"  # no skip on this path (the fake loads any image)
    assert report["environment"]["uuid"] == "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479"  # NVML index 0
    assert report["environment"]["libcuda"] == str(fakecuda / "libcuda.so.1")
    assert report["figures"]["core"]["core_unlimited"]["grid"] == 4 * 108
    assert report["figures"]["overhead"]["launches"] == 100_000
    assert checks["mig"]["status"] == "skip" and "MIG mode is off on all 2 GPU(s)" in checks["mig"]["detail"]


@pytest.mark.needs_build
def test_driver_phase_on_a_fake_node(tmp_path: Path) -> None:
    """vgpud's edits of a fake driver root differ from nvidia-ctk's only by the two hooks it does not
    emit; a process whose root holds only GPU 1's edits sees GPU 1 alone, 4 GiB, OOM at the limit,
    through the library, on the root's libcuda."""
    require_driver_phase()
    rc, report, log = acceptance(tmp_path, "--phases", "driver", "--no-build")
    checks = {c["name"]: c for c in report["checks"]}
    assert (
        rc == 0 and checks["driver_edits"]["status"] == "pass" and checks["container"]["status"] == "pass"
    ), log

    compared = checks["driver_edits"]
    assert {(d["kind"], d["key"], d["allowed"]) for d in compared["differences"]} == {
        ("hook", "update-application-profile", "update-application-profile"),
        ("hook", "apply-cuda-memory-limits", "apply-cuda-memory-limits"),
    }
    assert compared["unexpected"] == 0 and all(d["why"] for d in compared["differences"])
    assert sorted(compared["vgpud"]) == sorted(["common", CONTAINER_GPU, OTHER_GPU])
    assert "NVIDIA_VISIBLE_DEVICES=void" in compared["toolkit"]["common"]["env"]

    ctr = checks["container"]
    seen = ctr["sees"]
    assert (seen["pid"], seen["cuda_count"], seen["nvml_count"]) == (1, 1, 1)
    assert seen["cuda_uuid"] == seen["nvml_uuid"] == CONTAINER_GPU == ctr["gpu"]["uuid"]
    assert (seen["meminfo_total"], seen["error"], seen["total"]) == (4 * GIB, 2, 4 * GIB)
    assert seen["alloc_owner"] == "/etc/vgpu-manager/driver/libvgpu-control.so"
    assert seen["libcuda_path"] == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert (seen["libcuda_dev"], seen["libcuda_ino"]) == (ctr["libcuda"]["dev"], ctr["libcuda"]["ino"])
    root = ctr["root"]
    gpu_nodes = [
        n.split()[0] for n in root["device_nodes"] if n.startswith("/dev/nvidia") and n[11:12].isdigit()
    ]
    assert gpu_nodes == ["/dev/nvidia1"]
    assert (
        root["env"]["CUDA_MEM_LIMIT_1"] == "4096m"
        and root["env"]["MANAGER_VISIBLE_DEVICE_1"] == CONTAINER_GPU
    )
    version = report["figures"]["driver"]["driver_version"]
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.1 -> libcuda.so.{version}" in root["symlinks"]
    assert sorted(root["hooks"]) == sorted(
        ["create-symlinks", "update-ldcache", "enable-cuda-compat", "disable-device-node-modification"]
    )
    assert root["ldcache"].endswith("over /usr/lib/x86_64-linux-gnu")
    assert "/lib64/ld-linux-x86-64.so.2" in root["files"] and "/usr/local/bin/ctrprobe" in root["files"]
    assert root["root"] in ("pivot_root", "chroot")


@pytest.mark.needs_build
@pytest.mark.parametrize(
    ("fault", "wrong"),
    [
        ("wrong-gpu", f"cuda sees {OTHER_GPU} at 0, not {CONTAINER_GPU}"),
        ("no-limit", f"cuMemGetInfo_v2 total {40 * GIB} != limit {4 * GIB}"),
    ],
)
def test_a_container_with_the_wrong_gpu_or_no_limit_fails(tmp_path: Path, fault: str, wrong: str) -> None:
    """--container-fault gives the container GPU 0's node (its env still names GPU 1), or drops its
    CUDA_MEM_LIMIT_1: the probe runs as before and the container check itself fails; exit 1."""
    require_driver_phase()
    rc, report, log = acceptance(tmp_path, "--phases", "driver", "--no-build", "--container-fault", fault)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and report["ok"] is False, log
    assert checks["driver_edits"]["status"] == "pass"
    ctr = checks["container"]
    assert ctr["status"] == "fail" and wrong in ctr["detail"], ctr["detail"]
    assert ctr["fault"] == fault and ctr["sees"]["pid"] == 1
    if fault == "wrong-gpu":  # the library refuses a GPU not the container's: no context, nothing measured
        assert ctr["sees"]["device_rc"] == 101 and "memory not measured" in ctr["detail"]
    else:  # the whole GPU: no OOM up to the probe's cap (the limit + 4 chunks)
        assert (ctr["sees"]["error"], ctr["sees"]["total"]) == (0, 4 * GIB + (4 << 29))


@pytest.mark.needs_build
def test_a_library_that_enforces_nothing_fails(tmp_path: Path) -> None:
    """The fake NVML preloaded in the library's place: no limited views, no OOM; exit 1."""
    rc, report, log = acceptance(
        tmp_path, "--library", str(built("fakenvml/libnvidia-ml.so.1")), "--phases", "memory", "--no-build"
    )
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and report["ok"] is False, log
    assert checks["memory_views"]["status"] == "fail"
    for door in DOORS:
        assert checks[f"alloc_{door}"]["status"] == "fail", checks[f"alloc_{door}"]
    assert checks["two_processes"]["status"] == "fail"
    assert checks["build"]["status"] == "skip"


@pytest.mark.needs_build
def test_clients_fail_under_a_library_that_enforces_nothing(tmp_path: Path) -> None:
    """NVIDIA's clients with the fake NVML preloaded in the library's place: they take every step."""
    clients_python()
    rc, report, log = acceptance(
        tmp_path, "--library", str(built("fakenvml/libnvidia-ml.so.1")), "--phases", "clients", "--no-build"
    )
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1, log
    assert [checks[name]["status"] for name in CLIENTS] == ["fail"] * 3, log
    assert "fill under the library: 8 steps, error 0" in checks["clients[cuda-bindings]"]["detail"]


def test_mig_rules() -> None:
    """A MIG GPU passes when it lists MIG devices and is excluded; fails when published or empty."""
    mig_device = {"uuid": "MIG-1", "memory_total": 5 * GIB, "multiprocessor_count": 14}
    gpu = {"uuid": "GPU-a", "memory_total": 40 * GIB, "mig_mode": True, "mig_devices": [mig_device]}
    excluded = {"reason": "mig", "detail": "in MIG mode"}
    assert verdict.mig([{**gpu, "excluded": excluded}])[0]["status"] == "pass"
    published = verdict.mig([{**gpu, "excluded": None}])[0]
    assert published["status"] == "fail" and "not left out" in published["detail"]
    empty = verdict.mig([{**gpu, "mig_devices": [], "excluded": excluded}])[0]
    assert empty["status"] == "fail" and "no MIG device listed" in empty["detail"]
    too_big = {**mig_device, "memory_total": 41 * GIB}
    assert verdict.mig([{**gpu, "mig_devices": [too_big], "excluded": excluded}])[0]["status"] == "fail"
    assert verdict.mig([{**gpu, "mig_mode": False}])[0]["status"] == "skip"


@pytest.mark.needs_build
def test_client_mode_registers_every_phase_process(tmp_path: Path) -> None:
    """--mode 236: the stub register client puts each phase process into pids.config; limits hold."""
    rc, report, log = acceptance(tmp_path, "--mode", "236", "--phases", "memory", "--no-build")
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0, log
    # info, five doors, the holder and the second process: one registration each
    assert checks["registration"]["pids"] == 8, checks["registration"]
    assert checks["two_processes"]["status"] == "pass"


@pytest.mark.needs_build
def test_a_missing_library_fails(tmp_path: Path) -> None:
    rc, report, log = acceptance(tmp_path, "--library", str(tmp_path / "nope.so"), "--no-build")
    assert rc == 1, log
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["library"]


def test_unknown_phase_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--phases", "memory,burn", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and "burn" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def _run(rate: float, mean: float) -> dict:
    return {"rate": rate, "launches": int(rate), "utilization": {"mean": mean, "p95": mean, "n": 10}}


def test_core_rule_flags_a_miss_beyond_the_tolerance() -> None:
    unlimited = _run(1000, 99)
    assert verdict.core_limited(30, _run(440, 31), unlimited)["status"] == "pass"
    assert verdict.core_limited(30, _run(460, 31), unlimited)["status"] == "fail"  # ratio 0.46
    assert verdict.core_limited(60, _run(600, 44), unlimited)["status"] == "fail"  # utilization 0.44
    assert verdict.core_unlimited(_run(1000, 79))["status"] == "fail"


def test_door_rule() -> None:
    ok = {"door": "cuMemAlloc_v2", "owner": "/x/libvgpu-control.so", "error": 2, "count": 7, "total": 7 << 29}
    assert verdict.door(ok, 4 * GIB)["status"] == "pass"
    assert verdict.door({**ok, "error": 0}, 4 * GIB)["status"] == "fail"
    assert verdict.door({**ok, "total": 9 << 29}, 4 * GIB)["status"] == "fail"
    assert verdict.door({**ok, "total": 1 << 29}, 4 * GIB)["status"] == "fail"  # far below the limit
    assert verdict.door({**ok, "owner": "/usr/lib/libcuda.so.1"}, 4 * GIB)["status"] == "fail"


def test_torch_results_are_read_and_judged() -> None:
    """A PyTorch run that stopped with OutOfMemoryError is a result, not a failed phase."""
    line = json.dumps(
        {
            "mem_get_info": {"free": 3 * GIB, "total": 4 * GIB},
            "stopped_by": "OutOfMemoryError",
            "count": 13,
            "total": 13 << 28,
            "reserved": 13 << 28,
            "torch": "2.5.1",
        }
    )
    result = parse(0, "warning from torch\n" + line + "\n", "", ["torch"])
    assert verdict.torch_run("", result, 4 * GIB)["status"] == "pass"
    assert verdict.torch_run("", {**result, "stopped_by": None}, 4 * GIB)["status"] == "fail"
    wide = {**result, "mem_get_info": {"free": 0, "total": 140 * GIB}}
    assert verdict.torch_run("", wide, 4 * GIB)["status"] == "fail"


def test_a_failed_phase_keeps_its_reason() -> None:
    crashed = parse(1, '{"exception": "CudaError: cuInit returned 3"}\n', "trace", ["info", "GPU-x"])
    assert crashed == {"phase_error": "info GPU-x: CudaError: cuInit returned 3; stderr: trace"}
    assert "exit -11" in parse(-11, "", "Segmentation fault", ["spin"])["phase_error"]
    assert "phase_error" in parse(0, "not json\n", "", ["once"])


def test_summary_mean_and_p95() -> None:
    got = verdict.summary([float(v) for v in range(1, 101)])
    assert got == {"mean": 50.5, "p95": 95.0, "n": 100}
    assert verdict.summary([]) == {"mean": 0.0, "p95": 0.0, "n": 0}


@pytest.mark.parametrize(
    ("version", "license_", "flavour"),
    [
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build", "", "open"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20", "NVIDIA\n", "proprietary"),
        ("", "Dual MIT/GPL\n", "open"),
        ("", "", "unknown"),
    ],
)
def test_module_flavour(version: str, license_: str, flavour: str) -> None:
    assert module_flavour(version, license_) == flavour


LIB = "/usr/lib/x86_64-linux-gnu"
XORG = "/usr/lib/xorg/modules"
HOOK = "/usr/bin/nvidia-cdi-hook"
FILE_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def _mount(path: str) -> dict:
    return {"hostPath": path, "containerPath": path, "options": FILE_OPTIONS}


def _hook(name: str, *args: str) -> dict:
    return {"hookName": "createContainer", "path": HOOK, "args": ["nvidia-cdi-hook", name, *args]}


def _node(path: str, major: int, minor: int) -> dict:
    return {"path": path, "hostPath": path, "major": major, "minor": minor, "fileMode": 0o666}


def _real_node_pair() -> tuple[dict, dict]:
    """A toolkit spec and vgpud edits as a real GPU node with graphics files gives them."""
    ctl, gpu = _node("/dev/nvidiactl", 195, 255), _node("/dev/nvidia0", 195, 0)
    common = [_mount(f"{LIB}/libcuda.so.570.1"), _mount(f"{LIB}/libEGL_nvidia.so.570.1")]
    cuda_link = f"libcuda.so.1::{LIB}/libcuda.so"
    dri = [_node("/dev/dri/card1", 226, 1), _node("/dev/dri/renderD128", 226, 128)]
    by_path = "../card1::/dev/dri/by-path/pci-0000:19:00.0-card"
    spec = {
        "devices": [
            {
                "name": "GPU-x",
                "containerEdits": {
                    "deviceNodes": [gpu, *dri],
                    "hooks": [
                        _hook("create-symlinks", "--link", by_path),
                        _hook("apply-cuda-memory-limits", "--gpu-id", "GPU-x"),
                    ],
                },
            }
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [ctl],
            "mounts": [
                *common,
                _mount("/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
                _mount("/etc/vulkan/icd.d/nvidia_icd.json"),
                _mount(f"{LIB}/libnvidia-egl-wayland.so.1.1.13"),
                _mount(f"{LIB}/libnvidia-egl-xcb.so.1"),
                _mount(f"{XORG}/drivers/nvidia_drv.so"),
                _mount(f"{XORG}/extensions/libglxserver_nvidia.so.570.1"),
            ],
            "hooks": [
                _hook(
                    "create-symlinks",
                    *("--link", cuda_link),
                    *("--link", f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so"),
                    *("--link", f"libglxserver_nvidia.so.570.1::{XORG}/extensions/libglxserver_nvidia.so"),
                ),
                _hook("update-ldcache", "--folder", LIB, "--folder", f"{XORG}/extensions"),
                _hook("update-application-profile"),
            ],
        },
    }
    ours = {
        "driverVersion": "570.1",
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [ctl],
            "mounts": [{**m, "type": "bind"} for m in common],
            "hooks": [
                _hook("create-symlinks", "--link", cuda_link),
                _hook("update-ldcache", "--folder", LIB),
            ],
        },
        "devices": [
            {"uuid": "GPU-x", "index": 0, "minor": 0, "containerEdits": {"deviceNodes": [dict(gpu)]}}
        ],
    }
    return spec, ours


def test_a_real_nodes_graphics_files_are_allowed_differences() -> None:
    spec, ours = _real_node_pair()
    found = edits.compare(spec, ours)
    assert found["unexpected"] == 0, [d for d in found["differences"] if not d["allowed"]]
    rules = {(d["scope"], d["key"]): d["allowed"] for d in found["differences"]}
    assert rules[("GPU-x", "/dev/dri/renderD128")] == "dri-nodes"
    assert rules[("GPU-x", "create-symlinks")] == "dri-nodes"
    assert rules[("GPU-x", "apply-cuda-memory-limits")] == "apply-cuda-memory-limits"
    assert rules[("common", "update-application-profile")] == "update-application-profile"
    assert rules[("common", f"update-ldcache --folder {XORG}/extensions")] == "graphics-folders"
    gbm = f"create-symlinks --link ../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so"
    assert rules[("common", gbm)] == "graphics-links"
    mounts = sorted(d["allowed"] for d in found["differences"] if d["kind"] == "mount")
    assert mounts == ["egl-libraries"] * 2 + ["graphics-configs"] * 2 + ["xorg-modules"] * 2
    assert all(d["why"] for d in found["differences"])
    assert verdict.driver_edits(found)["status"] == "pass"


def _toolkit_mounts(spec: dict, ours: dict, path: str) -> None:
    spec["containerEdits"]["mounts"].append(_mount(path))


#: changes to the real-node pair that no allowance covers, and the kind of difference each makes
CHANGES = {
    # the toolkit hands over a library of the driver's version that vgpud does not
    "versioned library": (
        lambda s, o: _toolkit_mounts(s, o, f"{LIB}/libnvidia-ptxjitcompiler.so.570.1"),
        "mount",
    ),
    # ... or, as a file, one of the names vgpud makes as a link
    "a vgpud link's name": (lambda s, o: _toolkit_mounts(s, o, f"{LIB}/libcuda.so.1"), "mount"),
    # vgpud hands over something the toolkit does not
    "vgpud only": (lambda s, o: o["containerEdits"]["mounts"].append(_mount("/usr/bin/nvidia-smi")), "mount"),
    # the same node with another mode
    "node mode": (
        lambda s, o: o["devices"][0]["containerEdits"]["deviceNodes"][0].update(fileMode=0o600),
        "device_node",
    ),
    # a toolkit-only library folder that holds more than graphics files
    "library folder": (
        lambda s, o: (
            s["containerEdits"]["hooks"][1]["args"].extend(["--folder", f"{LIB}/vdpau"])
            or _toolkit_mounts(s, o, f"{LIB}/vdpau/libvdpau_nvidia.so.570.1")
        ),
        "hook_arg",
    ),
    # vgpud without the GPU
    "no device": (lambda s, o: o["devices"].clear(), "device"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_other_differences_fail(change: str) -> None:
    spec, ours = _real_node_pair()
    apply, kind = CHANGES[change]
    apply(spec, ours)
    found = edits.compare(spec, ours)
    assert kind in {d["kind"] for d in found["differences"] if not d["allowed"]}, found["differences"]
    check = verdict.driver_edits(found)
    assert check["status"] == "fail" and "vgpud does not document" in check["detail"]

"""Phase `driver` of the acceptance run: what vgpud hands a vGPU container of the GPU itself.

- `driver_edits`: `vgpud driver --json` against `nvidia-ctk cdi generate --mode=nvml` for the same
  driver root and dev root (the machine's, `/`; on --fake a fake driver root built by tests.fakedriver
  with its fake kernel running), compared by bench/gpu/edits.py. Needs nvidia-ctk and nvidia-cdi-hook
  (a skip with its reason when they are missing: the GPU machine may have no Go to build them).
- `container`: a process in new mount and PID namespaces whose root holds only vgpud's edits of one
  GPU, the control library and a minimal userland (bench/gpu/container.py), running ctrprobe.c
  there: it must see that GPU alone, by its UUID, with the memory limit as its total, be refused at
  the limit, and load the driver root's libcuda.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.gpu import container, edits, verdict
from bench.gpu.target import REPO

if TYPE_CHECKING:
    from bench.gpu.acceptance import Run

NAMES = ("driver_edits", "container")
PROBE_SOURCE = REPO / "bench" / "gpu" / "ctrprobe.c"
#: where `--nvidia-ctk` / `--nvidia-cdi-hook` are looked for when not given, after the cache's env file
BUILD_CTK_DIR = REPO / "build" / "nvidia-ctk"
#: the fake node: two GPUs, so a container given one of them has another to not see
FAKE_PROFILE = REPO / "vgpud" / "gpu" / "profiles" / "a100-40gb-x2.yaml"
#: what `--container-fault` breaks, to prove the container check fails (the test uses them)
FAULTS = ("wrong-gpu", "no-limit")
TOOL_TIMEOUT_S = 90
CONTAINER_TIMEOUT_S = 120
#: the variables none of the driver phase's processes inherit (the fakes' test settings among them:
#: the fake libraries in a driver root find their kernel by themselves, as a driver its module)
CLEARED = ("FAKE_", "CUDA_", "MANAGER_", "VGPU_", "NVIDIA_VISIBLE")


@dataclass(frozen=True)
class DriverSettings:
    """The phase's options (acceptance.py's command line)."""

    nvidia_ctk: Path | None = None
    nvidia_cdi_hook: Path | None = None
    driver_root: Path = Path("/")
    dev_root: Path | None = None
    vgpud_python: str | None = None
    fault: str | None = None


class Unavailable(Exception):
    """The phase cannot run on this machine (the message says why): its checks are skipped."""


@dataclass(frozen=True)
class Node:
    """The driver under test: its roots, nvidia-cdi-hook (None: none), and how to pick the GPU."""

    driver_root: Path
    dev_root: Path
    cdi_hook: Path | None
    #: the UUID of the GPU the container gets; None: vgpud's device of the highest index
    uuid: str | None


def cache_dir() -> Path:
    """hack/install-nvidia-ctk.sh's cache (VGPUD_CACHE, else ~/.cache/vgpud)."""
    return Path(os.environ.get("VGPUD_CACHE") or Path.home() / ".cache" / "vgpud")


def default_tools() -> tuple[Path | None, Path | None]:
    """nvidia-ctk and nvidia-cdi-hook: <cache>/nvidia-ctk.env's when it exists, else build/nvidia-ctk/'s
    (where a GPU machine without Go gets copies), else None."""
    try:
        text = (cache_dir() / "nvidia-ctk.env").read_text()
    except OSError:
        text = ""
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    ctk, hook = env.get("NVIDIA_CTK_BIN"), env.get("NVIDIA_CDI_HOOK_BIN")
    if ctk and hook and Path(ctk).is_file() and Path(hook).is_file():
        return Path(ctk), Path(hook)

    def built(name: str) -> Path | None:
        path = BUILD_CTK_DIR / name
        return path if path.is_file() else None

    return built("nvidia-ctk"), built("nvidia-cdi-hook")


def clean_env(run: Run) -> dict[str, str]:
    """This process's environment without the library's, the runtime's and the fakes' variables (and
    without what --fake put in it), the repository on PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(CLEARED) and k != "LD_PRELOAD" and k not in run.target.base
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def vgpud_python(settings: DriverSettings) -> str:
    """The Python that runs vgpud: --vgpud-python, else the repository's venv, else this one."""
    if settings.vgpud_python:
        return settings.vgpud_python
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if os.access(venv, os.X_OK) else sys.executable


def tail(text: str, limit: int = 1500) -> str:
    return text.strip()[-limit:]


def run_json(argv: list[str], env: dict[str, str], what: str) -> dict:
    """A command's stdout as JSON; RuntimeError with its stderr when it fails."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}: {tail(done.stderr)}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"{what} printed no JSON ({exc}): {tail(done.stdout, 300)}") from exc


@contextmanager
def fake_node(work: Path, hook: Path | None) -> Iterator[Node]:
    """A fake driver root (tests.fakedriver: two A100s) with nvidia-cdi-hook in usr/bin, its kernel
    running for the duration."""
    if os.geteuid() != 0:
        raise Unavailable("the fake driver root needs root (mknod of its device nodes, ldconfig -r)")
    try:
        from tests.fakedriver import INSTALL, FakeKernel, build_driver_root, fake_driver_available
    except ImportError as exc:
        raise Unavailable(
            f"the fake driver root needs tests.fakedriver and its imports ({exc}): run with the repository's "
            "venv"
        ) from exc
    if not fake_driver_available():
        raise Unavailable(f"the fake driver is not built: {INSTALL}")
    root = work / "root"
    root.mkdir()
    layout = build_driver_root(root, FAKE_PROFILE, cdi_hook=hook)
    with FakeKernel.start(FAKE_PROFILE, work / "gpu.state", layout.kernel_socket):
        yield Node(root, root, layout.cdi_hook, None)


@contextmanager
def real_node(settings: DriverSettings, hook: Path | None, uuid: str) -> Iterator[Node]:
    """The machine's driver (--driver-root, --dev-root) and the GPU under test."""
    yield Node(settings.driver_root, settings.dev_root or settings.driver_root, hook, uuid)


def vgpud_edits(run: Run, settings: DriverSettings, node: Node) -> dict:
    argv = [vgpud_python(settings), "-m", "vgpud", "driver", "--json"]
    argv += ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root)]
    argv += ["--nvidia-cdi-hook-path", str(node.cdi_hook) if node.cdi_hook else "off"]
    return run_json(argv, clean_env(run), " ".join(argv[2:]))


def toolkit_spec(run: Run, ctk: Path, node: Node) -> dict:
    argv = [str(ctk), "cdi", "generate", "--mode=nvml", "--format=json", "--no-all-device"]
    argv += [
        "--device-name-strategy=uuid",
        f"--driver-root={node.driver_root}",
        f"--dev-root={node.dev_root}",
    ]
    argv += ["--feature-flags=disable-nvsandboxutils", f"--nvidia-cdi-hook-path={node.cdi_hook}"]
    # the toolkit also looks for executables along its own $PATH under the driver root; vgpud looks in
    # the default PATH directories only (docs/driver-root.md): give the toolkit those
    env = {**clean_env(run), "PATH": container.CONTAINER_PATH_ENV}
    return run_json(argv, env, f"{ctk.name} cdi generate")


def toolkit_version(ctk: Path) -> str:
    try:
        done = subprocess.run(
            [str(ctk), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as exc:
        return f"? ({exc})"
    return (done.stdout.strip().splitlines() or ["?"])[0]


def compare_edits(run: Run, settings: DriverSettings, node: Node, ours: dict) -> dict[str, Any]:
    """Check `driver_edits`."""
    ctk = settings.nvidia_ctk
    if ctk is None or not ctk.is_file():
        return verdict.skip(
            "driver_edits",
            f"no nvidia-ctk ({ctk or 'not given'}): pass --nvidia-ctk, or put it in {BUILD_CTK_DIR} "
            "(hack/install-nvidia-ctk.sh builds it)",
        )
    if node.cdi_hook is None:
        return verdict.skip("driver_edits", "no nvidia-cdi-hook: pass --nvidia-cdi-hook")
    try:
        spec = toolkit_spec(run, ctk, node)
    except RuntimeError as exc:
        return verdict.record("driver_edits", False, str(exc))
    found = edits.compare(spec, ours)
    figures = {
        "toolkit_version": toolkit_version(ctk),
        "driver_root": str(node.driver_root),
        "dev_root": str(node.dev_root),
        "nvidia_cdi_hook": str(node.cdi_hook),
        "toolkit_path": container.CONTAINER_PATH_ENV,
        "vgpud": edits.summary(edits.scopes_of_vgpud(ours)),
        "toolkit": edits.summary(edits.scopes_of_toolkit(spec)),
        **found,
    }
    return verdict.driver_edits(figures)


def build_probe(work: Path, libcuda: str) -> Path:
    """ctrprobe.c linked against the driver root's libcuda (by its soname, libcuda.so.1)."""
    out = work / "ctrprobe"
    argv = [
        "gcc",
        "-std=gnu11",
        "-O1",
        "-Wall",
        "-Werror",
        "-o",
        str(out),
        str(PROBE_SOURCE),
        libcuda,
        "-ldl",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except OSError as exc:
        raise RuntimeError(f"gcc: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(f"gcc of {PROBE_SOURCE.name} exited {done.returncode}: {tail(done.stderr)}")
    return out


def pick(ours: dict, node: Node) -> tuple[dict, dict | None]:
    """vgpud's device for the GPU under test, and another of its devices (None: it has one)."""
    devices = sorted(ours.get("devices", ()), key=lambda d: d["index"])
    if not devices:
        raise RuntimeError("vgpud's edits have no device")
    if node.uuid is None:
        chosen = devices[-1]
    else:
        matching = [d for d in devices if d["uuid"] == node.uuid]
        if not matching:
            raise RuntimeError(
                f"vgpud's edits have no device {node.uuid} (they have {[d['uuid'] for d in devices]})"
            )
        chosen = matching[0]
    others = [d for d in devices if d["uuid"] != chosen["uuid"]]
    return chosen, (others[0] if others else None)


def libcuda_mount(ours: dict) -> dict:
    """The edits' mount of libcuda.so.<driver version>."""
    name = f"libcuda.so.{ours.get('driverVersion')}"
    for mount in ours["containerEdits"].get("mounts", ()):
        if Path(mount["containerPath"]).name == name:
            return mount
    raise RuntimeError(f"vgpud's edits mount no {name}")


def parse_probe(stdout: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """ctrprobe's `key value` lines (numbers as ints) and the runner's `setup {json}` line."""
    seen: dict[str, Any] = {}
    setup: dict[str, Any] = {}
    for line in stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "setup":
            try:
                setup = json.loads(value)
            except json.JSONDecodeError:
                setup = {"unreadable": value}
            continue
        try:
            seen[key] = int(value)
        except ValueError:
            seen[key] = value
    return seen, setup


def host_file(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"dev": f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}", "ino": st.st_ino}


def run_container(
    run: Run, settings: DriverSettings, node: Node, ours: dict, *, limit: int, chunk: int
) -> dict[str, Any]:
    """Check `container`."""
    if os.geteuid() != 0:
        return verdict.skip("container", "needs root (mount and PID namespaces, mknod)")
    try:
        chosen, other = pick(ours, node)
        libcuda = libcuda_mount(ours)
        host_libcuda = {
            "host": libcuda["hostPath"],
            "container": libcuda["containerPath"],
            **host_file(libcuda["hostPath"]),
        }
        work = run.target.work / "driver"
        probe = build_probe(work, libcuda["hostPath"])
    except (RuntimeError, OSError) as exc:
        return verdict.record("container", False, str(exc))
    index, uuid = chosen["index"], chosen["uuid"]
    env = {
        "LD_PRELOAD": container.CONT_CONTROL_LIBRARY,
        "MANAGER_COMPATIBILITY_MODE": "0",
        f"MANAGER_VISIBLE_DEVICE_{index}": uuid,
        f"CUDA_MEM_LIMIT_{index}": f"{limit >> 20}m",
    }
    given = chosen["containerEdits"]
    if settings.fault == "no-limit":
        del env[f"CUDA_MEM_LIMIT_{index}"]
    elif settings.fault == "wrong-gpu":
        if other is None:
            return verdict.record("container", False, "--container-fault wrong-gpu needs a second GPU")
        given = other["containerEdits"]
    (work / "ctr").mkdir()
    try:
        spec = container.plan(
            ours["containerEdits"],
            given,
            root=work / "ctr",
            probe=probe,
            probe_args=[str(chunk), str(limit // chunk + 4)],
            library=run.library,
            partition=work / "partition",
            env=env,
        )
    except container.PlanError as exc:
        return verdict.record("container", False, f"the root cannot be made: {exc}")
    plan_file = work / "container.json"
    plan_file.write_text(json.dumps(spec, indent=1))
    argv = [sys.executable, "-m", "bench.gpu.container", str(plan_file)]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=clean_env(run),
            cwd=REPO,
            timeout=CONTAINER_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return verdict.record("container", False, f"the container did not end within {CONTAINER_TIMEOUT_S} s")
    seen, setup = parse_probe(done.stdout)
    figures = {
        "gpu": {"uuid": uuid, "index": index, "minor": chosen["minor"]},
        "fault": settings.fault,
        "limit": limit,
        "rc": done.returncode,
        "sees": seen,
        "libcuda": host_libcuda,
        "root": {
            **setup,
            "env": spec["env"],
            "hooks": spec["hooks"],
        },
    }
    if done.returncode == container.SETUP_FAILED or not setup or "unreadable" in setup:
        return verdict.record(
            "container", False, f"the container was not set up: {tail(done.stderr)}", **figures
        )
    figures["stderr"] = tail(done.stderr, 800)
    return verdict.container(figures)


def phase(run: Run, settings: DriverSettings, *, limit: int, chunk: int) -> None:
    """Both checks, on the machine's driver or (--fake) a fake node."""
    if not run.target.fake and os.environ.get("FAKE_NVML_PROFILE"):
        for name in NAMES:
            run.add(
                verdict.skip(
                    name,
                    "the GPU under test is a fake found through FAKE_NVML_PROFILE: no driver root holds it",
                )
            )
        return
    work = run.target.work / "driver"
    work.mkdir()
    hook = settings.nvidia_cdi_hook
    hook = hook if hook is not None and hook.is_file() else None
    nodes = fake_node(work, hook) if run.target.fake else real_node(settings, hook, run.uuid)
    done: list[str] = []

    def add(check: dict[str, Any]) -> None:
        done.append(check["name"])
        run.add(check)

    try:
        with nodes as node:
            try:
                ours = vgpud_edits(run, settings, node)
            except RuntimeError as exc:
                for name in NAMES:
                    add(verdict.record(name, False, str(exc)))
                return
            run.figures["driver"] = {
                "driver_version": ours.get("driverVersion"),
                "driver_root": str(node.driver_root),
                "dev_root": str(node.dev_root),
                "nvidia_ctk": str(settings.nvidia_ctk) if settings.nvidia_ctk else None,
                "nvidia_cdi_hook": str(node.cdi_hook) if node.cdi_hook else None,
                "vgpud_python": vgpud_python(settings),
            }
            add(compare_edits(run, settings, node, ours))
            add(run_container(run, settings, node, ours, limit=limit, chunk=chunk))
    except Unavailable as exc:
        for name in NAMES:
            add(verdict.skip(name, str(exc)))
    except (RuntimeError, OSError, ValueError) as exc:  # the fake node could not be made or ended badly
        for name in NAMES:
            if name not in done:
                add(verdict.record(name, False, f"the driver node failed: {type(exc).__name__}: {exc}"))

"""One-shot GPU acceptance of libvgpu-control.so: on a real NVIDIA GPU (as root, on a machine lent for
it) or, with --fake, on the fake driver + NVML of csrc/fakecuda and csrc/fakenvml (short phases; what
a fake cannot do is a skipped check with its reason). Writes one JSON report (--out, else
$OUT/gpu-acceptance.json, else stdout); exits 1 when a check fails. README.md here lists the fields.

Each phase runs in its own process with LD_PRELOAD of the library, device 0 = the GPU's UUID
(MANAGER_VISIBLE_DEVICE_0, CUDA_VISIBLE_DEVICES), MANAGER_COMPATIBILITY_MODE=0 (every process on the
GPU counts: the machine must be otherwise idle) and the partition directories in a temporary directory.

Phase `driver` (first) checks what vgpud hands a container of the GPU itself: its CDI edits against
nvidia-ctk's, and a process in new mount and PID namespaces given only those edits of one GPU
(bench/gpu/driver.py).

    python3 bench/gpu/acceptance.py [--fake] [--out FILE]
        [--phases driver,memory,clients,torch,core,overhead,mig]

Phase `clients` runs NVIDIA's cuda-bindings and numba-cuda under the library (bench/gpu/clients.py);
phase `mig` reads what vgpud makes of MIG mode (bench/gpu/mig.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu import clients, cuda, driver, mig, verdict
from bench.gpu.target import BUILD, LIBRARY, Target, build_library, driver_facts

MIB = 1 << 20
LIMIT = 4096 * MIB
CHUNK = 512 * MIB
TWO_PROC_BYTES = 3072 * MIB
TORCH_CHUNK = 256 * MIB
DOORS = ("cuMemAlloc_v2", "cuGetProcAddress_v2", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemCreate")
TORCH_CONFS = ("", "expandable_segments:True", "backend:cudaMallocAsync")
CORE_LIMITS = (30, 60)
PHASES = ("driver", "memory", "clients", "torch", "core", "overhead", "mig")
SAMPLE_S = 0.1
PHASE_TIMEOUT_S = 180
#: the whole run must finish within this (the GPU machine is lent for minutes)
BUDGET_S = 480


@dataclass(frozen=True)
class Settings:
    """Durations and counts: the real run's, or the short ones of --fake."""

    core_seconds: float
    launches: int
    allocs: int
    spin_ms: float = 1.0

    @classmethod
    def of(cls, fake: bool, core_seconds: float | None = None) -> Settings:
        base = cls(3.0, 20_000, 1000) if fake else cls(20.0, 100_000, 1000)
        return base if core_seconds is None else cls(core_seconds, base.launches, base.allocs)

    @property
    def warmup_seconds(self) -> float:
        """Utilization samples before this are dropped (NVML's figure covers the last period)."""
        return min(2.0, self.core_seconds / 3)


@dataclass
class Run:
    """One acceptance run: where, how long, what it found."""

    target: Target
    settings: Settings
    library: Path
    uuid: str = ""
    facts: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    nvml: cuda.Nvml | None = None
    handle: cuda.c_void_p | None = None
    driver_settings: driver.DriverSettings = field(default_factory=driver.DriverSettings)
    clients_python: str | None = None

    def env(self, preload: bool = True, **extra: str) -> dict[str, str]:
        env = self.target.env(
            self.uuid, self.library if preload else None, CUDA_MEM_LIMIT_0=f"{LIMIT // MIB}m"
        )
        if not preload:
            env.pop("CUDA_MEM_LIMIT_0", None)
        env.update(extra)
        return env

    def phase(self, args: list[str], env: dict[str, str]) -> dict:
        """Run one probe phase to completion; its JSON, or {"phase_error": ...}."""
        cmd = [sys.executable, "-m", "bench.gpu.probe", *args]
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=PHASE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return {"phase_error": f"{' '.join(args)}: timed out after {PHASE_TIMEOUT_S} s"}
        return parse(proc.returncode, proc.stdout, proc.stderr, args)

    def add(self, check: dict) -> None:
        self.checks.append(check)
        print(f"{check['status']:4}  {check['name']}: {check['detail']}", file=sys.stderr, flush=True)


def parse(rc: int, stdout: str, stderr: str, args: list[str]) -> dict:
    """A probe's last stdout line as JSON; a phase_error with its stderr when it failed."""
    lines = stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if rc != 0 or not result or "exception" in result:
        why = result.get("exception") or f"exit {rc}"
        return {"phase_error": f"{' '.join(args)}: {why}; stderr: {stderr.strip()[-800:]}"}
    return result


def failed(result: dict) -> bool:
    """Whether the phase itself failed (its process crashed, timed out or reported an exception)."""
    return "phase_error" in result


def discover(run: Run) -> None:
    """GPU 0's UUID and facts through NVML, the libraries found, the driver's version and module flavour."""
    if run.target.fake:
        nvml = cuda.Nvml(str(BUILD / "fakenvml" / "libnvidia-ml.so.1"))
        driver = cuda.Driver(str(BUILD / "fakecuda" / "libcuda.so.1"))
        run.facts.update(nvrm="fake", module_license="", module_flavour="fake")
    else:
        nvml, driver = cuda.Nvml(), cuda.Driver()
        run.facts.update(driver_facts())
    handle = nvml.handle(0)
    run.uuid = nvml.text("nvmlDeviceGetUUID", handle)
    version = cuda.c_int()
    driver.call("cuDriverGetVersion", cuda.byref(version))
    run.facts.update(
        uuid=run.uuid,
        name=nvml.text("nvmlDeviceGetName", handle),
        driver_version=nvml.text("nvmlSystemGetDriverVersion"),
        cuda_driver_version=version.value,
        memory_total=nvml.memory(handle).total,
        libcuda=cuda.loaded("libcuda.so") or "?",
        libnvidia_ml=cuda.loaded("libnvidia-ml.so") or "?",
        library=str(run.library),
    )
    run.nvml, run.handle = nvml, handle


def memory(run: Run) -> None:
    """Every door against CUDA_MEM_LIMIT_0=4096m, and two processes of 3 GiB each."""
    info = run.phase(["info", run.uuid], run.env())
    if failed(info):
        run.add(verdict.record("memory_views", False, info["phase_error"]))
    else:
        run.facts.update(sms=info["sms"], clock_khz=info["clock_khz"])
        run.add(verdict.totals(info, LIMIT))
    cap = str(LIMIT // CHUNK + 2)
    for door in DOORS:
        result = run.phase(["alloc", door, str(CHUNK), cap], run.env())
        name = f"alloc_{door}"
        run.add(
            verdict.record(name, False, result["phase_error"])
            if failed(result)
            else verdict.door(result, LIMIT)
        )
    run.add(two_processes(run))


def two_processes(run: Run) -> dict:
    """A process holding 3 GiB, then a second process's 3 GiB (the container would pass 4 GiB)."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "bench.gpu.probe", "hold", str(TWO_PROC_BYTES)],
        env=run.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        ready, _, _ = select.select([holder.stdout], [], [], PHASE_TIMEOUT_S)
        line = holder.stdout.readline() if ready else ""
        first = parse(0, line, "", ["hold"]) if line else {"phase_error": "hold: no result"}
        if failed(first):
            return verdict.record("two_processes", False, first["phase_error"])
        second = run.phase(["once", str(TWO_PROC_BYTES)], run.env())
        if failed(second):
            return verdict.record("two_processes", False, second["phase_error"])
        return verdict.two_processes(first, second, TWO_PROC_BYTES)
    finally:
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


def torch_checks(run: Run) -> None:
    """PyTorch over the library, default allocator, expandable segments and cudaMallocAsync."""
    names = [f"torch[{conf or 'default'}]" for conf in TORCH_CONFS]
    if importlib.util.find_spec("torch") is None:
        for name in names:
            run.add(verdict.skip(name, f"PyTorch is not importable by {sys.executable}"))
        return
    if run.target.fake:
        for name in names:
            run.add(
                verdict.skip(
                    name, "the fake driver serves no CUDA runtime export tables (csrc/fakecuda/README.md)"
                )
            )
        return
    cap = str(LIMIT // TORCH_CHUNK + 4)
    for conf in TORCH_CONFS:  # (no zip(strict=): the GPU machine's python3 may be older than 3.10)
        name = f"torch[{conf or 'default'}]"
        env = run.env(**({"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}))
        result = run.phase(["torch", str(TORCH_CHUNK), cap], env)
        if "unavailable" in result:
            run.add(verdict.skip(name, result["unavailable"]))
            continue
        run.add(
            verdict.record(name, False, result["phase_error"])
            if failed(result)
            else verdict.torch_run(conf, result, LIMIT)
        )


def sampled(run: Run, args: list[str], env: dict[str, str]) -> tuple[dict, list[float]]:
    """A phase while this process samples nvmlDeviceGetUtilizationRates every 100 ms; the samples
    after the warm-up (NVML's figure covers the last second)."""
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    nvml, handle = run.nvml, run.handle
    assert nvml is not None and handle is not None

    def sample() -> None:
        start = time.monotonic()
        while not done.wait(SAMPLE_S):
            samples.append((time.monotonic() - start, float(nvml.utilization(handle))))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = run.phase(args, env)
    finally:
        done.set()
        thread.join()
    return result, [u for t, u in samples if run.settings.warmup_seconds <= t <= run.settings.core_seconds]


def core(run: Run) -> None:
    """The spin kernel for core_seconds unlimited, then at each CUDA_CORE_LIMIT_0. A run that cannot
    be measured fails its check and those after it (they compare with the unlimited run)."""
    s = run.settings
    args = ["spin", str(s.core_seconds), str(s.spin_ms)]
    names = ["core_unlimited", *(f"core_{limit}" for limit in CORE_LIMITS)]
    runs: dict[str, dict] = {}
    for limit in (None, *CORE_LIMITS):
        name = f"core_{limit or 'unlimited'}"
        env = run.env(**({"CUDA_CORE_LIMIT_0": str(limit)} if limit else {}))
        result, samples = sampled(run, args, env)
        load = result.get("module_load", -1)
        if limit is None:
            if run.target.fake:
                run.add(verdict.skip("ptx_jit", "the fake's cuModuleLoadData accepts any image (no PTX JIT)"))
            elif not failed(result):
                run.add(verdict.ptx_jit(load))
        why = (
            result["phase_error"] if failed(result) else (f"cuModuleLoadData returned {load}" if load else "")
        )
        if why:
            for rest in names[names.index(name) :]:
                run.add(verdict.record(rest, False, f"not measured: {why}"))
            break
        result["utilization"] = verdict.summary(samples)
        runs[name] = result
        if limit is None:
            run.add(verdict.core_unlimited(result))
        else:
            run.add(verdict.core_limited(limit, result, runs["core_unlimited"]))
    run.figures["core"] = runs


def overhead(run: Run) -> None:
    """Empty launches and 1 MiB alloc/free, with the library (memory limit set) and without it."""
    s = run.settings
    args = ["overhead", str(s.launches), str(s.allocs)]
    # on the fake, kernels take no simulated time here: the figures are the calls' own cost
    quick = {"FAKE_GPU_NS_PER_BLOCK": "0"} if run.target.fake else {}
    with_lib = run.phase(args, run.env(**quick))
    without = run.phase(args, run.env(preload=False, **quick))
    for result in (with_lib, without):
        if failed(result):
            run.add(verdict.record("overhead", False, result["phase_error"]))
            return
    check = verdict.overhead(with_lib, without)
    run.figures["overhead"] = {k: v for k, v in check.items() if k not in ("name", "status", "detail")}
    run.add(check)


def registration(pids: Path) -> dict:
    """Client mode: the library ran the register client in each phase process (its PIDs in pids.config)."""
    count = len(pids.read_text().split()) if pids.exists() else 0
    return verdict.record("registration", count > 0, f"{count} PIDs registered in pids.config", pids=count)


def driver_checks(run: Run) -> None:
    """vgpud's edits against nvidia-ctk's, and a container given one GPU's edits (bench/gpu/driver.py)."""
    driver.phase(run, run.driver_settings, limit=LIMIT, chunk=CHUNK)


STEPS = {
    "driver": driver_checks,
    "memory": memory,
    "clients": lambda run: clients.phase(run, run.clients_python),
    "torch": torch_checks,
    "core": core,
    "overhead": overhead,
    "mig": mig.phase,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fake", action="store_true", help="the fake driver + NVML of build/, short phases")
    parser.add_argument("--out", type=Path, help="the JSON report (default $OUT/gpu-acceptance.json)")
    parser.add_argument("--library", type=Path, default=LIBRARY, help="the LD_PRELOAD library under test")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma list of " + ",".join(PHASES))
    parser.add_argument(
        "--mode",
        type=int,
        choices=(0, 236),
        default=0,
        help="MANAGER_COMPATIBILITY_MODE: 0 all processes, 236 client mode with a stub register client",
    )
    parser.add_argument(
        "--clients-python",
        help="a Python with cuda-bindings and numba-cuda for phase clients (default: the cuda-clients "
        "venv of hack/install-cuda-clients.sh, else this one)",
    )
    parser.add_argument("--core-seconds", type=float, help="each core run's length (default 20, --fake 3)")
    parser.add_argument("--no-build", action="store_true", help="use the library as built")
    ctk, hook = driver.default_tools()
    parser.add_argument(
        "--nvidia-ctk",
        type=Path,
        default=ctk,
        help=f"nvidia-ctk for phase driver (default: <cache>/nvidia-ctk.env's, else {driver.BUILD_CTK_DIR}/)",
    )
    parser.add_argument(
        "--nvidia-cdi-hook", type=Path, default=hook, help="nvidia-cdi-hook for phase driver (found as above)"
    )
    parser.add_argument("--driver-root", type=Path, default=Path("/"), help="phase driver's driver root")
    parser.add_argument("--dev-root", type=Path, help="phase driver's dev root (default: the driver root)")
    parser.add_argument("--vgpud-python", help="the Python running vgpud (default: .venv's, else this one)")
    parser.add_argument(
        "--container-fault",
        choices=driver.FAULTS,
        help="self-test: give the container another GPU's node, or no memory limit (its check must fail)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phases {unknown}; known: {', '.join(PHASES)}")
    out = args.out or (Path(os.environ["OUT"]) / "gpu-acceptance.json" if os.environ.get("OUT") else None)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vgpu-acceptance-") as work:
        run = Run(
            Target.create(args.fake, Path(work), args.mode),
            Settings.of(args.fake, args.core_seconds),
            args.library.resolve(),
            driver_settings=driver.DriverSettings(
                nvidia_ctk=args.nvidia_ctk,
                nvidia_cdi_hook=args.nvidia_cdi_hook,
                driver_root=args.driver_root,
                dev_root=args.dev_root,
                vgpud_python=args.vgpud_python,
                fault=args.container_fault,
            ),
            clients_python=args.clients_python,
        )
        run.target.adopt()
        if args.no_build:
            run.add(verdict.skip("build", "--no-build"))
        else:
            built = build_library()
            run.add(verdict.record("build", built["rc"] == 0, f"make exit {built['rc']}", **built))
        if not run.library.is_file():
            run.add(verdict.record("library", False, f"{run.library} does not exist"))
        else:
            try:
                discover(run)
            except (OSError, RuntimeError) as exc:  # no driver / NVML to load, or NVML refused
                run.add(verdict.record("discover", False, f"{type(exc).__name__}: {exc}"))
            else:
                for name in phases:
                    STEPS[name](run)
            if args.mode == 236:
                run.add(registration(run.target.work / "pids.config"))
        elapsed = time.monotonic() - started
        run.add(verdict.record("duration", elapsed < BUDGET_S, f"{elapsed:.1f} s (budget {BUDGET_S} s)"))
    report = {
        "mode": "fake" if args.fake else "gpu",
        "compatibility_mode": args.mode,
        "ok": all(c["status"] != "fail" for c in run.checks),
        "duration_s": round(time.monotonic() - started, 1),
        "phases": phases,
        "limits": {
            "memory_bytes": LIMIT,
            "core_percent": list(CORE_LIMITS),
            "tolerance": verdict.CORE_TOLERANCE,
        },
        "settings": {**run.settings.__dict__, "warmup_seconds": run.settings.warmup_seconds},
        "environment": run.facts,
        "checks": run.checks,
        "figures": run.figures,
    }
    text = json.dumps(report, indent=2)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"report: {out}", file=sys.stderr)
    else:
        print(text)
    print(f"{'PASS' if report['ok'] else 'FAIL'} in {report['duration_s']} s", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

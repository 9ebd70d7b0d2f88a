"""Build and run the Go NRI conformance harness (see README.md here); shared by the pytest module
tests/conformance/test_nri_go.py and bench/nri_latency.py. Also builds the Go plugins of the node e2e
(tests/e2e/sideplugin.py, tests/e2e/ulimit_adjuster.py): ours and containerd/nri's own sample.

Builds are cached under `${VGPUD_CACHE:-~/.cache/vgpud}/nri-harness/<what>-<variant>-<hash>/`, keyed by
a hash of the binary's Go sources and module files plus `go version`, so an edit rebuilds and nothing
else does. Go's own caches (GOMODCACHE, GOCACHE) stay where `go env` says; a cold build downloads the
modules through the Go module proxy.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PLUGIN_UNDER_TEST = HERE / "plugin_under_test.py"
#: the oldest Go that builds the newest NRI (its go.mod says go 1.24.0)
MIN_GO = (1, 24)


@dataclass(frozen=True)
class Variant:
    name: str
    #: an alternative go.mod (go build -modfile); None = go.mod
    modfile: str | None
    tags: tuple[str, ...]


#: the NRI versions the harness is built at. nri_no_wasm: the runtime's WASM plugin support is not
#: exercised here and wazero doubles the build time.
VARIANTS = {
    "v0.12": Variant("v0.12", None, ("nri_no_wasm",)),
    "v0.6.1": Variant("v0.6.1", "nri061.mod", ("nri061",)),
}


#: containerd/nri's own sample plugins built here: name -> Go package. They come from the module in
#: samples/, which requires nri v0.4.0: the newest release whose root module holds a sample plugin
#: (README.md here says why)
SAMPLES = {"ulimit-adjuster": "github.com/containerd/nri/plugins/ulimit-adjuster"}
SAMPLES_DIR = HERE / "samples"


class BuildError(RuntimeError):
    pass


def go_version() -> tuple[int, int] | None:
    """(major, minor) of the `go` on PATH, or None when there is none."""
    go = shutil.which("go")
    if go is None:
        return None
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    match = re.match(r"go(\d+)\.(\d+)", out.strip())
    return (int(match[1]), int(match[2])) if match else None


def go_usable() -> bool:
    version = go_version()
    return version is not None and version >= MIN_GO


def cache_root() -> Path:
    base = os.environ.get("VGPUD_CACHE") or str(Path.home() / ".cache" / "vgpud")
    return Path(base) / "nri-harness"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # never fetch a toolchain, never let a go.work elsewhere or a user GOFLAGS change what is built
    env.update(GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="")
    return env


def _key(label: str, files: list[Path]) -> str:
    """A hash of what a build depends on: `label`, `go version` and these files (names and contents)."""
    digest = hashlib.sha256()
    digest.update(label.encode())
    digest.update(subprocess.run(["go", "version"], capture_output=True, check=False).stdout)
    for path in files:
        digest.update(str(path.relative_to(HERE)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def build(what: str, variant: str = "v0.12", *, log: TextIO | None = None) -> Path:
    """The binary `what` at `variant`, built unless cached. Returns its path.

    `what`: "harness", "goplugin" (the contract's Go stand-in) or "sideplugin" (a second plugin for
    the node e2e, tests/e2e/sideplugin.py); the two plugins are built at the newest NRI only."""
    if what not in {"harness", "goplugin", "sideplugin"}:
        raise ValueError(what)
    var = VARIANTS[variant]
    if what != "harness" and var.modfile is not None:
        raise ValueError(f"the Go {what} is built at the newest NRI only")
    files = sorted((HERE / what).glob("*.go"))
    files += [HERE / name for name in ("go.mod", "go.sum", "nri061.mod", "nri061.sum")]
    flags = ["-tags", ",".join(var.tags)]
    if var.modfile:
        flags += ["-modfile", var.modfile]
    key = _key(f"{what}\0{var}\0", files)
    return _build(what, var.name, key, module=HERE, flags=flags, package=f"./{what}", log=log)


def build_sample(name: str, *, log: TextIO | None = None) -> Path:
    """containerd/nri's own sample plugin `name` (a key of SAMPLES) at the NRI release samples/go.mod
    requires, built from the Go modules unless cached. Returns its path."""
    if name not in SAMPLES:
        raise ValueError(f"{name!r}: not one of the NRI samples built here ({', '.join(SAMPLES)})")
    key = _key(f"{name}\0{SAMPLES[name]}\0", [SAMPLES_DIR / "go.mod", SAMPLES_DIR / "go.sum"])
    return _build(name, "sample", key, module=SAMPLES_DIR, flags=[], package=SAMPLES[name], log=log)


def _build(
    what: str, label: str, key: str, *, module: Path, flags: list[str], package: str, log: TextIO | None
) -> Path:
    """`go build` of `package` in the module at `module` into `<what>-<label>-<key>/` in the cache,
    unless there."""
    root = cache_root()
    out_dir = root / f"{what}-{label}-{key}"
    binary = out_dir / what
    if binary.exists():
        return binary
    with _locked(root / ".lock"):
        if binary.exists():
            return binary
        tmp = root / f".{what}-{label}-{key}.{os.getpid()}"
        cmd = ["go", "build", "-buildvcs=false", "-mod=readonly", *flags, "-o", str(tmp), package]
        began = time.monotonic()
        if log:
            print(f"building the NRI {what} ({label}): {' '.join(cmd)}", file=log, flush=True)
        proc = subprocess.run(
            cmd, cwd=module, env=_go_env(), capture_output=True, text=True, timeout=1800, check=False
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(
                f"`{' '.join(cmd)}` in {module} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, binary)
        if log:
            print(f"built {binary} in {time.monotonic() - began:.1f} s", file=log, flush=True)
        for old in root.glob(f"{what}-{label}-*"):
            if old != out_dir:
                shutil.rmtree(old, ignore_errors=True)
    return binary


def plugin_under_test_cmd() -> list[str]:
    """The command line of the plugin under test: vgpud's NRI plugin, in this interpreter."""
    return [sys.executable, str(PLUGIN_UNDER_TEST)]


@dataclass
class RunResult:
    returncode: int
    stdout: list[str]
    stderr: list[str]
    timed_out: bool

    def verdict_lines(self) -> list[str]:
        """The `go test` lines (=== RUN, t.Log/t.Error output, --- PASS/FAIL), without the log streams."""
        return [line for line in self.stdout if not re.match(r"^\S+ \[(nri|plugin|harness)\] ", line)]

    def failed_tests(self) -> list[str]:
        return re.findall(r"^\s*--- FAIL: (\S+)", "\n".join(self.stdout), re.M)


def run(
    binary: Path,
    args: list[str],
    *,
    plugin_cmd: list[str],
    goplugin_cmd: list[str] | None = None,
    timeout: float,
    echo_stdout: TextIO | None = None,
    echo_stderr: TextIO | None = None,
) -> RunResult:
    """Run the harness; stream its stdout/stderr line by line to the echo files as they come.

    The harness runs in its own session and starts the plugin processes itself; on timeout the whole
    process group (the harness's PID) is killed.
    """
    env = dict(os.environ, VGPUD_NRI_PLUGIN_CMD=json.dumps(plugin_cmd))
    if goplugin_cmd is not None:
        env["VGPUD_NRI_GOPLUGIN_CMD"] = json.dumps(goplugin_cmd)
    proc = subprocess.Popen(
        [str(binary), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    out: list[str] = []
    err: list[str] = []

    def pump(stream: TextIO, sink: list[str], echo: TextIO | None) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))
            if echo is not None:
                echo.write(line)
                echo.flush()

    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, out, echo_stdout), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err, echo_stderr), daemon=True),
    ]
    for t in pumps:
        t.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for t in pumps:
        t.join(timeout=10)
    return RunResult(proc.returncode, out, err, timed_out)

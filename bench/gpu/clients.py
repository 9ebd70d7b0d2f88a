"""Phase `clients`: NVIDIA's own driver-API clients, cuda-bindings and numba-cuda, over the library,
by the probes of the conformance tests (tests/conformance/cudaclients, sized for a 1 GiB limit) run
with CUDA_MEM_LIMIT_0=1024m and the library, and without the library as the control. They need a
Python with those packages: --clients-python, else hack/install-cuda-clients.sh's venv
(`<cache>/cuda-clients.env`), else this one; a client it cannot import is a skipped check."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

from bench.gpu import verdict
from bench.gpu.driver import cache_dir
from bench.gpu.target import REPO

if TYPE_CHECKING:
    from bench.gpu.acceptance import Run

PROBES = REPO / "tests" / "conformance" / "cudaclients"
LIMIT = 1024 << 20
TIMEOUT_S = 180
#: name, module to import, probe, its arguments (numba: no launch loop, the kernel compiled and launched
#: once), the fills it prints, its memory view line
CLIENTS = (
    (
        "clients[cuda-bindings]",
        "cuda.bindings.driver",
        "bindings_probe.py",
        (),
        ("fill", "async_fill", "pool_fill"),
        "",
    ),
    ("clients[numba-cuda]", "numba.cuda", "numba_probe.py", ("0", "64"), ("fill",), "info"),
)


def clients_python(explicit: str | None) -> str:
    """--clients-python, else the cuda-clients venv's python, else this interpreter."""
    if explicit:
        return explicit
    try:
        text = (cache_dir() / "cuda-clients.env").read_text()
    except OSError:
        return sys.executable
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return pairs.get("CUDA_CLIENTS_PYTHON", "").strip() or sys.executable


def missing(python: str, module: str) -> str:
    """Why `python` cannot import `module` ("" when it can)."""
    try:
        done = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=120, check=False
        )
    except OSError as exc:
        return f"{python}: {exc}"
    if done.returncode == 0:
        return ""
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"{python} cannot import {module} ({last}); hack/install-cuda-clients.sh installs it"


def probe(python: str, script: str, args: tuple[str, ...], env: dict[str, str]) -> dict:
    """A probe's `key value...` lines (those it printed before any failure), exit status, stderr."""
    try:
        done = subprocess.run(
            [python, str(PROBES / script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"lines": {}, "rc": "timeout", "stderr": f"timed out after {TIMEOUT_S} s"}
    lines = {k: rest for k, *rest in (line.split() for line in done.stdout.splitlines() if line.strip())}
    return {"lines": lines, "rc": done.returncode, "stderr": done.stderr.strip()[-800:]}


def phase(run: Run, explicit_python: str | None) -> None:
    python = clients_python(explicit_python)
    for name, module, script, args, fills, view in CLIENTS:
        why = missing(python, module)
        if why:
            run.add(verdict.skip(name, why))
            continue
        limited = probe(python, script, args, run.env(CUDA_MEM_LIMIT_0=f"{LIMIT >> 20}m"))
        unlimited = probe(python, script, args, run.env(preload=False))
        run.add(verdict.client(name, fills, limited, unlimited, LIMIT))
        if view:
            run.add(verdict.client_view(f"{name}.view", view, limited, unlimited, LIMIT))
        run.figures.setdefault("clients", {})[name] = {
            "python": python,
            "limited": limited,
            "unlimited": unlimited,
        }

"""Phase `mig`: what vgpud makes of the machine's MIG mode, read-only (`vgpud gpus --json` through
the NVML library the script loaded: no MIG setting is changed). Each GPU in MIG mode must list its
MIG devices and be left out of what vgpud publishes; with MIG off everywhere the check is skipped.
With --fake, the fake NVML serves a two-A100 profile with one GPU in MIG mode
(vgpud/gpu/profiles/a100-40gb-x2-mig.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bench.gpu import verdict
from bench.gpu.driver import run_json, vgpud_python
from bench.gpu.target import REPO

if TYPE_CHECKING:
    from bench.gpu.acceptance import Run

FAKE_MIG_PROFILE = REPO / "vgpud" / "gpu" / "profiles" / "a100-40gb-x2-mig.yaml"


def phase(run: Run) -> None:
    # the NVML this script talks to (the dynamic loader's, or the fake's)
    nvml = run.facts.get("libnvidia_ml", "?")
    argv = [vgpud_python(run.driver_settings), "-m", "vgpud", "gpus", "--json"]
    argv += (
        ["--nvml-library", nvml]
        if Path(nvml).is_file()
        else ["--driver-root", str(run.driver_settings.driver_root)]
    )
    env = run.env(preload=False)  # FAKE_* pass, as to every phase
    if run.target.fake:
        env.update(FAKE_NVML_PROFILE=str(FAKE_MIG_PROFILE), FAKE_GPU_STATE=str(run.target.work / "mig.state"))
    try:
        gpus = run_json(argv, env, "vgpud gpus --json")
    except (OSError, RuntimeError) as exc:
        run.add(verdict.record("mig", False, f"vgpud gpus --json: {exc}"))
        return
    for check in verdict.mig(gpus):
        run.add(check)

"""The acceptance rules, as pure functions of the phases' results: each returns one check record
{"name", "status": pass|fail|skip, "detail", ...figures} for the JSON report."""

from __future__ import annotations

import statistics
from typing import Any

OOM = 2
#: a limited run's throughput ratio and mean utilization may miss the target by this much (±)
CORE_TOLERANCE = 0.15
#: below the limit, an allocation loop may stop this early (the context and 512 MiB granularity)
ALLOC_SLACK = 1536 << 20
#: an unlimited spin run must keep the GPU at least this busy (mean NVML utilization, %)
UNLIMITED_MIN_UTIL = 80.0


def record(name: str, ok: bool, detail: str, **figures: Any) -> dict[str, Any]:
    return {"name": name, "status": "pass" if ok else "fail", "detail": detail, **figures}


def skip(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "skip", "detail": reason}


def hooked(owner: str) -> bool:
    return owner.endswith("libvgpu-control.so")


def totals(info: dict, limit: int) -> dict[str, Any]:
    """Every memory view reports the limit as the device's total, through the library's hooks."""
    seen = {
        "cuMemGetInfo_v2": info["cuMemGetInfo_v2"]["total"],
        "cuDeviceTotalMem_v2": info["cuDeviceTotalMem_v2"],
        "nvmlDeviceGetMemoryInfo": info["nvmlDeviceGetMemoryInfo"]["total"],
    }
    wrong = {k: v for k, v in seen.items() if v != limit}
    strays = {k: v for k, v in info["owners"].items() if not hooked(v)}
    if not hooked(info["nvml_owner"]):
        strays["nvmlDeviceGetMemoryInfo"] = info["nvml_owner"]
    ok = not wrong and not strays
    detail = "all views report the limit" if ok else f"not the limit: {wrong}; not hooked: {strays}"
    return record("memory_views", ok, detail, limit=limit, totals=seen)


def door(result: dict, limit: int) -> dict[str, Any]:
    """Allocating through one door stops with CUDA_ERROR_OUT_OF_MEMORY, at most `limit` bytes in,
    and not far below it; the door is the library's."""
    name = f"alloc_{result['door']}"
    problems = []
    if result["error"] != OOM:
        problems.append(f"stopped with {result['error']}, not {OOM}")
    if result["total"] > limit:
        problems.append(f"allocated {result['total']} > limit {limit}")
    if result["total"] + ALLOC_SLACK < limit:
        problems.append(f"allocated {result['total']}, more than {ALLOC_SLACK} below the limit")
    if not hooked(result["owner"]):
        problems.append(f"entry point owned by {result['owner']}")
    return record(name, not problems, "; ".join(problems) or "OOM (2) at the limit", **result)


def two_processes(first: dict, second: dict, size: int) -> dict[str, Any]:
    """A second process's allocation that would take the container past the limit fails."""
    ok = first["error"] == 0 and second["error"] == OOM
    detail = f"first {size} B: {first['error']}, second {size} B: {second['error']} (want 0 then {OOM})"
    return record("two_processes", ok, detail, first=first["error"], second=second["error"], bytes=size)


def torch_run(conf: str, result: dict, limit: int) -> dict[str, Any]:
    """PyTorch sees the limit as total memory and runs into OutOfMemoryError at or below it."""
    name = f"torch[{conf or 'default'}]"
    total = result["mem_get_info"]["total"]
    problems = []
    if total != limit:
        problems.append(f"mem_get_info total {total} != limit {limit}")
    if result["stopped_by"] != "OutOfMemoryError":
        problems.append(f"stopped by {result['stopped_by']}, not OutOfMemoryError")
    if result["total"] > limit:
        problems.append(f"allocated {result['total']} > limit {limit}")
    return record(name, not problems, "; ".join(problems) or "OutOfMemoryError at the limit", **result)


def summary(samples: list[float]) -> dict[str, float]:
    """Mean and p95 (nearest rank) of utilization samples; zeros when there are none."""
    if not samples:
        return {"mean": 0.0, "p95": 0.0, "n": 0}
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))]
    return {"mean": statistics.fmean(samples), "p95": float(p95), "n": len(samples)}


def core_unlimited(run: dict) -> dict[str, Any]:
    util = run["utilization"]
    ok = run["launches"] > 0 and util["mean"] >= UNLIMITED_MIN_UTIL
    detail = (
        f"{run['rate']:.1f} launches/s, utilization mean {util['mean']:.1f} % (want >= {UNLIMITED_MIN_UTIL})"
    )
    return record("core_unlimited", ok, detail, **run)


def core_limited(limit: int, run: dict, unlimited: dict) -> dict[str, Any]:
    """Throughput under CUDA_CORE_LIMIT_0=limit over the unlimited run's, and mean utilization, both
    within CORE_TOLERANCE of limit/100."""
    target = limit / 100
    ratio = run["rate"] / unlimited["rate"] if unlimited["rate"] else 0.0
    util = run["utilization"]["mean"] / 100
    problems = []
    if abs(ratio - target) > CORE_TOLERANCE:
        problems.append(f"throughput ratio {ratio:.3f} not within {CORE_TOLERANCE} of {target}")
    if abs(util - target) > CORE_TOLERANCE:
        problems.append(f"utilization mean {util:.3f} not within {CORE_TOLERANCE} of {target}")
    detail = "; ".join(problems) or f"ratio {ratio:.3f}, utilization {util:.3f} (target {target})"
    return record(f"core_{limit}", not problems, detail, ratio=ratio, target=target, **run)


def ptx_jit(load_code: int) -> dict[str, Any]:
    return record("ptx_jit", load_code == 0, f"cuModuleLoadData of the spin PTX returned {load_code}")


def overhead(hooked_run: dict, plain_run: dict) -> dict[str, Any]:
    """The library's cost per call (figures only: the machine's load moves them); the check is that
    the hooked run went through the library and the plain one did not."""
    ok = hooked(hooked_run["launch_owner"]) and not hooked(plain_run["launch_owner"])
    figures = {
        "launch_ns": {"with": hooked_run["launch_ns"], "without": plain_run["launch_ns"]},
        "alloc_free_ns": {"with": hooked_run["alloc_free_ns"], "without": plain_run["alloc_free_ns"]},
        "added_ns": {
            "launch": hooked_run["launch_ns"] - plain_run["launch_ns"],
            "alloc_free": hooked_run["alloc_free_ns"] - plain_run["alloc_free_ns"],
        },
        "launches": hooked_run["launches"],
        "allocs": hooked_run["allocs"],
    }
    owners = f"launch owners: with {hooked_run['launch_owner']}, without {plain_run['launch_owner']}"
    return record("overhead", ok, owners, **figures)


def driver_edits(figures: dict) -> dict[str, Any]:
    """vgpud's GPU edits differ from the toolkit's spec only where ALLOWED_DIFFERENCES says so."""
    unexpected = [d for d in figures["differences"] if not d["allowed"]]
    allowed = sorted({d["allowed"] for d in figures["differences"] if d["allowed"]})
    if unexpected:
        shown = "; ".join(
            f"{d['scope']} {d['kind']} {d['key']} "
            + (f"(only in {d['only_in']})" if d.get("only_in") else "(changed)")
            for d in unexpected[:8]
        )
        detail = f"{len(unexpected)} difference(s) vgpud does not document: {shown}"
    else:
        rules = ", ".join(allowed) or "none"
        detail = f"as nvidia-ctk's but for {figures['allowed']} allowed difference(s): {rules}"
    return record("driver_edits", not unexpected, detail, **figures)


def container(figures: dict) -> dict[str, Any]:
    """The container given one GPU sees that GPU alone, by its UUID, the limit as its memory, is
    refused at the limit through the library, and runs on the driver root's libcuda."""
    seen, gpu, limit, lib = figures["sees"], figures["gpu"], figures["limit"], figures["libcuda"]
    problems = []
    context = seen.get("device_rc")
    if figures["rc"] != 0 and not (figures["rc"] == 3 and context not in (None, 0)):  # 3: no context
        problems.append(f"the probe exited {figures['rc']}: {figures.get('stderr') or 'no stderr'}")
    if seen.get("pid") != 1:
        problems.append(f"the probe is pid {seen.get('pid')} there, not 1 (no PID namespace of its own)")
    for api in ("cuda", "nvml"):
        if seen.get(f"{api}_count") != 1:
            problems.append(f"{api} sees {seen.get(f'{api}_count')} GPUs, not 1")
        if seen.get(f"{api}_uuid") != gpu["uuid"]:
            problems.append(f"{api} sees {seen.get(f'{api}_uuid') or 'no GPU'} at 0, not {gpu['uuid']}")
    if context != 0:
        problems.append(f"no context on CUDA device 0 (CUresult {context}): memory not measured")
    else:
        if seen.get("meminfo_total") != limit:
            problems.append(f"cuMemGetInfo_v2 total {seen.get('meminfo_total')} != limit {limit}")
        total = seen.get("total", 0)
        if seen.get("error") != OOM:
            problems.append(f"allocation stopped with {seen.get('error')}, not {OOM}")
        if total > limit or total + ALLOC_SLACK < limit:
            problems.append(f"allocated {total}, not within {ALLOC_SLACK} below the limit {limit}")
        if not hooked(str(seen.get("alloc_owner", ""))):
            problems.append(f"cuMemAlloc_v2 is {seen.get('alloc_owner')}'s, not the library's")
    if (seen.get("libcuda_dev"), seen.get("libcuda_ino")) != (lib["dev"], lib["ino"]):
        problems.append(
            f"the libcuda.so.1 loaded there ({seen.get('libcuda_realpath') or seen.get('libcuda_path')}) "
            f"is not the driver root's {lib['host']}"
        )
    detail = "; ".join(problems) or (
        f"sees {gpu['uuid']} alone, {limit} bytes, OOM (2) after {seen.get('count')} allocations; "
        f"libcuda.so.1 -> {lib['host']}"
    )
    return record("container", not problems, detail, **figures)


#: the cuda-clients probes allocate 256 MiB steps, at most 8 (tests/conformance/cudaclients)
CLIENT_STEP = 256 << 20
CLIENT_MAX_STEPS = 8


def _fill(lines: dict[str, list[str]], key: str) -> tuple[int, int] | None:
    values = lines.get(key)
    return (int(values[0]), int(values[1])) if values and len(values) == 2 else None


def client(name: str, keys: tuple[str, ...], limited: dict, unlimited: dict, limit: int) -> dict[str, Any]:
    """One NVIDIA client (cuda-bindings, numba-cuda) run with the library and CUDA_MEM_LIMIT_0=`limit`
    and without it: each of its fills (`key count error` lines) stops with OOM at most `limit` in
    under the library, and takes every step without it (the control)."""
    problems = []
    for key in keys:
        held, plain = _fill(limited["lines"], key), _fill(unlimited["lines"], key)
        if held is None or plain is None:
            problems.append(f"{key}: no result (limited exit {limited['rc']}, plain exit {unlimited['rc']})")
            continue
        if held[1] != OOM or held[0] * CLIENT_STEP > limit:
            problems.append(
                f"{key} under the library: {held[0]} steps, error {held[1]} (want OOM within {limit})"
            )
        if plain != (CLIENT_MAX_STEPS, 0):
            problems.append(f"{key} without it: {plain[0]} steps, error {plain[1]} (want every step)")
    passed = f"{', '.join(keys)}: OOM (2) within the limit, unlimited without the library"
    detail = "; ".join(problems) or passed
    figures = {"limited": limited["lines"], "unlimited": unlimited["lines"]}
    return record(name, not problems, detail, **figures)


def client_view(name: str, key: str, limited: dict, unlimited: dict, limit: int) -> dict[str, Any]:
    """A client's `key free total` memory view is the limit under the library and more without it."""
    held, plain = limited["lines"].get(key), unlimited["lines"].get(key)
    if not held or not plain:
        return record(name, False, f"{key}: no result (exits {limited['rc']}, {unlimited['rc']})")
    total, plain_total = int(held[1]), int(plain[1])
    ok = total == limit and plain_total > limit
    return record(name, ok, f"total {total} under the library (limit {limit}), {plain_total} without it")


def mig(gpus: list[dict]) -> list[dict[str, Any]]:
    """Read-only MIG checks over `vgpud gpus --json`: every MIG-mode GPU lists its MIG devices
    (MIG- UUIDs, memory and SMs, within the GPU's memory) and is left out of what vgpud publishes;
    a skip when no GPU is in MIG mode."""
    in_mig = [g for g in gpus if g.get("mig_mode")]
    if not in_mig:
        return [skip("mig", f"MIG mode is off on all {len(gpus)} GPU(s) (this script never changes it)")]
    checks = []
    for g in in_mig:
        devices = g.get("mig_devices", [])
        bad = [
            d.get("uuid", "?")
            for d in devices
            if not str(d.get("uuid", "")).startswith("MIG-")
            or d.get("memory_total", 0) <= 0
            or d.get("multiprocessor_count", 0) <= 0
        ]
        memory = sum(d.get("memory_total", 0) for d in devices)
        problems = []
        if not devices:
            problems.append("no MIG device listed")
        if bad:
            problems.append(f"MIG devices without a MIG- UUID, memory or SMs: {bad}")
        if memory > g["memory_total"]:
            problems.append(f"MIG devices hold {memory} bytes > the GPU's {g['memory_total']}")
        excluded = g.get("excluded") or {}
        if excluded.get("reason") != "mig":
            problems.append(f"not left out of the ResourceSlice for MIG: {excluded or 'published'}")
        checks.append(
            record(
                f"mig[{g['uuid']}]",
                not problems,
                "; ".join(problems) or f"{len(devices)} MIG devices, left out of the ResourceSlice",
                mig_devices=devices,
                excluded=excluded,
            )
        )
    return checks

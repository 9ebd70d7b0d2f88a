"""What `vgpud top` draws: one node's GPUs and the vGPU containers on each, from a `/debug/state`
document. Pure (a dict in, lines out), so every layout is tested on plain dicts; the terminal and the
debug endpoint are `vgpud.observe.topterm`'s.

The GPU figures are the state's `gpus` section (`vgpud.observe.gpuview`): allocated is the sum of the
containers' limits, used the library's own count. Without the usage reader those are unknown, and the
view says so instead of showing zeros. Every line is cut to the width with an ellipsis; the numeric
columns keep their place, the product name (last on a GPU's line) and the container name give way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

MIB, GIB = 1 << 20, 1 << 30
ELLIPSIS = "…"
GAP = "  "
#: where a GPU's containers start: under its HEALTH column
INDENT = " " * 5
#: the container name's column: at least this wide, then whatever the width leaves
NAME_MIN, NAME_MAX = 16, 64
#: every vGPU GPU is NVIDIA's: the product column leaves the vendor out to keep the model readable
VENDOR = "NVIDIA "

GPU_TITLES = ("GPU", "HEALTH", "MEMORY", "ALLOCATED", "USED", "CORES", "SM", "PRODUCT")
#: the widths of every GPU column but the last (negative: left-aligned; HEALTH widens for UNHEALTHY)
GPU_WIDTHS = (3, -6, 8, 13, 13, 5, 4)
#: LIMIT, USED, CORES, SM of a container's line (after its name; PIDS last)
VGPU_WIDTHS = (9, 9, 5, 4)

JsonObject = Mapping[str, Any]


def fit(line: str, width: int) -> str:
    """`line` cut to `width` characters, the last one an ellipsis when it was longer."""
    return line if len(line) <= width else line[: width - 1] + ELLIPSIS


def size(n: int | None) -> str:
    """Bytes in MiB below 1 GiB, else in GiB with one decimal; "-" when unknown."""
    if n is None:
        return "-"
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if 0 < n < MIB:
        return "<1 MiB"
    return f"{n // MIB} MiB"


def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _share(n: int, total: int) -> str:
    return percent(n / total) if total > 0 else "-"


def _row(cells: Sequence[tuple[str, int]]) -> str:
    """Cells right-aligned to their widths (a negative width: left-aligned), joined by GAP."""
    return GAP.join(cell.rjust(w) if w >= 0 else cell.ljust(-w) for cell, w in cells).rstrip()


def header(state: JsonObject) -> str:
    """Node, vgpud version, mode, health, the NRI connection (lazy mode) and the reading's time."""
    parts = [state.get("node") or "?", f"vgpud {state.get('version', '?')}", f"{state.get('mode')} mode"]
    parts.append("healthy" if state.get("healthy") else "UNHEALTHY")
    nri = state.get("nri")
    if nri is not None:
        parts.append("NRI connected" if nri["session"]["connected"] else "NRI DISCONNECTED")
    if isinstance(state.get("time"), int | float):
        parts.append(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["time"])))
    return GAP.join(parts)


def notes(state: JsonObject) -> list[str]:
    """What the node says beside its GPUs: the components that make it unhealthy, a mode fallback, the
    usage reader's state."""
    lines = []
    failing = [
        f"{name} {c.get('state')}" + (f" ({c['reason']})" if c.get("reason") else "")
        for name, c in sorted((state.get("components") or {}).items())
        if c.get("counts_for_health") and c.get("state") != "healthy"
    ]
    if failing:
        lines.append(f"unhealthy components: {', '.join(failing)}")
    fallback = state.get("nri_fallback")
    if fallback:
        lines.append(f"eager mode because NRI did not answer at start: {fallback['reason']}")
    usage = state.get("usage")
    if usage is None:
        lines.append("usage reader off (--usage-interval 0): allocated, used, cores and SM unknown")
    elif usage.get("last_read") is None:
        lines.append("usage reader: no read yet, allocated and used unknown")
    elif usage.get("process_memory_error"):
        lines.append(f"usage reader: NVML's process memory unreadable: {usage['process_memory_error']}")
    return lines


def _health(gpu: JsonObject, devices: JsonObject) -> tuple[str, str]:
    """The HEALTH cell and the reason (when unhealthy and the watcher gave one)."""
    if gpu.get("healthy") is None:
        return "-", ""
    if gpu["healthy"]:
        return "ok", ""
    return "UNHEALTHY", (devices.get(gpu.get("uuid", "")) or {}).get("reason") or ""


def _product(name: str) -> str:
    return name[len(VENDOR) :] if name.startswith(VENDOR) else name


def _gpu_cells(gpu: JsonObject, health: str, known: bool) -> list[str]:
    total = gpu["memory_total_bytes"]
    if not known:
        allocated = used = cores = sm = "?"
    else:
        allocated = (
            f"{size(gpu['memory_allocated_bytes']):>8} {_share(gpu['memory_allocated_bytes'], total):>4}"
        )
        used = f"{size(gpu['memory_used_bytes']):>8} {_share(gpu['memory_used_bytes'], total):>4}"
        cores, sm = percent(gpu["cores_allocated_ratio"]), percent(gpu["sm_utilization_ratio"])
    return [
        str(gpu["index"]),
        health,
        size(total),
        allocated,
        used,
        cores,
        sm,
        _product(gpu.get("product", "")),
    ]


def _vgpu_name(vgpu: JsonObject) -> str:
    if vgpu.get("pod") or vgpu.get("container"):
        return f"{vgpu['namespace']}/{vgpu['pod']}/{vgpu['container']}"
    return f"{vgpu['namespace']}/{vgpu['partition']}"  # eager mode: a partition may serve several pods


def _vgpu_cells(vgpu: JsonObject) -> list[str]:
    limit = vgpu.get("memory_limit_bytes")
    core = vgpu.get("core_limit_ratio")
    pids = vgpu.get("pids") or []
    return [
        _vgpu_name(vgpu),
        "none" if limit is None else size(limit),
        size(vgpu.get("memory_used_bytes")),
        "none" if core is None else percent(core),
        percent(vgpu.get("sm_utilization_ratio")),
        ",".join(str(p) for p in pids) or "-",
    ]


def not_injected_line(state: JsonObject) -> str:
    """The containers running without their vGPU injection (lazy mode), "" when none."""
    missing = (state.get("nri") or {}).get("not_injected") or {}
    if not missing:
        return ""
    names = sorted(
        f"{c['pod_namespace']}/{c['pod_name']}/{c['container']}" if c.get("pod_name") else cid[:12]
        for cid, c in missing.items()
    )
    return f"{len(names)} container(s) running WITHOUT their vGPU injection: {', '.join(names)}"


def excluded_line(gpu: JsonObject) -> str:
    """A GPU vgpud does not share: "GPU 0 GPU-... left out: in MIG mode (...)"."""
    return f"GPU {gpu.get('index')} {gpu.get('uuid')} left out: {gpu.get('excluded')}"


def render(state: JsonObject, width: int) -> list[str]:
    """The screen for `state` (a `/debug/state` document), every line at most `width` characters."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    lines = [header(state), *notes(state)]
    gpus = state.get("gpus")
    excluded = state.get("excluded_gpus") or []
    if gpus is None:
        lines.append("this vgpud's state has no gpus section (a vgpud older than `vgpud top`)")
    elif not gpus:
        lines.append("no shared GPUs on this node" if excluded else "no GPUs on this node")
    else:
        lines += _gpu_table(gpus, state, width)
    lines += [excluded_line(gpu) for gpu in excluded]
    if line := not_injected_line(state):
        lines.append(line)
    return [fit(line, width) for line in lines]


def _gpu_table(gpus: Sequence[JsonObject], state: JsonObject, width: int) -> list[str]:
    usage = state.get("usage")
    known = usage is not None and usage.get("last_read") is not None  # else zeros that mean nothing
    devices = (state.get("device_health") or {}).get("devices") or {}
    health_width = max(6, *(len(_health(g, devices)[0]) for g in gpus))
    gpu_widths = [GPU_WIDTHS[0], -health_width, *GPU_WIDTHS[2:], 0]
    vgpus = [v for g in gpus for v in g.get("vgpus") or ()]
    fixed = len(INDENT) + sum(VGPU_WIDTHS) + len(GAP) * len(VGPU_WIDTHS) + len(GAP) + len("PIDS")
    what = "NAMESPACE/POD/CONTAINER" if state.get("mode") == "lazy" else "NAMESPACE/PARTITION"
    longest = max((len(_vgpu_name(v)) for v in vgpus), default=0)
    name_width = max(NAME_MIN, min(NAME_MAX, max(longest, len(what)), width - fixed))
    vgpu_titles = [fit(what, name_width), "LIMIT", "USED", "CORES", "SM", "PIDS"]
    vgpu_widths = [-name_width, *VGPU_WIDTHS, 0]
    lines = [_row(list(zip(GPU_TITLES, gpu_widths, strict=True)))]
    for gpu in gpus:
        health, reason = _health(gpu, devices)
        lines.append(_row(list(zip(_gpu_cells(gpu, health, known), gpu_widths, strict=True))))
        if reason:
            lines.append(f"{INDENT}UNHEALTHY: {reason}")
        if gpu.get("vgpus"):
            lines.append(INDENT + _row(list(zip(vgpu_titles, vgpu_widths, strict=True))))
        for vgpu in gpu.get("vgpus") or ():
            cells = _vgpu_cells(vgpu)
            cells[0] = fit(cells[0], name_width)
            lines.append(INDENT + _row(list(zip(cells, vgpu_widths, strict=True))))
    return lines


def json_view(state: JsonObject) -> dict[str, Any]:
    """`vgpud top --json`: the node, its GPUs (the state's `gpus` and `excluded_gpus` as they are) and
    the containers running without their injection."""
    missing = (state.get("nri") or {}).get("not_injected") or {}
    return {
        "node": state.get("node"),
        "mode": state.get("mode"),
        "time": state.get("time"),
        "healthy": state.get("healthy"),
        "gpus": state.get("gpus"),
        "excluded_gpus": state.get("excluded_gpus") or [],
        "not_injected": [
            {
                "container_id": cid,
                "namespace": c.get("pod_namespace", ""),
                "pod": c.get("pod_name", ""),
                "pod_uid": c.get("pod_uid", ""),
                "container": c.get("container", ""),
                "missing": c.get("missing", []),
            }
            for cid, c in sorted(missing.items())
        ],
    }


def screen(state: JsonObject | None, error: str, title: str, width: int, height: int) -> list[str]:
    """One frame of the live view: `title`, the last read's error (if it failed), then the last
    reading (None before the first); at most `height` lines, the last one saying what did not fit."""
    if height < 1:
        raise ValueError(f"height must be >= 1, got {height}")
    lines = [fit(title, width)]
    if error:
        lines.append(fit(error, width))
    if state is not None:
        lines += render(state, width)
    if len(lines) > height:
        hidden = len(lines) - height + 1
        lines = [*lines[: height - 1], fit(f"{ELLIPSIS} {hidden} more line(s): enlarge the terminal", width)]
    return lines

"""`vgpud top`'s screen drawn from plain state documents: lazy and eager nodes, no usage reader, an
unhealthy GPU, containers without their injection, narrow terminals."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from vgpud.observe.top import ELLIPSIS, json_view, render, screen

GIB, MIB = 1 << 30, 1 << 20
NOW = 1_700_000_000.0
UUID0, UUID1 = "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479", "GPU-7c0d1a2e-41b5-4f3e-8a55-2c6f0e9d1b37"


def vgpu(ns: str, pod: str, container: str, limit: int | None, core: float | None, **more: Any) -> dict:
    return {
        "namespace": ns,
        "pod": pod,
        "container": container,
        "claim_uid": "c-1",
        "partition": more.pop("partition", f"uid_{container}"),
        "memory_limit_bytes": limit,
        "core_limit_ratio": core,
        "memory_used_bytes": more.pop("used", None),
        "sm_utilization_ratio": more.pop("sm", None),
        "pids": more.pop("pids", []),
    }


def gpu(index: int, uuid: str, vgpus: list[dict], healthy: bool | None = True) -> dict:
    limits = [v["memory_limit_bytes"] for v in vgpus if v["memory_limit_bytes"] is not None]
    return {
        "index": index,
        "uuid": uuid,
        "product": "NVIDIA A100-SXM4-40GB",
        "healthy": healthy,
        "memory_total_bytes": 40 * GIB,
        "memory_allocated_bytes": sum(limits),
        "memory_used_bytes": sum(v["memory_used_bytes"] or 0 for v in vgpus),
        "cores_allocated_ratio": sum(v["core_limit_ratio"] or 0 for v in vgpus),
        "sm_utilization_ratio": sum(v["sm_utilization_ratio"] or 0 for v in vgpus),
        "unlimited_vgpus": len(vgpus) - len(limits),
        "vgpus": vgpus,
    }


def lazy_state(**changes: Any) -> dict[str, Any]:
    """Two GPUs: three containers on GPU 0 (one unlimited, one not yet using it), none on GPU 1."""
    on0 = [
        vgpu("team-a", "train-0", "main", GIB, 0.3, used=512 * MIB, sm=0.12, pids=[4242, 4250]),
        vgpu("team-a", "train-0", "side", 2 * GIB, 0.2),
        vgpu("team-b", "notebook", "jupyter", None, None, used=3 * GIB, sm=0.05, pids=[5001]),
    ]
    state: dict[str, Any] = {
        "node": "node-a",
        "version": "0.3.0",
        "mode": "lazy",
        "nri_fallback": None,
        "time": NOW,
        "healthy": True,
        "components": {"nri-plugin": {"state": "healthy", "counts_for_health": True}},
        "nri": {"session": {"connected": True}, "not_injected": {}},
        "device_health": {"devices": {}},
        "gpus": [gpu(0, UUID0, on0), gpu(1, UUID1, [])],
        "usage": {"interval_seconds": 10, "last_read": NOW - 1, "process_memory_error": "", "containers": {}},
        "calls": {"last_seq": 0, "recent": []},
    }
    return {**state, **changes}


def eager_state() -> dict[str, Any]:
    partitions = [
        vgpu("ml", "", "", 4 * GIB, 0.5, partition="gpu-0", used=GIB, pids=[77]),
        vgpu("ml", "", "", 8 * GIB, 0.25, partition="gpu-1"),
    ]
    return lazy_state(mode="eager", nri=None, gpus=[gpu(0, UUID0, partitions), gpu(1, UUID1, [])])


def line_with(lines: list[str], text: str) -> int:
    (found,) = [i for i, line in enumerate(lines) if text in line]
    return found


def cells(line: str) -> list[str]:
    """A table line's cells: separated by two or more spaces (one space joins a size and its unit)."""
    return re.split(r" {2,}", line.strip())


def test_a_lazy_node_shows_each_gpu_then_its_containers() -> None:
    lines = render(lazy_state(), 120)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW))
    assert lines[0] == f"node-a  vgpud 0.3.0  lazy mode  healthy  NRI connected  {stamp}"
    gpu0, gpu1 = line_with(lines, "  0  ok"), len(lines) - 1
    assert lines[gpu1].lstrip().startswith("1  ok") and gpu0 < gpu1
    # GPU 0: 40 GiB, 3 GiB allocated (the unlimited container adds nothing), 3.5 GiB used, 50% cores
    assert cells(lines[gpu0]) == [
        "0",
        "ok",
        "40.0 GiB",
        "3.0 GiB",
        "8%",
        "3.5 GiB",
        "9%",
        "50%",
        "17%",
        "A100-SXM4-40GB",
    ]
    assert cells(lines[gpu1])[2:9] == ["40.0 GiB", "0 MiB", "0%", "0 MiB", "0%", "0%", "0%"]
    # its containers, between it and GPU 1, under their own header, by namespace/pod/container
    assert cells(lines[gpu0 + 1]) == ["NAMESPACE/POD/CONTAINER", "LIMIT", "USED", "CORES", "SM", "PIDS"]
    assert [cells(line) for line in lines[gpu0 + 2 : gpu1]] == [
        ["team-a/train-0/main", "1.0 GiB", "512 MiB", "30%", "12%", "4242,4250"],
        ["team-a/train-0/side", "2.0 GiB", "-", "20%", "-", "-"],
        ["team-b/notebook/jupyter", "none", "3.0 GiB", "none", "5%", "5001"],
    ]


@pytest.mark.parametrize("width", [80, 120])
def test_the_columns_line_up_under_their_titles(width: int) -> None:
    """Every numeric cell ends where its title ends (right-aligned), at both common widths, and the
    whole view fits without a cut."""
    lines = render(lazy_state(), width)
    assert all(len(line) <= width for line in lines) and not any(ELLIPSIS in line for line in lines)
    gpu_titles, vgpu_titles = lines[1], lines[3]

    def ends(title_line: str, titles: list[str]) -> list[int]:
        return [title_line.index(t) + len(t) for t in titles]

    gpu_ends = ends(gpu_titles, ["MEMORY", "ALLOCATED", "USED", "CORES", "SM"])
    for row in (lines[2], lines[-1]):
        assert [row[e - 1] for e in gpu_ends] == ["B", "%", "%", "%", "%"], row
        assert [row[e] for e in gpu_ends] == [" "] * 5, row
    vgpu_ends = ends(vgpu_titles, ["LIMIT", "USED", "CORES", "SM"])
    for row in lines[4:7]:
        assert all(row[e - 1] != " " and row[e] == " " for e in vgpu_ends), row


def test_an_eager_node_names_its_partitions() -> None:
    lines = render(eager_state(), 120)
    assert "eager mode" in lines[0] and "NRI" not in lines[0]
    header = line_with(lines, "NAMESPACE/PARTITION")
    assert [cells(line)[:4] for line in lines[header + 1 : header + 3]] == [
        ["ml/gpu-0", "4.0 GiB", "1.0 GiB", "50%"],
        ["ml/gpu-1", "8.0 GiB", "-", "25%"],
    ]
    assert "12.0 GiB" in lines[header - 1] and "75%" in lines[header - 1]


def test_without_the_usage_reader_it_says_so_instead_of_zeros() -> None:
    state = lazy_state(usage=None)
    state["gpus"] = [gpu(0, UUID0, []), gpu(1, UUID1, [])]
    lines = render(state, 120)
    assert lines[1] == "usage reader off (--usage-interval 0): allocated, used, cores and SM unknown"
    for row in (lines[3], lines[4]):
        assert cells(row)[:7] == ["0" if row is lines[3] else "1", "ok", "40.0 GiB", "?", "?", "?", "?"]
        assert "0%" not in row and "MiB" not in row
    not_read = render(lazy_state(usage={"last_read": None, "process_memory_error": ""}), 120)
    assert not_read[1] == "usage reader: no read yet, allocated and used unknown"
    assert cells(not_read[-1])[:7] == ["1", "ok", "40.0 GiB", "?", "?", "?", "?"]


def test_a_state_without_gpus_says_what_is_missing() -> None:
    assert render(lazy_state(gpus=[]), 80)[-1] == "no GPUs on this node"
    old = lazy_state()
    del old["gpus"]
    assert "no gpus section" in render(old, 80)[-1]


def test_an_unhealthy_gpu_shows_why_and_an_unwatched_one_a_dash() -> None:
    state = lazy_state(healthy=False)
    state["components"]["nri-plugin"].update(state="failing", reason="NRI socket closed")
    state["gpus"][1]["healthy"] = False
    reason = "XID 79 (GPU has fallen off the bus) at 12:00:01"
    state["device_health"]["devices"][UUID1] = {"index": 1, "healthy": False, "reason": reason}
    lines = render(state, 120)
    assert "  lazy mode  UNHEALTHY  NRI connected  " in lines[0]
    assert lines[1] == "unhealthy components: nri-plugin failing (NRI socket closed)"
    row = line_with(lines, "  1  UNHEALTHY")
    assert cells(lines[row])[:2] == ["1", "UNHEALTHY"]
    assert lines[row + 1] == f"     UNHEALTHY: {reason}"
    # HEALTH widened for UNHEALTHY: the other columns still line up with their titles
    assert lines[2].index("MEMORY") + len("MEMORY") == lines[row].index("GiB") + 3
    unwatched = lazy_state(device_health=None)
    for g in unwatched["gpus"]:
        g["healthy"] = None
    assert [cells(line)[1] for line in render(unwatched, 120) if "A100" in line] == ["-", "-"]


def test_containers_without_their_injection_are_named() -> None:
    state = lazy_state()
    state["nri"]["not_injected"] = {
        "0123456789abcdef": {"pod_namespace": "team-c", "pod_name": "web", "container": "app", "missing": []},
        "fedcba9876543210": {"pod_namespace": "", "pod_name": "", "container": "x", "missing": []},
    }
    last = render(state, 120)[-1]
    assert last == "2 container(s) running WITHOUT their vGPU injection: fedcba987654, team-c/web/app"
    assert json_view(state)["not_injected"][0] == {
        "container_id": "0123456789abcdef",
        "namespace": "team-c",
        "pod": "web",
        "pod_uid": "",
        "container": "app",
        "missing": [],
    }


@pytest.mark.parametrize("width", [1, 2, 20, 40, 79])
def test_no_line_is_wider_than_the_terminal(width: int) -> None:
    state = lazy_state()
    state["gpus"][0]["vgpus"][0]["namespace"] = "a-namespace-with-a-very-long-name-indeed"
    lines = render(state, width)
    assert all(len(line) <= width for line in lines)
    assert any(line.endswith(ELLIPSIS) for line in lines)
    whole = render(state, 200)[0]
    assert lines[0] == (whole if len(whole) <= width else whole[: width - 1] + ELLIPSIS)


def test_a_long_name_is_cut_in_its_column_and_the_numbers_stay() -> None:
    state = lazy_state()
    state["gpus"][0]["vgpus"][0]["pod"] = "p" * 80
    row = next(line for line in render(state, 80) if "ppp" in line)
    assert len(row) <= 80 and f"p{ELLIPSIS}" in row
    assert cells(row)[1:5] == ["1.0 GiB", "512 MiB", "30%", "12%"]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="width must be >= 1"):
        render(lazy_state(), 0)
    with pytest.raises(ValueError, match="height must be >= 1"):
        screen(lazy_state(), "", "title", 80, 0)


def test_the_live_frame_shows_the_error_above_the_last_reading_and_fits_the_height() -> None:
    frame = screen(lazy_state(), "cannot read unix:/x: refused", "vgpud top: unix:/x", 80, 50)
    assert frame[:3] == ["vgpud top: unix:/x", "cannot read unix:/x: refused", render(lazy_state(), 80)[0]]
    short = screen(lazy_state(), "", "title", 80, 4)
    assert short[:3] == ["title", *render(lazy_state(), 80)[:2]]
    assert short[3] == f"{ELLIPSIS} {len(render(lazy_state(), 80)) - 2} more line(s): enlarge the terminal"
    assert screen(None, "cannot read", "title", 80, 10) == ["title", "cannot read"]


def test_the_json_view_is_the_node_and_its_gpus() -> None:
    state = lazy_state()
    assert json_view(state) == {
        "node": "node-a",
        "mode": "lazy",
        "time": NOW,
        "healthy": True,
        "gpus": state["gpus"],
        "excluded_gpus": [],
        "not_injected": [],
    }
    assert json_view(eager_state())["not_injected"] == []


def test_a_gpu_vgpud_does_not_share_has_a_line_of_its_own() -> None:
    excluded = {
        "index": 2,
        "uuid": "GPU-5c1e0a37-8d2b-4f60-a1e9-3b7f2c94d018",
        "product": "NVIDIA A100-SXM4-40GB",
        "reason": "mig",
        "excluded": "in MIG mode (4 MIG devices): vgpud does not share MIG GPUs",
        "mig_devices": [],
    }
    lines = render(lazy_state(excluded_gpus=[excluded]), 120)
    assert lines[-1] == (
        "GPU 2 GPU-5c1e0a37-8d2b-4f60-a1e9-3b7f2c94d018 left out: in MIG mode (4 MIG devices): "
        "vgpud does not share MIG GPUs"
    )
    alone = render(lazy_state(gpus=[], excluded_gpus=[excluded]), 120)
    assert alone[-2:] == ["no shared GPUs on this node", lines[-1]]
    assert render(lazy_state(gpus=[]), 120)[-1] == "no GPUs on this node"
    assert json_view(lazy_state(excluded_gpus=[excluded]))["excluded_gpus"] == [excluded]

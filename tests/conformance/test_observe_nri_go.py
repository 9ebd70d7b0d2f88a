"""Observability of a real `vgpud run` (mock GPUs, a real API server) whose NRI plugin containerd's own
runtime side drives: the Go harness's TestObserve (tests/conformance/nri/harness/observe.go) starts the
daemon as its plugin and pauses after each step while this test looks through the daemon's debug
socket (curl --unix-socket), its metrics port and `vgpud debug tail --json` / `vgpud debug state`.

    connected  the claim is prepared through vgpud's DRA socket, a tail is attached
    created    four CreateContainer (two injected, one without a claim, one forged) and a RemoveContainer:
               the directory -> container map, the calls, the tail's lines, the metrics, no drift
    restarted  vgpud stopped (the tail ends with close code 1001) and started again: the cache rebuilt
               from the runtime's Synchronize holds the one running vGPU container
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.nri import gobuild
from tests.kubeapi import ApiServer, api_request, free_port
from tests.support import require
from tests.vgpudproc import DRIVER, create_allocated_claim, dra_call, ensure_node

NODE = "observe-node"
NAMESPACE = "conformance"  # the harness's pods live here: NRI injects only a claim of the pod's namespace
PLUGIN = Path(gobuild.HERE) / "vgpud_run_plugin.py"
STEP_TIMEOUT = 90
#: CI runners are slow to start `vgpud run` twice and build the harness on a cold cache
RUN_TIMEOUT = 300


class Harness:
    """The Go harness running TestObserve, in its own process group (killed as a whole on failure)."""

    def __init__(self, proc: trio.Process, ctl: Path, log: Path) -> None:
        self.proc, self.ctl, self.log = proc, ctl, log

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-20000:]

    async def step(self, name: str) -> dict[str, Any]:
        """Wait for the harness's `<name>.json`."""
        path = self.ctl / f"{name}.json"
        with trio.fail_after(STEP_TIMEOUT):
            while not path.exists():  # another process writes it
                if self.proc.returncode is not None:
                    pytest.fail(
                        f"the harness exited ({self.proc.returncode}) before step {name}:\n{self.output()}"
                    )
                await trio.sleep(0.05)
        return json.loads(path.read_text())

    def ack(self, name: str, body: dict[str, Any] | None = None) -> None:
        tmp = self.ctl / f"{name}.ack.tmp"
        tmp.write_text(json.dumps(body or {}))
        tmp.rename(self.ctl / f"{name}.ack")


class Tail:
    """`vgpud debug tail --json` as a child process: its lines as they come, then its exit."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.calls: list[dict[str, Any]] = []
        self.stderr = b""

    async def read(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        buffer = b""
        async for chunk in self.proc.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            self.calls.extend(json.loads(line) for line in lines)
        async for chunk in self.proc.stderr:
            self.stderr += chunk

    async def wait_for(self, n: int) -> None:
        with trio.fail_after(STEP_TIMEOUT):
            while len(self.calls) < n:  # noqa: ASYNC110  # read by the reader task
                await trio.sleep(0.02)


async def curl(socket_path: Path, target: str) -> Any:
    result = await trio.run_process(
        ["curl", "-sS", "--fail", "--unix-socket", str(socket_path), f"http://vgpud{target}"],
        capture_stdout=True,
        capture_stderr=True,
    )
    return json.loads(result.stdout)


async def wait_state(socket_path: Path, done: Any, what: str) -> dict[str, Any]:
    """Poll /debug/state until `done(state)`; the last state. A timeout names `what` and the last
    state seen."""
    state = None
    with trio.move_on_after(STEP_TIMEOUT):
        while True:
            if socket_path.exists():
                try:
                    state = await curl(socket_path, "/debug/state")
                except Exception:  # not serving yet
                    state = None
                if state is not None and done(state):
                    return state
            await trio.sleep(0.1)
    raise AssertionError(f"{what} (not within {STEP_TIMEOUT} s; last state: {state})")


def metrics(port: int) -> dict[str, list[Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def sample(found: dict[str, list[Any]], family: str, name: str, **labels: str) -> float:
    (value,) = [s.value for s in found[family] if s.name == name and s.labels == labels]
    return value


def vgpud_cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "vgpud", *argv]


async def test_debug_endpoints_and_tail_of_vgpud_run_under_the_go_nri_runtime(
    short_tmp: Path, kube_apiserver: ApiServer
) -> None:
    require(gobuild.go_usable(), f"Go >= {'.'.join(map(str, gobuild.MIN_GO))} on PATH", "install Go")
    require(shutil.which("curl") is not None, "curl", "install curl")
    binary = await trio.to_thread.run_sync(gobuild.build, "harness", "v0.12")
    api = kube_apiserver
    ensure_node(api, NODE)
    try:
        api_request(api, "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise
    _, claim = create_allocated_claim(
        api,
        namespace=NAMESPACE,
        name="observed",
        node=NODE,
        containers={"main": {"memory": "4Gi", "cores": "30"}},
    )
    root, ctl = short_tmp / "root", short_tmp / "ctl"
    ctl.mkdir()
    debug_sock = short_tmp / "debug.sock"
    metrics_port = free_port()
    daemon_flags = [
        "--gpu-backend", "mock",
        "--gpu-profile", "a100-40gb-x2",
        "--root-prefix", str(root),
        "--node-name", NODE,
        "--kubeconfig", str(api.kubeconfig),
        "--healthcheck-address", "127.0.0.1",
        "--healthcheck-port", str(free_port()),
        "--feature-gates", "NRISupport=true",
        "--debug-socket", str(debug_sock),
        "--metrics-address", f"127.0.0.1:{metrics_port}",
        "--drift-interval", "1",
    ]  # fmt: skip
    dra_socket = root / f"var/lib/kubelet/plugins/{DRIVER}/dra.sock"
    log = short_tmp / "harness.log"
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "VGPUD_NRI_PLUGIN_CMD": json.dumps([sys.executable, str(PLUGIN), *daemon_flags]),
    }
    args = [str(binary), "-test.v", "-test.run", "^TestObserve$", "-vgpud.observe-dir", str(ctl)]
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(
            args, cwd=gobuild.REPO, env=env, stdout=out, stderr=out, start_new_session=True
        )
    harness = Harness(proc, ctl, log)
    daemon = Daemon(debug_sock, dra_socket, metrics_port)
    try:
        with trio.fail_after(RUN_TIMEOUT):
            await _observe(harness, daemon, claim, api)
            await proc.wait()
        assert proc.returncode == 0, harness.output()
        assert "--- PASS: TestObserve" in harness.output()
    except BaseException:
        print(harness.output())
        raise
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


def reserve_for(api: ApiServer, claim: dict[str, Any], pod_name: str, pod_uid: str) -> None:
    """Add a pod to the claim's reservedFor, as the scheduler would."""
    meta = claim["metadata"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
    current = api_request(api, "GET", path)
    current["status"]["reservedFor"] = [
        *current["status"].get("reservedFor", []),
        {"resource": "pods", "name": pod_name, "uid": pod_uid},
    ]
    api_request(api, "PUT", f"{path}/status", current)


@dataclass(frozen=True)
class Daemon:
    """Where the `vgpud run` the harness starts can be reached."""

    debug_sock: Path
    dra_socket: Path
    metrics_port: int


async def _observe(harness: Harness, daemon: Daemon, claim: dict[str, Any], api: ApiServer) -> None:
    claim_uid = claim["metadata"]["uid"]
    connected = await harness.step("connected")
    # the harness's pod is the one the claim is reserved for (vgpud injects no other pod)
    reserve_for(api, claim, "observe-1", connected["pod_uid"])
    # prepare the claim as the kubelet would, then attach a tail
    await wait_state(daemon.debug_sock, lambda s: s["components"]["dra-plugin"]["state"] == "healthy", "DRA")
    response = await trio.to_thread.run_sync(dra_call, daemon.dra_socket, "Prepare", [claim])
    assert response.claims[claim_uid].error == "", response
    tail = Tail(
        await trio.lowlevel.open_process(
            vgpud_cli("debug", "tail", "--json", "--socket", str(daemon.debug_sock)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tail.read)
        await _check_connected(daemon)
        harness.ack("connected", {"claim": claim_uid})
        await harness.step("created")
        await _check_created(daemon, tail, connected["pod_uid"], claim_uid)
        harness.ack("created")
        await harness.step("restarted")
        with trio.fail_after(STEP_TIMEOUT):
            await tail.proc.wait()
    # the tail ended cleanly with vgpud's stop
    assert tail.proc.returncode == 0, tail.stderr
    assert b"GOING_AWAY (1001): vgpud is shutting down" in tail.stderr
    await _check_restarted(daemon)
    harness.ack("restarted")


async def _check_connected(daemon: Daemon) -> None:
    state = await wait_state(daemon.debug_sock, lambda s: s["stream"]["clients"] == 1, "the tail attached")
    session = state["nri"]["session"]
    assert session["connected"] and session["synchronized"] and session["sessions"] == 1
    assert session["runtime"].startswith("containerd ") and session["nri_version"].startswith("v0.12")
    assert state["nri"]["stats"]["sync_reported"] == 1 and state["nri"]["cache"]["entries"] == 0


async def _check_created(daemon: Daemon, tail: Tail, pod_uid: str, claim_uid: str) -> None:
    """Four CreateContainer and one RemoveContainer: in the ring buffer, the tail, the state, the metrics."""
    await tail.wait_for(5)
    creates = await curl(daemon.debug_sock, "/debug/calls?hook=CreateContainer&n=10")
    outcomes = {c["container"]: (c["outcome"], c["claim_uid"]) for c in creates["calls"]}
    assert outcomes == {
        "main": ("ok", claim_uid),
        "sidecar": ("skipped", ""),
        "forged": ("rejected", "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"),
        "second": ("ok", claim_uid),
    }
    assert {c["pod_uid"] for c in creates["calls"]} == {pod_uid}
    assert [(c["call"], c["container"]) for c in tail.calls] == [
        ("CreateContainer", "main"),
        ("CreateContainer", "sidecar"),
        ("CreateContainer", "forged"),
        ("CreateContainer", "second"),
        ("RemoveContainer", "second"),
    ]
    assert [c["seq"] for c in tail.calls] == sorted(c["seq"] for c in tail.calls)

    state = await wait_state(daemon.debug_sock, lambda s: s["drift"]["checks"] >= 2, "two drift checks")
    directories = state["nri"]["cache"]["directories"]
    assert [len(d.pop("container_ids")) for d in directories.values()] == [1]
    assert list(directories.values()) == [
        {
            "pod_uid": pod_uid,
            "container": "main",
            "claim_uid": claim_uid,
            "pod_namespace": NAMESPACE,
            "pod_name": "observe-1",
        }
    ]
    (directory,) = directories
    assert Path(directory).is_dir() and directory.endswith(f"/claims/{claim_uid}/{pod_uid}_main")
    assert state["nri"]["stats"] == {
        "injected": 2,
        "skipped": 1,
        "rejected_unprepared": 1,
        "rejected_not_reserved": 0,
        "other_mode": 0,
        "sync_reported": 1,
        "sync_rebuilt": 0,
        "sync_invalid": 0,
        "removed_dirs": 1,
        "connection_closes": 0,
        # NRI v0.12 calls the dedicated RemoveContainer, not StateChange
        "requests": {"Configure": 1, "Synchronize": 1, "CreateContainer": 4, "RemoveContainer": 1},
    }
    assert state["drift"]["differences"] == []
    assert state["healthy"], state["components"]

    found = await trio.to_thread.run_sync(metrics, daemon.metrics_port)
    create = {"component": "nri", "call": "CreateContainer"}
    assert sample(found, "vgpud_hook_calls", "vgpud_hook_calls_total", **create, outcome="ok") == 2
    assert sample(found, "vgpud_hook_duration_seconds", "vgpud_hook_duration_seconds_count", **create) == 4
    assert sample(found, "vgpud_nri_connected", "vgpud_nri_connected") == 1
    assert sample(found, "vgpud_nri_cache_entries", "vgpud_nri_cache_entries") == 1
    assert sample(found, "vgpud_partition_mode", "vgpud_partition_mode", mode="lazy") == 1
    assert sample(found, "vgpud_debug_stream_clients", "vgpud_debug_stream_clients") == 1
    assert sample(found, "vgpud_drift_differences", "vgpud_drift_differences", kind="orphan-directory") == 0


async def _check_restarted(daemon: Daemon) -> None:
    """The new process's cache, rebuilt by the runtime's Synchronize: the one running vGPU container."""
    state = await wait_state(
        daemon.debug_sock, lambda s: s["nri"]["session"]["synchronized"], "synchronized again"
    )
    result = await trio.run_process(
        vgpud_cli("debug", "state", "--socket", str(daemon.debug_sock)), capture_stdout=True
    )
    via_cli = json.loads(result.stdout)
    for document in (state, via_cli):
        nri = document["nri"]
        assert nri["cache"]["entries"] == 1 and nri["session"]["sessions"] == 1
        assert [d["container"] for d in nri["cache"]["directories"].values()] == ["main"]
        stats = nri["stats"]
        assert (stats["sync_reported"], stats["sync_rebuilt"], stats["sync_invalid"]) == (4, 1, 1)
        assert nri["runtime_containers"] == 2  # main and forged carry a claim UID
        assert nri["not_injected"] == {}  # main was created with its injection
    assert [c["call"] for c in via_cli["calls"]["recent"]] == ["Synchronize"]

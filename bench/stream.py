"""NRI hook latency with live-stream clients attached: 0 clients, 3 clients, 3 clients + 1 stalled one.

The real NriHooks.create_container runs in this process, one call after another as the runtime makes
them, with the debug server (hypercorn, unix socket) in the same Trio loop, as in `vgpud run`. The
clients are other processes: three `vgpud debug tail --json --count N` (each must print every call,
in order) and one that upgrades to the websocket and then never reads. Two paths are timed:

- skip:   a container without a vGPU claim (recorded as skipped, nothing else);
- inject: a container of a prepared claim (directory made in a worker thread, mounts and env).

The hook's own latency (what vgpud_hook_duration_seconds records) is printed as p50/p99 with the ratio
to the run without clients, and the loop's throughput with the stream's work included. Exits 1 when a
live client missed a call or got one out of order, when the stalled client was not dropped for being
slow (the reason its subscription ended), or when any other client was.

    .venv/bin/python bench/stream.py [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests import objects as o
from tests.draharness import REF, single_container_claim
from tests.unit.observe.node import Node, make_node
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    CreateContainerRequest,
    PodSandbox,
    RemoveContainerRequest,
)
from vgpud.observe.hub import STREAM_BUFFER
from vgpud.observe.serve import run_debug_server
from vgpud.recorder import CloseReason, Subscription

#: a client that completes the websocket upgrade and then reads nothing, ever
STALLED = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(sys.argv[1])
    s.sendall(b"GET /debug/stream HTTP/1.1\\r\\nHost: vgpud\\r\\nUpgrade: websocket\\r\\n"
              b"Connection: Upgrade\\r\\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\n"
              b"Sec-WebSocket-Version: 13\\r\\n\\r\\n")
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        head += s.recv(1)
    print("stalled", flush=True)
    time.sleep(3600)
    """
)

#: one CreateContainer every millisecond: 1,000 containers a second. A real node makes far fewer:
#: containerd hands CreateContainer to the NRI plugins one at a time, and a whole CRI create takes
#: milliseconds to tens of them (bench/cri_latency.py), so a node stays under ~100 a second; at twice
#: this rate three Python `vgpud debug tail` clients on this 2-core machine fell behind, beside the
#: hooks they watch
PACE = 0.001
POD = PodSandbox(id="sb", name="bench", namespace=o.NAMESPACE, uid=o.POD1_UID)


def request(name: str, claim: str | None) -> CreateContainerRequest:
    env = [f"MANAGER_VGPU_CLAIM_UID={claim}"] if claim else ["PATH=/usr/bin"]
    return CreateContainerRequest(
        pod=POD, container=Container(id=name, pod_sandbox_id="sb", name=name, env=env)
    )


async def timed_calls(node: Node, calls: int, make: Callable[[int], CreateContainerRequest]) -> list[float]:
    """Hook latencies in seconds, one call every PACE seconds (far above a node's real rate, yet
    slow enough for a Python `vgpud debug tail` to keep up); the stream's tasks run in between."""
    latencies = []
    next_call = trio.current_time()
    for i in range(calls):
        req = make(i)
        began = time.perf_counter()
        await node.nri.create_container(req)
        latencies.append(time.perf_counter() - began)
        next_call += PACE
        await trio.sleep_until(next_call)
    return latencies


async def scenario(
    node: Node, sock: Path, out_dir: Path, *, clients: int, stalled: bool, calls: int, tag: str
) -> dict[str, object]:
    recorder = node.recorder
    first = recorder.last_seq + 1
    subscriptions: list[Subscription] = []  # this scenario's, to read why each one ended
    subscribe = recorder.subscribe

    def keep(*args: Any, **kwargs: Any) -> Subscription:
        subscriptions.append(subscribe(*args, **kwargs))
        return subscriptions[-1]

    recorder.subscribe = keep  # type: ignore[method-assign]
    total = 2 * calls
    tails = []
    for i in range(clients):
        out = (out_dir / f"{tag}-{i}.jsonl").open("w")
        argv = [sys.executable, "-m", "vgpud", "debug", "tail", "--json", "--count", str(total)]
        tails.append(await trio.lowlevel.open_process([*argv, "--socket", str(sock)], stdout=out))
    stall = None
    if stalled:
        stall = await trio.lowlevel.open_process(
            [sys.executable, "-c", STALLED, str(sock)], stdout=subprocess.PIPE
        )
        assert stall.stdout is not None
        await stall.stdout.receive_some(64)
    with trio.fail_after(60):
        while node.stream.clients < clients + int(stalled):  # noqa: ASYNC110  # other processes connect
            await trio.sleep(0.02)
    began = time.perf_counter()
    skip = await timed_calls(node, calls, lambda i: request(f"{tag}-plain-{i}", None))
    inject = await timed_calls(node, calls, lambda i: request(f"{tag}-gpu-{i}", o.CLAIM_UID))
    elapsed = time.perf_counter() - began
    with trio.fail_after(120):
        for tail in tails:
            await tail.wait()
    complete = True
    for i, tail in enumerate(tails):
        seqs = [
            int(line.split('"seq": ', 1)[1].split(",", 1)[0])
            for line in (out_dir / f"{tag}-{i}.jsonl").open()
        ]
        complete &= tail.returncode == 0 and seqs == list(range(first, first + total))
    recorder.subscribe = subscribe  # type: ignore[method-assign]
    # dropped for being slow: the stalled client and no other (a live client dropped also misses calls)
    slow = sum(1 for sub in subscriptions if sub.close_reason is CloseReason.SLOW)
    drops_right = slow == 1 and len(subscriptions) == clients + 1 if stalled else slow == 0
    if stall is not None:
        stall.kill()
        await stall.wait()
    with trio.fail_after(30):
        while node.stream.clients:  # noqa: ASYNC110  # the server notices the clients leave
            await trio.sleep(0.02)
    for i in range(calls):  # each scenario starts with the same directories on disk
        req = request(f"{tag}-gpu-{i}", o.CLAIM_UID)
        await node.nri.remove_container(RemoveContainerRequest(pod=req.pod, container=req.container))
    return {
        "skip": skip,
        "inject": inject,
        "rate": total / elapsed,
        "complete": complete,
        "drops_right": drops_right,
    }


async def main(calls: int) -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="vgb", dir="/tmp") as tmp:
        root = Path(tmp)
        node = make_node(root / "node", stream_buffer=STREAM_BUFFER)
        claim, pod = single_container_claim()
        node.harness.kube.add_claim(claim)
        node.harness.kube.add_pod(pod)
        assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
        sock = root / "debug.sock"
        async with trio.open_nursery() as nursery:
            ready = trio.Event()
            serve = partial(run_debug_server, node.app(), node.hub, ready.set, unix_path=sock, address=None)
            nursery.start_soon(serve)
            await ready.wait()
            await timed_calls(node, 300, lambda i: request(f"warm-{i}", o.CLAIM_UID))  # warm-up
            for i in range(300):
                req = request(f"warm-{i}", o.CLAIM_UID)
                await node.nri.remove_container(RemoveContainerRequest(pod=req.pod, container=req.container))
            runs = [
                ("0 clients", 0, False),
                ("3 clients", 3, False),
                ("3 clients + 1 stalled", 3, True),
            ]
            results = {}
            for name, clients, stalled in runs:
                tag = name.split()[0] + ("s" if stalled else "")
                results[name] = await scenario(
                    node, sock, root, clients=clients, stalled=stalled, calls=calls, tag=tag
                )
            nursery.cancel_scope.cancel()
    return results


def failures(results: dict[str, dict[str, object]]) -> list[str]:
    """The bench's own correctness check: every live client printed every call, in order, and the
    stalled client, and no other, was dropped for being slow."""
    wrong = []
    for name, result in results.items():
        if not result["complete"]:
            wrong.append(f"{name}: a live client missed calls or got them out of order")
        if name.endswith("stalled") and not result["drops_right"]:
            wrong.append(f"{name}: the stalled client was not dropped (or not it alone)")
        if not name.endswith("stalled") and not result["drops_right"]:
            wrong.append(f"{name}: a client was dropped for being slow")
    return wrong


def report(results: dict[str, dict[str, object]], calls: int) -> None:
    base = results["0 clients"]
    print(f"CreateContainer hook latency, {calls} calls per path, microseconds (ratio to 0 clients)")
    heads = ("skip p50", "skip p99", "inject p50", "inject p99")
    print(f"{'':24} {' '.join(f'{h:>16}' for h in heads)} {'calls/s':>9}  clients")
    for name, result in results.items():
        cells = []
        for path in ("skip", "inject"):
            for q in (50, 99):
                value = percentile(result[path], q)  # type: ignore[arg-type]
                ratio = value / percentile(base[path], q)  # type: ignore[arg-type]
                cells.append(f"{value * 1e6:8.1f} ({ratio:4.2f})")
        state = "every call, in order" if result["complete"] else "MISSED CALLS"
        if name.endswith("stalled"):
            state += "; stalled one dropped" if result["drops_right"] else "; stalled one NOT dropped"
        print(f"{name:24} {' '.join(f'{c:>16}' for c in cells)} {result['rate']:9.0f}  {state}")
    three, stalled = results["3 clients"], results["3 clients + 1 stalled"]
    ratios = [
        percentile(stalled[path], q) / percentile(three[path], q)  # type: ignore[arg-type]
        for path in ("skip", "inject")
        for q in (50, 99)
    ]
    print(f"{'stalled vs 3 clients':24} " + " ".join(f"{f'({r:4.2f})':>16}" for r in ratios))
    mean = statistics.mean(base["skip"])  # type: ignore[arg-type]
    print(f"(0 clients: skip mean {mean * 1e6:.1f} us; the clients are processes on the same CPUs)")


def summary(results: dict[str, dict[str, object]]) -> list[Figure]:
    """The inject path's p99 with 3 live clients + 1 stalled one, against no clients."""
    loaded, base = results["3 clients + 1 stalled"]["inject"], results["0 clients"]["inject"]
    value, reference = percentile(loaded, 99) * 1e6, percentile(base, 99) * 1e6  # type: ignore[arg-type]
    return [
        Figure(
            "hook p99 (inject), 3 clients + 1 stalled",
            value,
            "us",
            reference="the same calls, no clients",
            ratio=value / reference,
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per path and scenario (default 3000)")
    calls = parser.parse_args().calls
    if 2 * calls <= STREAM_BUFFER:
        parser.error(
            f"--calls must be over {STREAM_BUFFER // 2}: "
            f"the stalled client is dropped only when it is {STREAM_BUFFER} calls behind"
        )
    results = trio.run(main, calls)
    report(results, calls)
    wrong = failures(results)
    for line in wrong:
        print(f"FAILED: {line}", file=sys.stderr)
    emit("stream", summary(results), ok=not wrong)
    raise SystemExit(1 if wrong else 0)

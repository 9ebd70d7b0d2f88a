"""Registry throughput: N containers register at the same moment, end to end.

N client processes (forked before the server starts, so no fork happens under a running event loop)
each wait on a shared "go" pipe, then dial the registry socket with grpcio on a fresh channel, as the
in-container register client does, and register their own container. The server is `RegistryServer`
in lazy (NRI) mode in a Trio thread of this process, with its pod and claim caches (list + watch)
over the in-memory kube facade, and a host /proc + cgroup tree written to a temp dir (each child
placed in its own pod's container), so every call runs vgpud's real path: SO_PEERCRED,
/proc/<pid>/cgroup, limits, the NRI cache, the claim and pod lookups, the container check,
cgroup.procs and the locked in-place pids.config write. Afterwards every container's pids.config must
hold exactly its client's PID.

Prints the wall time from "go" to the last answer, calls per second, per-call latency as the client
sees it (p50, p99, max: connect + call, so it includes waiting for the CPU among N processes) and as
vgpud records it (from the request read to pids.config written). N defaults to 256, the node's
in-flight limit. The reference, measured first in the same run: the same N clients sending a request
that is refused while decoding; each round prints its wall time and client p50 as a ratio of it.
API requests: every call the kube facade answers from "go" to the last answer (its counter), and
those of the whole round (the caches' lists and watches too), each also per registration. The
server's start-up heap is frozen once its caches have listed, as the daemon does (vgpud.heap;
--no-freeze leaves it, to compare). The key figures also go to bench/summary.py's table
(bench/lib/results.py). Exits 1 when any call gets another answer than expected, a pids.config is
wrong, or a registration made an API request (they read the caches only).

    .venv/bin/python bench/registry.py [--containers N] [--rounds R] [--no-freeze]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc  # imported before fork, but no channel exists until a child makes its own
import trio
import trio_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests.unit.registry.world import World, running
from vgpud._pb.registry import ContainerDeviceRequest
from vgpud.heap import freeze_when_listed
from vgpud.registry.server import RegistryServer

METHOD = "/registry.VDeviceRegistry/RegisterContainerDevice"
#: issue 16's goal for the time a registration spends inside vgpud, p99
INSIDE_P99_GOAL_MS = 20.0


def client(socket_path: Path, request: bytes, go: int, results: int, expected: str) -> None:
    """A child: wait for "go", register, report `<pid> <status> <seconds>` as one atomic line."""
    os.read(go, 1)
    started = time.perf_counter()
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        try:
            call(request, timeout=30)
            code, details = "OK", ""
        except grpc.RpcError as err:
            code, details = err.code().name, err.details()
        if code != expected:
            sys.stderr.write(f"client {os.getpid()}: {code}: {details}\n")
    took = time.perf_counter() - started
    os.write(results, f"{os.getpid()} {code} {took:.6f}\n".encode())


def fork_clients(socket_path: Path, requests: list[bytes], expected: str) -> tuple[list[int], int, int]:
    """(child PIDs, write end of the go pipe, read end of the results pipe)."""
    go_read, go_write = os.pipe()
    results_read, results_write = os.pipe()
    pids = []
    for request in requests:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(go_write)
                os.close(results_read)
                client(socket_path, request, go_read, results_write, expected)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(go_read)
    os.close(results_write)
    return pids, go_write, results_read


class ServerThread:
    """RegistryServer and the world's pod and claim caches in a Trio thread; `stop` cancels them."""

    def __init__(self, world: World, server: RegistryServer, *, freeze: bool) -> None:
        self.world = world
        self.freeze = freeze
        self.server = server
        self.ready = threading.Event()
        self.token: trio.lowlevel.TrioToken | None = None
        self.scope: trio.CancelScope | None = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        if self.freeze:
            # as vgpud.daemon does: start-up's objects frozen once the caches have listed
            freeze_when_listed([self.world.pods, self.world.claim_objects])
        with trio.CancelScope() as self.scope:
            async with trio_asyncio.open_loop(), running(self.world.pods, self.world.claim_objects):
                await self.server.run(self.ready.set)

    def start(self) -> None:
        self.thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the registry server did not start")

    def stop(self) -> None:
        assert self.scope is not None and self.token is not None
        trio.from_thread.run_sync(self.scope.cancel, trio_token=self.token)
        self.thread.join(30)
        gc.unfreeze()  # the next round starts from the same collector state


@dataclass(frozen=True)
class Round:
    ok: bool
    wall: float
    p50: float
    #: vgpud's own time per call (the recorder's), p99, ms; 0 for the reference
    inside_p99: float = 0.0
    #: API requests from "go" to the last answer, and in the whole round
    requests: int = 0
    round_requests: int = 0


#: field 1 (pod_uid) says 127 bytes follow and 1 does: refused while decoding, before any lookup
MALFORMED = b"\x0a\x7fx"


def one_round(n: int, *, reference: bool = False, freeze: bool = True) -> Round:
    """N containers register at once; `reference`: the same N calls, each refused at decoding
    (INVALID_ARGUMENT): transport, framing and the event loop, without vgpud's lookups and write.
    `freeze`: the start-up heap frozen as the daemon freezes it (vgpud.heap)."""
    root = Path(tempfile.mkdtemp(prefix="vgb", dir="/tmp"))
    try:
        world = World(root)
        world.cache.replace([])  # synchronized
        containers = [world.add_container(i) for i in range(n)]
        server = world.server()
        requests = [
            MALFORMED if reference else bytes(ContainerDeviceRequest(pod_uid=uid, container_name="main"))
            for uid, _, _ in containers
        ]
        expected = "INVALID_ARGUMENT" if reference else "OK"
        children, go, results = fork_clients(server.path, requests, expected)
        for pid, (uid, cid, _) in zip(children, containers, strict=True):
            world.place(pid, uid, cid)
        runner = ServerThread(world, server, freeze=freeze)
        runner.start()
        before = sum(world.kube.calls.values())
        started = time.perf_counter()
        os.write(go, b"g" * n)
        lines: list[str] = []
        buffer = b""
        with os.fdopen(results, "rb") as answers:
            while len(lines) < n:
                chunk = answers.read1(65536)
                if not chunk:
                    break
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                lines += [line.decode() for line in complete]
        wall = time.perf_counter() - started
        requests = sum(world.kube.calls.values()) - before
        for pid in children:
            os.waitpid(pid, 0)
        os.close(go)
        runner.stop()

        outcomes = Counter(line.split()[1] for line in lines)
        latencies = [float(line.split()[2]) for line in lines]
        wrong = [
            str(config)
            for pid, (_, _, config) in zip(children, containers, strict=True)
            if (config / "pids.config").read_text() != ("" if reference else f"{pid}\n")
        ]
        round_requests = sum(world.kube.calls.values())
        ok = outcomes == Counter({expected: n}) and not wrong and len(lines) == n and requests == 0
        if not lines:
            print(f"{n} containers: no client answered")
            return Round(False, wall, 0.0)
        p50, p99 = (percentile(latencies, p) * 1000 for p in (50, 99))
        s99 = 0.0
        if reference:
            what, inside = "refused at decoding (reference)", ""
        else:
            timed = [c.latency_seconds for c in world.recorder.recent(component="registry")]
            s50, s99 = (percentile(timed, p) * 1000 for p in (50, 99))
            what, inside = "registered", f"in vgpud p50 {s50:5.2f} ms, p99 {s99:5.2f} ms; "
        print(
            f"{n} containers {what}: {wall * 1000:7.1f} ms total, {n / wall:6.0f} calls/s; "
            f"per call (client) p50 {p50:6.1f} ms, p99 {p99:6.1f} ms, max {max(latencies) * 1000:6.1f} ms; "
            f"{inside}{dict(outcomes)}; pids.config right: {n - len(wrong)}/{n}; "
            f"API requests: {requests} while registering, {round_requests} in the round "
            f"({dict(world.kube.calls)})"
        )
        return Round(ok, wall, p50, s99, requests, round_requests)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=256, help="concurrent registrations (default 256)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-freeze", action="store_true", help="leave the start-up heap unfrozen (vgpud.heap), to compare"
    )
    args = parser.parse_args()
    if args.containers < 1 or args.rounds < 1:
        parser.error("--containers and --rounds must be at least 1")
    print(
        f"registry bench: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, grpcio {grpc.__version__}, "
        f"start-up heap {'not ' if args.no_freeze else ''}frozen"
    )
    reference = one_round(args.containers, reference=True, freeze=not args.no_freeze)
    rounds = [one_round(args.containers, freeze=not args.no_freeze) for _ in range(args.rounds)]
    for r in rounds:
        wall, p50 = r.wall / reference.wall, r.p50 / reference.p50 if reference.p50 else float("nan")
        print(f"vs the reference: wall {wall:5.2f}x, client p50 {p50:5.2f}x")
    n = args.containers
    print(f"\n{'figure':<58} {'value':>10} {'per registration':>17}")
    worst_p99 = max(r.inside_p99 for r in rounds)
    print(f"{'time inside vgpud, p99 (worst round), ms':<58} {worst_p99:>10.2f}")
    requests, round_requests = max(r.requests for r in rounds), max(r.round_requests for r in rounds)
    for label, count in (
        ("API requests while registering (worst round)", requests),
        ("API requests in a round (caches' lists and watches too)", round_requests),
    ):
        print(f"{label:<58} {count:>10d} {count / n:>16.3f}x")
    ok = reference.ok and all(r.ok for r in rounds)
    worst = max(rounds, key=lambda r: r.wall)
    emit(
        "registry",
        [
            Figure(
                f"{n} registrations: inside vgpud, p99",
                worst_p99,
                "ms",
                goal=f"<= {INSIDE_P99_GOAL_MS:.0f} ms",
                met=worst_p99 <= INSIDE_P99_GOAL_MS,
            ),
            Figure(
                f"{n} registrations, wall (slowest round)",
                worst.wall * 1000,
                "ms",
                reference="the same calls refused at decoding",
                ratio=worst.wall / reference.wall,
            ),
            Figure(
                f"API requests while {n} registrations resolve",
                requests,
                "",
                reference=f"{round_requests} in the whole round",
                goal="0 (constant)",
                met=requests == 0,
            ),
        ],
        ok=ok,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Registry throughput: N containers register at the same moment, end to end.

N client processes (forked before the server starts, so no fork happens under a running event loop)
each wait on a shared "go" pipe, then exec the library's register client (build/libvgpu/vgpu-register,
what a container runs; `exec` keeps the PID) or, with --client grpcio, dial the registry socket with
grpcio on a fresh channel in Python, and register their own container. The server is `RegistryServer`
in lazy (NRI) mode in a Trio thread of this process, with its pod and claim caches (list + watch)
over the in-memory kube facade, and a host /proc + cgroup tree written to a temp dir (each child
placed in its own pod's container), so every call runs vgpud's real path: SO_PEERCRED,
/proc/<pid>/cgroup, limits, the NRI cache, the claim and pod lookups, the container check,
cgroup.procs and the locked in-place pids.config write. Afterwards every container's pids.config must
hold exactly its client's PID.

Prints the wall time from "go" to the last answer, calls per second, per-call latency as the client
sees it (p50, p99, max: connect + call, so it includes waiting for the CPU among N processes; for the
register client, "go" to its exit as this process reaps it) and as
vgpud records it (from the request read to pids.config written). N defaults to 256, the node's
in-flight limit. The reference, measured first in the same run: the same N clients sending a request
that is refused while it is read (grpcio: a malformed message; the register client: a container name
that is no DNS label), before any lookup; each round prints its wall time and client p50 as a ratio of it.
API requests: every call the kube facade answers from "go" to the last answer (its counter), and
those of the whole round (the caches' lists and watches too), each also per registration. The
server's start-up heap is frozen once its caches have listed, as the daemon does (vgpud.heap;
--no-freeze leaves it, to compare). The key figures also go to bench/summary.py's table
(bench/lib/results.py). Exits 1 when any call gets another answer than expected, a pids.config is
wrong, or a registration made an API request (they read the caches only).

The grpcio clients spend several milliseconds of CPU each after "go" (a channel, its threads): 256 of
them on 2 cores keep the server waiting for the CPU, which the time inside vgpud then includes; the
register client spends well under one.

    .venv/bin/python bench/registry.py [--containers N] [--rounds R] [--no-freeze] [--client c|grpcio]
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc  # imported before fork, but no channel exists until a child makes its own
import trio
import trio_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests.support import built
from tests.unit.registry.world import World, running
from vgpud._pb.registry import ContainerDeviceRequest
from vgpud.heap import freeze_when_listed
from vgpud.registry.server import RegistryServer

METHOD = "/registry.VDeviceRegistry/RegisterContainerDevice"
#: issue 16's goal for the time a registration spends inside vgpud, p99
INSIDE_P99_GOAL_MS = 20.0


def grpcio_client(socket_path: Path, request: bytes, go: int, results: int, expected: str) -> None:
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


def fork_grpcio_clients(
    socket_path: Path, requests: list[bytes], expected: str
) -> tuple[list[int], int, int]:
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
                grpcio_client(socket_path, request, go_read, results_write, expected)
            except BaseException:
                code = 1
            os._exit(code)
        pids.append(pid)
    os.close(go_read)
    os.close(results_write)
    return pids, go_write, results_read


def fork_c_clients(
    binary: Path, socket_path: Path, argvs: list[list[str]], logs: Path
) -> tuple[list[int], int]:
    """Children that wait for "go" and then exec the library's register client (`exec` keeps the PID,
    so the client is the process placed in the container); each one's stderr goes to logs/<pid>.
    (child PIDs, write end of the go pipe)."""
    go_read, go_write = os.pipe()
    pids = []
    for argv in argvs:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_write)
                log = os.open(logs / str(os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(log, 2)
                os.read(go_read, 1)
                os.execv(binary, [str(binary), "--address", str(socket_path), *argv])
            finally:
                os._exit(127)
        pids.append(pid)
    os.close(go_read)
    return pids, go_write


def reap_c_clients(pids: list[int], started: float, logs: Path) -> list[str]:
    """`<pid> <status> <seconds>` lines as the grpcio clients write them: the time from "go" to the
    client's exit as this process sees it, the gRPC status from its exit code and stderr."""
    lines = []
    for _ in pids:
        pid, status = os.wait()
        took = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        text = (logs / str(pid)).read_text(errors="replace")
        name = "OK" if code == 0 else next((c for c in C_STATUSES if c in text), f"exit-{code}")
        if code != 0 and name != "INVALID_ARGUMENT":
            sys.stderr.write(f"client {pid}: exit {code}: {text.strip()}\n")
        lines.append(f"{pid} {name} {took:.6f}")
    return lines


#: the statuses the register client may print (its exit code 5 says only "a gRPC error status")
C_STATUSES = ("INVALID_ARGUMENT", "PERMISSION_DENIED", "NOT_FOUND", "FAILED_PRECONDITION", "UNAVAILABLE")


def read_results(results: int, n: int) -> list[str]:
    """The grpcio clients' lines, until n or the end of the pipe."""
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
    return lines


def fork_clients(
    socket_path: Path,
    containers: list[tuple[str, str, Path]],
    root: Path,
    *,
    reference: bool,
    register: Path | None,
) -> tuple[list[int], int, Callable[[float], list[str]]]:
    """One waiting client per container: (their PIDs, the go pipe's write end, a function that waits
    for them all, given the moment of "go", and returns their result lines)."""
    if register is not None:
        logs = root / "client-logs"
        logs.mkdir()
        # the reference: a container name that is no DNS label, refused before any lookup
        name = "Not_A_Label" if reference else "main"
        argvs = [["--pod-uid", uid, "--container-name", name] for uid, _, _ in containers]
        children, go = fork_c_clients(register, socket_path, argvs, logs)
        return children, go, lambda started: reap_c_clients(children, started, logs)
    requests = [
        MALFORMED if reference else bytes(ContainerDeviceRequest(pod_uid=uid, container_name="main"))
        for uid, _, _ in containers
    ]
    expected = "INVALID_ARGUMENT" if reference else "OK"
    children, go, results = fork_grpcio_clients(socket_path, requests, expected)

    def collect(_started: float) -> list[str]:
        lines = read_results(results, len(children))
        for pid in children:
            os.waitpid(pid, 0)
        return lines

    return children, go, collect


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
            # as vgpud run does (vgpud.node.parts): start-up's objects frozen once the caches have listed
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


def one_round(n: int, *, reference: bool = False, freeze: bool = True, register: Path | None = None) -> Round:
    """N containers register at once; `reference`: the same N calls, each refused while the request is
    read (INVALID_ARGUMENT): transport, framing and the event loop, without vgpud's lookups and write.
    `freeze`: the start-up heap frozen as the daemon freezes it (vgpud.heap). `register`: the library's
    register client to exec (else grpcio clients in Python)."""
    root = Path(tempfile.mkdtemp(prefix="vgb", dir="/tmp"))
    try:
        world = World(root)
        world.containers.replace([])  # synchronized
        containers = [world.add_container(i) for i in range(n)]
        server = world.server()
        expected = "INVALID_ARGUMENT" if reference else "OK"
        children, go, collect = fork_clients(
            server.path, containers, root, reference=reference, register=register
        )
        for pid, (uid, cid, _) in zip(children, containers, strict=True):
            world.place(pid, uid, cid)
        runner = ServerThread(world, server, freeze=freeze)
        runner.start()
        before = sum(world.kube.calls.values())
        started = time.perf_counter()
        os.write(go, b"g" * n)
        lines = collect(started)
        wall = time.perf_counter() - started
        requests = sum(world.kube.calls.values()) - before
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
            what, inside = "refused while read (reference)", ""
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
    parser.add_argument(
        "--client",
        choices=("c", "grpcio"),
        default="c",
        help="c: the library's register client, as containers run it (default); grpcio: Python clients",
    )
    args = parser.parse_args()
    if args.containers < 1 or args.rounds < 1:
        parser.error("--containers and --rounds must be at least 1")
    register = built("libvgpu/vgpu-register") if args.client == "c" else None
    client = f"register client {register}" if register else f"grpcio {grpc.__version__} clients"
    print(
        f"registry bench: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {client}, "
        f"start-up heap {'not ' if args.no_freeze else ''}frozen"
    )
    freeze = not args.no_freeze
    reference = one_round(args.containers, reference=True, freeze=freeze, register=register)
    rounds = [one_round(args.containers, freeze=freeze, register=register) for _ in range(args.rounds)]
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

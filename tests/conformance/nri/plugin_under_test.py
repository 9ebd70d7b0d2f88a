"""vgpud's real NRI plugin (hooks, session, supervision) as a process the Go conformance harness drives.

Only the DRA side is replaced: the claim UIDs given with --prepared-claim count as prepared vGPU claims.
--delay-container NAME=SECONDS makes CreateContainer of that container slow, so the harness can check
what the runtime does with a plugin slower than its request timeout (it drops it; we reconnect).
--control PATH serves the harness's hot-plug requests on a unix socket (README.md, "Control"): the
plugin's `RuntimeLink.update_devices` and its store of every container (`NriHooks.containers`).

    plugin_under_test.py --socket /tmp/x/nri.sock --manager-root /tmp/x/root --prepared-claim UID ...
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any

import trio

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from tests.admission import StaticAdmission  # noqa: E402
from vgpud._pb.nri.pkg.api.v1alpha1 import (  # noqa: E402
    CreateContainerRequest,
    CreateContainerResponse,
    SynchronizeResponse,
)
from vgpud.containers.record import Injection  # noqa: E402
from vgpud.containers.values import DeviceRule  # noqa: E402
from vgpud.heap import freeze_start_up  # noqa: E402
from vgpud.nri.conn import Identity, run_session  # noqa: E402
from vgpud.nri.hooks import NriHooks  # noqa: E402
from vgpud.nri.runtime_link import RuntimeLink, RuntimeUpdateError  # noqa: E402
from vgpud.nri.sync import SyncBatch  # noqa: E402
from vgpud.partition.layout import Layout  # noqa: E402
from vgpud.partition.lazy import LazyAssigner  # noqa: E402
from vgpud.recorder import Recorder  # noqa: E402
from vgpud.supervisor import Backoff, Restart, Supervisor  # noqa: E402

DRIVER = "manager.nvidia.com"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the runtime's NRI socket")
    parser.add_argument("--manager-root", required=True, type=Path, help="where claim directories go")
    parser.add_argument("--idx", default="00", help="NRI plugin index")
    parser.add_argument("--name", default=DRIVER, help="NRI plugin name")
    parser.add_argument("--prepared-claim", action="append", default=[], help="a prepared vGPU claim UID")
    parser.add_argument("--backoff", type=float, default=0.1, help="first reconnect delay, seconds")
    parser.add_argument(
        "--delay-container",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="CreateContainer of this container sleeps first",
    )
    parser.add_argument("--sync-report", type=Path, help="append a JSON line after each complete Synchronize")
    parser.add_argument(
        "--control", type=Path, help="serve the harness's hot-plug requests on this unix socket"
    )
    return parser.parse_args()


def with_delays(hooks: NriHooks, delays: dict[str, float]) -> None:
    """Make CreateContainer of the named containers slow, in front of the real hook."""
    real = hooks.create_container

    async def create_container(request: CreateContainerRequest) -> CreateContainerResponse:
        name = request.container.name if request.container else ""
        if name in delays:
            await trio.sleep(delays[name])
        return await real(request)

    hooks.create_container = create_container  # type: ignore[method-assign]  (the session binds it)


def with_sync_report(hooks: NriHooks, report: Path) -> None:
    """After each complete Synchronize: {"pods": P, "containers": C, "tracked": T} over all its chunks."""
    real = hooks.synchronize
    totals = {"pods": 0, "containers": 0}

    async def synchronize(request: SyncBatch) -> SynchronizeResponse:
        response = await real(request)
        totals["pods"] += len(request.pods)
        totals["containers"] += request.reported
        if not request.more:
            # the harness's containers carry no injection: vgpud tracks them as not injected
            line = {**totals, "tracked": hooks.containers.count(Injection.INJECTED, Injection.MISSING)}
            with report.open("a") as out:
                out.write(json.dumps(line) + "\n")
            totals.update(pods=0, containers=0)
        return response

    real_begin = hooks.begin_session

    def begin_session() -> trio.Event:  # a new connection's Synchronize starts from zero
        totals.update(pods=0, containers=0)
        return real_begin()

    hooks.begin_session = begin_session  # type: ignore[method-assign]
    hooks.synchronize = synchronize  # type: ignore[method-assign]  (the session binds it)


async def control_reply(request: dict[str, Any], hooks: NriHooks, link: RuntimeLink) -> dict[str, Any]:
    """One control request: {"op": "update_devices", "container_id", "rules", "timeout"} -> {"error"}
    ("" on success); {"op": "target", "container_id"} -> {"target": {...} or null}."""
    if request.get("op") == "update_devices":
        rules = [
            DeviceRule(r["allow"], r["type"], r["major"], r["minor"], r["access"]) for r in request["rules"]
        ]
        try:
            await link.update_devices(request["container_id"], rules, float(request["timeout"]))
        except (RuntimeUpdateError, ValueError) as err:
            return {"error": str(err)}
        return {"error": ""}
    if request.get("op") == "target":
        target = hooks.containers.by_id(request["container_id"])
        if target is None:
            return {"error": "", "target": None}
        fields = ("container_id", "pod_uid", "running", "pid", "cgroups_path")
        return {
            "error": "",
            "target": {"container": target.name, **{name: getattr(target, name) for name in fields}},
        }
    return {"error": f"unknown op {request.get('op')!r}"}


async def control_listener(path: Path) -> trio.SocketListener:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen()
    return trio.SocketListener(sock)


async def serve_control(listener: trio.SocketListener, hooks: NriHooks, link: RuntimeLink) -> None:
    """One JSON request line per connection, one JSON reply line."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while not data.endswith(b"\n"):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            reply = await control_reply(json.loads(data), hooks, link)
            await stream.send_all(json.dumps(reply).encode() + b"\n")

    await trio.serve_listeners(handle, [listener])


async def main(args: argparse.Namespace) -> None:
    prepared = frozenset(args.prepared_claim)
    hooks = NriHooks(
        assigner=LazyAssigner(Layout(args.manager_root.resolve()), driver=DRIVER),
        admission=StaticAdmission(lambda uid, _namespace: uid in prepared),
        recorder=Recorder(),
    )
    with_delays(
        hooks, {name: float(sec) for name, _, sec in (d.partition("=") for d in args.delay_container)}
    )
    if args.sync_report is not None:
        with_sync_report(hooks, args.sync_report)
    link = RuntimeLink()
    # as `vgpud run` does once its caches have listed (this process has none): start-up's objects
    # out of the collector's reach, so a full collection does not traverse them inside a hook
    freeze_start_up()
    restart = Restart(Backoff(initial=args.backoff, factor=2, cap=max(args.backoff, 2.0)), healthy_after=30)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery, Supervisor(shutdown_timeout=5) as supervisor:
            if args.control is not None:  # listening before the session starts: the harness waits for that
                nursery.start_soon(serve_control, await control_listener(args.control), hooks, link)
            run = partial(run_session, args.socket, hooks, Identity(args.name, args.idx), link=link)
            supervisor.supervise("nri-plugin", run, restart)
            async for _ in signals:
                supervisor.cancel()
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="plugin-under-test %(levelname)s %(name)s: %(message)s")
    trio.run(main, parse_args())

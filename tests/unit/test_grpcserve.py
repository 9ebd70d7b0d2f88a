"""grpclib under Trio: socket lifecycle (stale, refused, ours-only unlink) and the health service."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpclib
import pytest
import trio
import trio_asyncio
from grpclib.client import Channel

from vgpud._pb.grpc.health.v1 import HealthCheckRequest, HealthCheckResponseServingStatus, HealthStub
from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.grpcserve import Bound, serve
from vgpud.health import HealthService
from vgpud.sockpath import SocketPathError, remove_stale_socket


def _bind_socket_file(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


def test_stale_socket_is_removed(short_tmp: Path) -> None:
    path = short_tmp / "dra.sock"
    _bind_socket_file(path)
    remove_stale_socket(path)
    assert not path.exists()


@pytest.mark.parametrize("kind", ["file", "dir", "symlink"])
def test_anything_but_a_socket_is_refused_and_untouched(short_tmp: Path, kind: str) -> None:
    path = short_tmp / "dra.sock"
    target = short_tmp / "precious"
    target.write_text("keep me")
    if kind == "file":
        path.write_text("not a socket")
    elif kind == "dir":
        path.mkdir()
    else:
        path.symlink_to(target)
    with pytest.raises(SocketPathError, match="is not a socket"):
        remove_stale_socket(path)
    assert os.path.lexists(path)
    assert target.read_text() == "keep me"


def _registry(state: HealthState) -> HealthRegistry:
    registry = HealthRegistry()
    registry.register("dra")
    registry.set("dra", state)
    return registry


async def _check(path: Path, service: str = "liveness") -> HealthCheckResponseServingStatus:
    async def call() -> HealthCheckResponseServingStatus:
        channel = Channel(path=str(path))
        try:
            response = await HealthStub(channel).check(HealthCheckRequest(service=service), timeout=5)
        finally:
            channel.close()
        return response.status

    return await trio_asyncio.aio_as_trio(call)()


async def _serve_until(path: Path, registry: HealthRegistry, body: Callable[[], Awaitable[None]]) -> None:
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        bound: list[Bound] = []
        started = trio.Event()

        def ready(b: Bound) -> None:
            bound.append(b)
            started.set()

        nursery.start_soon(lambda: serve([HealthService(registry)], path=path, ready=ready))
        await started.wait()
        assert bound == [Bound(path=path)]
        await body()
        nursery.cancel_scope.cancel()


async def test_unix_socket_serves_replaces_stale_and_is_removed_on_cancel(short_tmp: Path) -> None:
    path = short_tmp / "sub" / "health.sock"
    path.parent.mkdir()
    _bind_socket_file(path)  # a stale socket from an earlier process

    async def body() -> None:
        assert path.is_socket()
        assert await _check(path) == HealthCheckResponseServingStatus.SERVING
        assert await _check(path, "") == HealthCheckResponseServingStatus.SERVING
        with pytest.raises(grpclib.GRPCError) as info:
            await _check(path, "other")
        assert info.value.status == grpclib.Status.NOT_FOUND

    await _serve_until(path, _registry(HealthState.HEALTHY), body)
    assert not path.exists()


async def test_not_serving_when_a_component_is_unhealthy(short_tmp: Path) -> None:
    path = short_tmp / "h.sock"

    async def body() -> None:
        assert await _check(path) == HealthCheckResponseServingStatus.NOT_SERVING

    await _serve_until(path, _registry(HealthState.FAILING), body)


async def test_a_successors_socket_is_not_unlinked(short_tmp: Path) -> None:
    """A new vgpud that re-bound the path must keep its socket when the old one shuts down."""
    path = short_tmp / "h.sock"

    async def body() -> None:
        path.unlink()
        _bind_socket_file(path)

    await _serve_until(path, _registry(HealthState.HEALTHY), body)
    assert path.is_socket()


async def test_probes_decide_serving() -> None:
    calls: list[str] = []

    async def ok() -> None:
        calls.append("ok")

    async def broken() -> None:
        calls.append("broken")
        raise ConnectionRefusedError("dra.sock")

    registry = _registry(HealthState.HEALTHY)
    async with trio_asyncio.open_loop():
        good = await trio_asyncio.aio_as_trio(HealthService(registry, [ok]).status)()
        bad = await trio_asyncio.aio_as_trio(HealthService(registry, [ok, broken]).status)()
    assert good == HealthCheckResponseServingStatus.SERVING
    assert bad == HealthCheckResponseServingStatus.NOT_SERVING
    assert calls == ["ok", "ok", "broken"]


async def test_tcp_port_zero_reports_the_bound_port() -> None:
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        bound = await nursery.start(_serve_tcp)
        assert bound.host == "127.0.0.1"
        assert bound.port and bound.port > 0
        with socket.create_connection(("127.0.0.1", bound.port), timeout=2):
            pass
        nursery.cancel_scope.cancel()


async def _serve_tcp(task_status: trio.TaskStatus[Bound] = trio.TASK_STATUS_IGNORED) -> None:
    await serve([HealthService(HealthRegistry())], host="127.0.0.1", port=0, ready=task_status.started)


async def test_serve_needs_exactly_one_address() -> None:
    with pytest.raises(ValueError, match="exactly one of path or port"):
        await serve([], path=Path("/tmp/x.sock"), port=1)

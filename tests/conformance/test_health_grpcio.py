"""The DRA resource-health stream driven by grpcio (an independent gRPC stack) over a real unix socket,
as the kubelet's Go client calls it: the complete device list on open, again on every health board
change and at the resend interval, the stream's end when the client goes; UNIMPLEMENTED and not
advertised without a board (the NVMLDeviceHealthCheck gate off); the registration advertising it with
one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio_asyncio

from tests.conformance.grpcio_calls import get_info
from tests.stdproto import message_class
from vgpud.dra.service import (
    HEALTH_CHECK_TIMEOUT_S,
    MAX_HEALTH_MESSAGE,
    DeviceHealthService,
    RegistrationService,
)
from vgpud.dra.slicebuild import device_names
from vgpud.gpu import open_inventory
from vgpud.gpu.health import DeviceHealth, HealthBoard
from vgpud.gpu.mock import PROFILES_DIR
from vgpud.grpcserve import serve

METHOD = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
POOL = "node-a"
GPUS = open_inventory("mock", profile=PROFILES_DIR / "a100-40gb-x2.yaml").gpus()
GPU0, GPU1 = GPUS[0].uuid, GPUS[1].uuid
HEALTHY = 1  # v1alpha1.HealthStatus
UNHEALTHY = 2
WAIT_S = 10


@dataclass
class Served:
    service: DeviceHealthService
    socket: Path


async def _serve(handlers: list[object], path: Path, task_status: trio.TaskStatus[None]) -> None:
    await serve(handlers, path=path, ready=lambda _b: task_status.started())


@pytest.fixture
async def board() -> HealthBoard:
    return HealthBoard([GPU0, GPU1], clock=lambda: 1000.0)


async def serving(service: DeviceHealthService, short_tmp: Path) -> AsyncIterator[Served]:
    socket = short_tmp / "dra.sock"
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await nursery.start(_serve, [service], socket)
        yield Served(service, socket)
        nursery.cancel_scope.cancel()


@pytest.fixture
async def health(board: HealthBoard, short_tmp: Path) -> AsyncIterator[Served]:
    service = DeviceHealthService(board, pool=POOL, devices=device_names(GPUS), resend_interval=3600)
    async for served in serving(service, short_tmp):
        yield served


class Stream:
    """One NodeWatchResources call of a grpcio client; `next()` blocks, so call it in a thread."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        watch = self.channel.unary_stream(
            METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=message_class("v1alpha1.NodeWatchResourcesResponse").FromString,
        )
        self.call: Iterator[Any] = watch(message_class("v1alpha1.NodeWatchResourcesRequest")(), timeout=60)

    async def next(self) -> dict[str, tuple[str, int, int, int, str]]:
        """The next complete list: device -> (pool, health, last updated, timeout, message)."""
        with trio.fail_after(WAIT_S):
            reply = await trio.to_thread.run_sync(next, self.call)
        return {
            d.device.device_name: (
                d.device.pool_name,
                d.health,
                d.last_updated_time,
                d.health_check_timeout_seconds,
                d.message,
            )
            for d in reply.devices
        }

    def close(self) -> None:
        self.call.cancel()  # type: ignore[attr-defined]
        self.channel.close()


@pytest.fixture
async def stream(health: Served) -> AsyncIterator[Stream]:
    s = Stream(health.socket)
    try:
        yield s
    finally:
        s.close()


def healthy(since: int = 1000) -> tuple[str, int, int, int, str]:
    return (POOL, HEALTHY, since, HEALTH_CHECK_TIMEOUT_S, "")


async def test_the_first_reply_is_every_device(stream: Stream) -> None:
    assert await stream.next() == {"vgpu-0": healthy(), "vgpu-1": healthy()}


async def test_a_board_change_sends_the_complete_list_again(stream: Stream, board: HealthBoard) -> None:
    await stream.next()
    reason = "XID 79: GPU has fallen off the bus"
    board.update(DeviceHealth(GPU1, healthy=False, reason=reason, since=2000.7, xid=79))
    assert await stream.next() == {
        "vgpu-0": healthy(),
        "vgpu-1": (POOL, UNHEALTHY, 2000, HEALTH_CHECK_TIMEOUT_S, reason),
    }
    board.update(DeviceHealth(GPU1, healthy=True, since=3000.0))
    assert await stream.next() == {"vgpu-0": healthy(), "vgpu-1": healthy(3000)}


async def test_a_long_reason_is_cut_to_the_api_limit(stream: Stream, board: HealthBoard) -> None:
    await stream.next()
    board.update(DeviceHealth(GPU0, healthy=False, reason="x" * 5000, since=2000.0))
    assert (await stream.next())["vgpu-0"][4] == "x" * MAX_HEALTH_MESSAGE


async def test_each_open_stream_gets_the_list_and_the_changes(
    health: Served, stream: Stream, board: HealthBoard
) -> None:
    await stream.next()
    other = Stream(health.socket)
    try:
        assert await other.next() == {"vgpu-0": healthy(), "vgpu-1": healthy()}
        assert health.service.open_streams == 2
        board.update(DeviceHealth(GPU0, healthy=False, reason="GPU lost: gone", since=2000.0))
        for s in (stream, other):
            assert (await s.next())["vgpu-0"][1] == UNHEALTHY
    finally:
        other.close()


async def test_a_quiet_board_is_reported_again_at_the_resend_interval(
    board: HealthBoard, short_tmp: Path
) -> None:
    """The kubelet stamps a report with its arrival and forgets it after the timeout: without a
    change, the list still comes again, well inside it."""
    service = DeviceHealthService(board, pool=POOL, devices=device_names(GPUS), resend_interval=0.2)
    async for served in serving(service, short_tmp):
        s = Stream(served.socket)
        try:
            first = await s.next()
            started = trio.current_time()
            assert await s.next() == first
            assert trio.current_time() - started >= 0.15
        finally:
            s.close()


async def test_a_client_that_goes_ends_its_stream(health: Served) -> None:
    s = Stream(health.socket)
    await s.next()
    assert health.service.open_streams == 1
    s.close()
    with trio.fail_after(WAIT_S):  # grpclib cancels the handler when the client resets the stream
        while True:
            if health.service.open_streams == 0:
                break
            await trio.sleep(0.01)
    again = Stream(health.socket)  # and the server still serves
    try:
        assert set(await again.next()) == {"vgpu-0", "vgpu-1"}
    finally:
        again.close()


async def test_without_a_board_it_is_a_well_formed_unimplemented(short_tmp: Path) -> None:
    async for served in serving(DeviceHealthService(), short_tmp):
        s = Stream(served.socket)
        try:
            with pytest.raises(grpc.RpcError) as info:
                await trio.to_thread.run_sync(next, s.call)
        finally:
            s.close()
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert info.value.details() == "vgpud does not report device health"


@pytest.mark.parametrize("health_service", [False, True])
async def test_registration_advertises_the_stream_only_with_a_board(
    short_tmp: Path, health_service: bool
) -> None:
    socket = short_tmp / "reg.sock"
    registration = RegistrationService(
        "manager.nvidia.com", short_tmp / "dra.sock", health_service=health_service
    )
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await nursery.start(_serve, [registration], socket)

        info = await trio.to_thread.run_sync(get_info, socket)
        nursery.cancel_scope.cancel()
    expected = ["v1.DRAPlugin", "v1beta1.DRAPlugin"] + (
        ["v1alpha1.DRAResourceHealth"] if health_service else []
    )
    assert list(info.supported_versions) == expected


async def test_the_server_stopping_ends_open_streams(board: HealthBoard, short_tmp: Path) -> None:
    """With the end of the stream, not a silence until the client's deadline."""
    service = DeviceHealthService(board, pool=POOL, devices=device_names(GPUS), resend_interval=3600)
    socket = short_tmp / "dra.sock"
    async with trio_asyncio.open_loop():
        async with trio.open_nursery() as nursery:
            await nursery.start(_serve, [service], socket)
            s = Stream(socket)
            await s.next()
            nursery.cancel_scope.cancel()
        assert service.open_streams == 0
        try:
            with trio.fail_after(WAIT_S):
                rest = await trio.to_thread.run_sync(list, s.call)
        finally:
            s.close()
        assert rest == []
        assert s.call.code() == grpc.StatusCode.OK  # type: ignore[attr-defined]

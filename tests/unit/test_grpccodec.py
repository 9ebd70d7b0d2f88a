"""vgpud.grpccodec: malformed requests get INVALID_ARGUMENT, never reach the handler, and the server lives on.

End to end: a grpclib `Server(..., codec=StrictProtoCodec())` on a unix socket inside trio-asyncio,
called by grpcio (an independent gRPC stack) with raw bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from tests.stdproto import message_class
from vgpud._pb.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1
from vgpud.grpccodec import StrictProtoCodec

CHECK = "/grpc.health.v1.Health/Check"


class _Serving(HealthBase):
    """Always SERVING; remembers which services it was asked about."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def check(self, message: HealthCheckRequest) -> HealthCheckResponse:
        self.asked.append(message.service)
        return HealthCheckResponse(status=HealthCheckResponseServingStatus.SERVING)


def test_decode_valid_returns_the_message() -> None:
    request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid="u", name="n")])
    codec = StrictProtoCodec()
    data = codec.encode(request, v1.NodePrepareResourcesRequest)
    assert codec.decode(data, v1.NodePrepareResourcesRequest) == request
    assert codec.__content_subtype__ == "proto"


def test_decode_malformed_is_invalid_argument_with_the_reason() -> None:
    with pytest.raises(GRPCError) as info:
        StrictProtoCodec().decode(b"\x0a\x05ab", v1.NodePrepareResourcesRequest)
    assert info.value.status == Status.INVALID_ARGUMENT
    assert info.value.message == (
        "malformed NodePrepareResourcesRequest: NodePrepareResourcesRequest.claims[0]: "
        "length 5 runs past the end: 2 bytes left (offset 2 of 4)"
    )


@pytest.fixture
async def health_socket(short_tmp: Path) -> AsyncIterator[tuple[Path, _Serving]]:
    """A grpclib server with the strict codec, serving `_Serving` on a unix socket."""
    path = short_tmp / "h.sock"
    service = _Serving()
    async with trio_asyncio.open_loop():
        server = Server([service], codec=StrictProtoCodec())
        await trio_asyncio.aio_as_trio(server.start)(path=str(path))
        try:
            yield path, service
        finally:
            server.close()
            with trio.move_on_after(2):
                await trio_asyncio.aio_as_trio(server.wait_closed)()


async def _call_raw(path: Path, request: bytes) -> bytes:
    """One unary Check with raw request bytes through grpcio, in a worker thread (grpcio blocks)."""

    def blocking() -> bytes:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            raw: Callable[..., Any] = channel.unary_unary(
                CHECK, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            return raw(request, timeout=10)

    return await trio.to_thread.run_sync(blocking)


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (
            b"\x0a\x05ab",
            "HealthCheckRequest.service: length 5 runs past the end: 2 bytes left (offset 2 of 4)",
        ),
        (b"\xff\xff\xff\xff", "HealthCheckRequest: tag varint runs past the end (offset 0 of 4)"),
        (
            b"\x0a\x01\xff",
            "HealthCheckRequest.service: invalid UTF-8 in string: invalid start byte (offset 2 of 3)",
        ),
        (
            b"\x08\x01",
            "HealthCheckRequest.service: wire type 0, but string needs wire type 2 (offset 1 of 2)",
        ),
    ],
)
async def test_server_refuses_malformed_and_keeps_serving(
    health_socket: tuple[Path, _Serving], garbage: bytes, reason: str
) -> None:
    path, service = health_socket
    with pytest.raises(grpc.RpcError) as info:
        await _call_raw(path, garbage)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == f"malformed HealthCheckRequest: {reason}"
    assert service.asked == [], "a malformed request never reaches the handler"

    valid = message_class("grpc.health.v1.HealthCheckRequest")(service="liveness").SerializeToString()
    reply = message_class("grpc.health.v1.HealthCheckResponse").FromString(await _call_raw(path, valid))
    assert reply.status == HealthCheckResponseServingStatus.SERVING
    assert service.asked == ["liveness"]

"""A grpcio client of vgpud's hot-plug API (classes from protoc: an independent gRPC stack), for the
unit and e2e tests: what device-mounter would send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from tests.stdproto import message_class

SERVICE = "/vgpud.hotplug.v1.HotPlug/"


def call(socket: Path, method: str, timeout: float = 10, **fields: str) -> tuple[grpc.StatusCode, str, Any]:
    """One call on a fresh channel: (code, details, the response or None)."""
    request, response = (message_class(f"vgpud.hotplug.v1.{method}{k}") for k in ("Request", "Response"))
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = channel.unary_unary(
            SERVICE + method,
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        try:
            return grpc.StatusCode.OK, "", stub(request(**fields), timeout=timeout)
        except grpc.RpcError as err:
            return err.code(), err.details() or "", None

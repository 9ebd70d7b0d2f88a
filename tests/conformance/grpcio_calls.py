"""Blocking grpcio calls of the kubelet's side on vgpud's unix sockets (an independent gRPC stack)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from tests.stdproto import message_class

WATCH_RESOURCES = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
GET_INFO = "/pluginregistration.Registration/GetInfo"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


def watch_resources(socket: Path, timeout: float = 10) -> Iterator[Any]:
    """The kubelet's device-health stream on the DRA `socket`: its NodeWatchResourcesResponses."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_stream(
            WATCH_RESOURCES,
            request_serializer=_serialize,
            response_deserializer=message_class("v1alpha1.NodeWatchResourcesResponse").FromString,
        )
        yield from call(message_class("v1alpha1.NodeWatchResourcesRequest")(), timeout=timeout)


def get_info(socket: Path, timeout: float = 10) -> Any:
    """The registration service's PluginInfo on `socket`."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(
            GET_INFO,
            request_serializer=_serialize,
            response_deserializer=message_class("pluginregistration.PluginInfo").FromString,
        )
        return call(message_class("pluginregistration.InfoRequest")(), timeout=timeout)

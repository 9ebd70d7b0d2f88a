"""CreateContainer's request and reply bytes through protobuf's C codec (upb), not betterproto2.

CreateContainer is on the runtime's synchronous path of every container. betterproto2 0.10 spends
about 110 us parsing a typical request and about 210 us encoding the reply of one injection (5 mounts,
5 env), more than the rest of the hook together; upb needs about 1 us and 15 us (`make protos`
generates the upb module beside the betterproto2 code, as for Synchronize, `vgpud.nri.sync`).

Decoding keeps vgpud's rules: `vgpud.wire.check_message` walks the bytes first (strict wire types,
UTF-8, lengths), and only bytes that pass reach upb. The hook gets upb's message, which has the same
field names as betterproto2's (it reads `pod` and `container` fields only).

Encoding takes the betterproto2 reply the hook returns. Only the shape the hook builds (an adjustment
of mounts and env, nothing else) goes through upb; any other reply is encoded by betterproto2, so the
bytes are always what `bytes(reply)` gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import betterproto2

from vgpud._pb import nri_api_pb2
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ContainerAdjustment,
    CreateContainerRequest,
    CreateContainerResponse,
)
from vgpud.wire import check_message

_UpbRequest = nri_api_pb2.CreateContainerRequest  # type: ignore[attr-defined]
_UpbResponse = nri_api_pb2.CreateContainerResponse  # type: ignore[attr-defined]
_UpbAdjustment = nri_api_pb2.ContainerAdjustment  # type: ignore[attr-defined]
_UpbMount = nri_api_pb2.Mount  # type: ignore[attr-defined]
_UpbKeyValue = nri_api_pb2.KeyValue  # type: ignore[attr-defined]


def decode_create_container(data: bytes) -> CreateContainerRequest:
    """The request, checked strictly (MalformedMessage), as upb's message of the same fields."""
    check_message(data, CreateContainerRequest)
    return _UpbRequest.FromString(data)  # type: ignore[no-any-return]


def encode_create_container(reply: CreateContainerResponse) -> bytes:
    """`bytes(reply)`, through upb when the reply is an adjustment of mounts and env only."""
    adjust = reply.adjust
    if adjust is None or reply.update or reply.evict:
        return bytes(reply)
    if adjust != ContainerAdjustment(mounts=adjust.mounts, env=adjust.env):
        return bytes(reply)
    mounts = [
        _UpbMount(destination=m.destination, type=m.type, source=m.source, options=m.options)
        for m in adjust.mounts
    ]
    env = [_UpbKeyValue(key=kv.key, value=kv.value) for kv in adjust.env]
    return _UpbResponse(adjust=_UpbAdjustment(mounts=mounts, env=env)).SerializeToString()  # type: ignore[no-any-return]


def upb_decoder(message_type: type[betterproto2.Message]) -> Callable[[bytes], Any]:
    """A decoder like `decode_create_container` for another request: checked strictly against the
    betterproto2 type, returned as upb's message of the same name (lifecycle events the runtime waits
    for: PostStartContainer, StopContainer)."""
    upb_type = getattr(nri_api_pb2, message_type.__name__)

    def decode(data: bytes) -> Any:
        check_message(data, message_type)
        return upb_type.FromString(data)

    return decode

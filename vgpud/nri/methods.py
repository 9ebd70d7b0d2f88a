"""The NRI `Plugin` service's methods as the session dispatches them: for each, the decoder of its
request bytes, the hook that handles it and the encoder of its response.

Most requests are decoded strictly by betterproto2 (`vgpud.wire`); the hot ones by protobuf's C
decoder (Synchronize, CreateContainer, PostStartContainer, StopContainer: `vgpud.nri.sync`,
`vgpud.nri.fastcodec`). Events vgpud never subscribes to are answered empty, should a runtime send them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, NamedTuple

import betterproto2

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    Empty,
    PostCreateContainerRequest,
    PostCreateContainerResponse,
    PostStartContainerRequest,
    PostUpdateContainerRequest,
    PostUpdateContainerResponse,
    PostUpdatePodSandboxRequest,
    PostUpdatePodSandboxResponse,
    RemoveContainerRequest,
    RemovePodSandboxRequest,
    RunPodSandboxRequest,
    RunPodSandboxResponse,
    StartContainerRequest,
    StartContainerResponse,
    StateChangeEvent,
    StopContainerRequest,
    StopPodSandboxRequest,
    UpdateContainerRequest,
    UpdatePodSandboxRequest,
    UpdatePodSandboxResponse,
)
from vgpud.nri.fastcodec import decode_create_container, encode_create_container, upb_decoder
from vgpud.nri.hooks import NriHooks
from vgpud.nri.sync import decode_sync
from vgpud.wire import parse_strict

Handler = Callable[[Any], Awaitable[Any]]
#: request bytes -> the message a handler takes; MalformedMessage for bytes that are not one
Decoder = Callable[[bytes], Any]
#: a handler's response -> its bytes
Encoder = Callable[[Any], bytes]


class Method(NamedTuple):
    decode: Decoder
    handle: Handler
    encode: Encoder = bytes


def _strict(message_type: type[betterproto2.Message]) -> Decoder:
    return partial(parse_strict, message_type=message_type)


_NO_OP_EVENTS = (
    ("RunPodSandbox", RunPodSandboxRequest, RunPodSandboxResponse),
    ("UpdatePodSandbox", UpdatePodSandboxRequest, UpdatePodSandboxResponse),
    ("PostUpdatePodSandbox", PostUpdatePodSandboxRequest, PostUpdatePodSandboxResponse),
    ("PostCreateContainer", PostCreateContainerRequest, PostCreateContainerResponse),
    ("StartContainer", StartContainerRequest, StartContainerResponse),
    ("PostUpdateContainer", PostUpdateContainerRequest, PostUpdateContainerResponse),
)


def plugin_methods(hooks: NriHooks) -> dict[str, Method]:
    """Bare method name -> its Method, bound to `hooks` (read when a session starts)."""
    return {
        "Configure": Method(_strict(ConfigureRequest), hooks.configure),
        "Synchronize": Method(decode_sync, hooks.synchronize),
        "Shutdown": Method(_strict(Empty), hooks.shutdown),
        "CreateContainer": Method(decode_create_container, hooks.create_container, encode_create_container),
        "UpdateContainer": Method(_strict(UpdateContainerRequest), hooks.update_container),
        "PostStartContainer": Method(upb_decoder(PostStartContainerRequest), hooks.post_start_container),
        "StopContainer": Method(upb_decoder(StopContainerRequest), hooks.stop_container),
        "RemoveContainer": Method(_strict(RemoveContainerRequest), hooks.remove_container),
        "StopPodSandbox": Method(_strict(StopPodSandboxRequest), hooks.stop_pod_sandbox),
        "RemovePodSandbox": Method(_strict(RemovePodSandboxRequest), hooks.remove_pod_sandbox),
        "StateChange": Method(_strict(StateChangeEvent), hooks.state_change),
        **{name: Method(_strict(req), _acknowledge(response)) for name, req, response in _NO_OP_EVENTS},
    }


def _acknowledge(response: type[betterproto2.Message]) -> Handler:
    """A handler for an event vgpud does not act on: an empty reply (never subscribed, but harmless)."""

    async def handler(request: Any) -> betterproto2.Message:
        return response()

    return handler

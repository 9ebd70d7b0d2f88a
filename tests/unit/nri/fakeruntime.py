"""A small NRI runtime side in Python, for fast session tests and virtual-time reconnect tests.

It is built from vgpud's own codecs, so it proves the session logic, not interoperability: that is
the Go harness's job (tests/conformance/test_nri_go.py, the real containerd/nri adaptation).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from pathlib import Path

import betterproto2
import trio

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    ConfigureResponse,
    Container,
    ContainerAdjustment,
    Empty,
    PodSandbox,
    RegisterPluginRequest,
    SynchronizeRequest,
    SynchronizeResponse,
    UpdateContainersRequest,
    UpdateContainersResponse,
)
from vgpud.nri import mux, ttrpc
from vgpud.nri.adjust import adjustment
from vgpud.nri.envs import env_value
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import ENV_CLAIM_UID
from vgpud.partition.lazy import LazyAssigner

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"

#: what the runtime answers an UpdateContainers: a response, an error status, or None: no answer
UpdateReply = Callable[[UpdateContainersRequest], UpdateContainersResponse | ttrpc.TtrpcError | None]


class RuntimeConnection:
    """One accepted plugin connection: we serve Runtime on conn 2 and call Plugin on conn 1."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.registered: RegisterPluginRequest | None = None
        self._mux = mux.MuxDecoder()
        self._server = ttrpc.ServerConnection()
        self._client = ttrpc.ClientConnection()
        self._replies: dict[int, trio.MemorySendChannel[ttrpc.Reply]] = {}
        self._registered = trio.Event()
        #: the plugin's UpdateContainers requests, as received
        self.updates: list[UpdateContainersRequest] = []
        #: how they are answered (default: success, nothing failed)
        self.update_reply: UpdateReply = lambda _request: UpdateContainersResponse()

    async def read(self) -> None:
        while data := await self.stream.receive_some(65536):
            for conn_id, chunk in self._mux.feed(data):
                if conn_id == mux.RUNTIME_CONN:
                    for request in self._server.receive(chunk):
                        assert isinstance(request, ttrpc.IncomingRequest), request
                        if request.method == "UpdateContainers":
                            await self._update(request)
                            continue
                        assert request.method == "RegisterPlugin", request.method
                        self.registered = RegisterPluginRequest.parse(request.payload)
                        await self._send(
                            mux.RUNTIME_CONN, self._server.respond(request.stream_id, bytes(Empty()))
                        )
                        self._registered.set()
                else:
                    for reply in self._client.receive(chunk):
                        await self._replies.pop(reply.stream_id).send(reply)

    async def _update(self, request: ttrpc.IncomingRequest) -> None:
        update = UpdateContainersRequest.parse(request.payload)
        self.updates.append(update)
        reply = self.update_reply(update)
        if isinstance(reply, ttrpc.TtrpcError):
            await self._send(
                mux.RUNTIME_CONN, self._server.fail(request.stream_id, reply.code, reply.message)
            )
        elif reply is not None:
            await self._send(mux.RUNTIME_CONN, self._server.respond(request.stream_id, bytes(reply)))

    async def _send(self, conn_id: int, message: bytes) -> None:
        await self.stream.send_all(b"".join(mux.encode(conn_id, message)))

    async def call(self, method: str, message: betterproto2.Message, reply_type: type, timeout: float = 2.0):  # noqa: ASYNC109
        """A Plugin call as the runtime makes it; TtrpcError when the plugin answers with an error."""
        stream_id, data = self._client.request(
            PLUGIN, method, bytes(message), timeout_nano=int(timeout * 1e9)
        )
        send, receive = trio.open_memory_channel[ttrpc.Reply](1)
        self._replies[stream_id] = send
        await self._send(mux.PLUGIN_CONN, data)
        reply = await receive.receive()
        if reply.error is not None:
            raise reply.error
        return reply_type.parse(reply.payload)

    async def handshake(
        self, sync: SynchronizeRequest | None = None, **configure: object
    ) -> ConfigureResponse:
        """Registration, Configure and Synchronize, in the order containerd does them."""
        await self._registered.wait()
        response = await self.call(
            "Configure", ConfigureRequest(runtime_name="fake", **configure), ConfigureResponse
        )
        await self.call("Synchronize", sync or SynchronizeRequest(), SynchronizeResponse)
        return response


@asynccontextmanager
async def fake_runtime(socket_path: Path) -> AsyncIterator[trio.MemoryReceiveChannel[RuntimeConnection]]:
    """Listen on `socket_path`; each plugin that connects arrives on the channel, already being read."""
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(socket_path))
    listener.listen()
    send, receive = trio.open_memory_channel[RuntimeConnection](8)
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            listeners = [trio.SocketListener(listener)]
            async with listeners[0]:
                while True:
                    stream = await listeners[0].accept()
                    connection = RuntimeConnection(stream)
                    nursery.start_soon(_read_until_closed, connection)
                    await send.send(connection)

        nursery.start_soon(accept)
        yield receive
        nursery.cancel_scope.cancel()


async def _read_until_closed(connection: RuntimeConnection) -> None:
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await connection.read()


def adjusted(container: Container, adjust: ContainerAdjustment | None) -> Container:
    """The container as a runtime reports it (Synchronize) after applying a plugin's adjustment:
    the adjustment's mounts added, its env set over the container's own."""
    if adjust is None:
        return container
    keys = {kv.key for kv in adjust.env}
    env = [item for item in container.env if item.split("=", 1)[0] not in keys]
    env += [f"{kv.key}={kv.value}" for kv in adjust.env]
    return replace(container, env=env, mounts=[*container.mounts, *adjust.mounts])


def injected(assigner: LazyAssigner, pod: PodSandbox, container: Container) -> Container:
    """`container` of `pod` with the injection vgpud gives it (its claim UID from its env)."""
    context = ContainerContext(
        env_value(container.env, ENV_CLAIM_UID), pod.uid, pod.name, pod.namespace, container.name
    )
    return adjusted(container, adjustment(assigner.inject(context)))

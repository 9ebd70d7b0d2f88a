"""The async iterator both KubeApi implementations hand out from `watch_resource_slices`."""

from __future__ import annotations

import trio

from vgpud.kube.api import KubeError, WatchEvent

#: what travels on a watch channel: events, or the error that broke the watch (then the channel ends)
WatchItem = WatchEvent | KubeError


class ChannelEvents:
    """Events in order; an error on the channel is raised from the iterator; channel end ends it."""

    def __init__(self, receive: trio.MemoryReceiveChannel[WatchItem]) -> None:
        self._receive = receive

    def __aiter__(self) -> ChannelEvents:
        return self

    async def __anext__(self) -> WatchEvent:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if isinstance(item, KubeError):
            raise item
        return item

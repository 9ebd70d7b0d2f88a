"""Keeps the claim index's reservations current: a watch of the ResourceClaims (all namespaces).

The NRI plugin injects a container only for a pod its claim is reserved for, and must not ask the
API on the hook's path. Prepare records the `reservedFor` it saw; a pod that joins a shared claim
later is not prepared again by the kubelet, so this watch tells the index. Only claims this node has
prepared are kept (their reserved pod UIDs, nothing else). Each session lists after the watch is
open (no change falls between), and a prepared claim missing from the list is gone: no pod may join
it any more. The session ends when the watch does; the caller (the supervisor) starts the next.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from vgpud.dra.claimindex import ClaimIndex, reserved_pod_uids
from vgpud.kube import KubeApi
from vgpud.kube.api import WatchEventType

log = logging.getLogger("vgpud.dra")

#: at least this long between two watch starts, so a watch that ends at once cannot spin
WATCH_MIN_INTERVAL = 1.0


class ClaimWatch:
    def __init__(self, kube: KubeApi, index: ClaimIndex) -> None:
        self._kube = kube
        self._index = index
        #: complete list-and-watch sessions started (for the debug state and tests)
        self.sessions = 0

    async def run(self, ready: Callable[[], None]) -> None:
        """Supervised component: ready after the first list; returns never (raises KubeError)."""
        first = True
        while True:
            started = trio.current_time()
            async with self._kube.watch_resource_claims() as events:
                listed = await self._kube.list_resource_claims()
                seen = set()
                for obj in listed:
                    seen.add(self._apply(obj))
                for uid in self._index.prepared_claim_uids() - seen:
                    self._index.set_reserved(uid, ())
                self.sessions += 1
                if first:
                    first = False
                    log.info("claim watch: %d claims listed", len(listed))
                    ready()
                async for event in events:
                    if event.type is WatchEventType.DELETED:
                        uid = (event.object.get("metadata") or {}).get("uid")
                        if isinstance(uid, str):
                            self._index.set_reserved(uid, ())
                    else:
                        self._apply(event.object)
            await trio.sleep_until(started + WATCH_MIN_INTERVAL)

    def _apply(self, obj: dict[str, Any]) -> str:
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return ""
        self._index.set_reserved(uid, reserved_pod_uids(obj.get("status") or {}))
        return uid

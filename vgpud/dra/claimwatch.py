"""Keeps the claim index's reservations current from the node's claim cache, and keeps every claim
this node has prepared in that cache.

The NRI plugin injects a container only for a pod its claim is reserved for, and must not ask the
API on the hook's path. Prepare records the `reservedFor` it saw; a pod that joins a shared claim
later is not prepared again by the kubelet, so the claim cache's changes tell the index. Only claims
this node has prepared are kept (their reserved pod UIDs, nothing else).

The cache watches only the claims that carry this node's label (`vgpud.dra.claimlabel`), which
Prepare writes. So a prepared claim can be missing from it for two reasons: it is gone, or it lacks
the label (prepared by a vgpud from before the label, or a user removed it). Either way no pod may
join it until it is known again: its reservations are cleared at once, and `run` reads the claim
(one GET): gone (or another claim under its name) stays cleared; alive, its `reservedFor` counts
again and it is labelled, so the watch carries it from then on. A label naming another node is left
alone (the claim was allocated there; the kubelet will unprepare it here).

`run` is the supervised component: the cache's own run, and the reads of the claims it misses (a
failed read fails the component, and the restart reads again; nothing is forgotten in between).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio

from vgpud import excgroup
from vgpud.dra.claimindex import ClaimIndex, reserved_pod_uids
from vgpud.kube import JsonObject, KubeApi
from vgpud.kube.api import Conflict, NotFound
from vgpud.kube.informer import Informer
from vgpud.ready import Ready

log = logging.getLogger("vgpud.dra")


class ClaimWatch:
    """Binds the claim cache's changes to the index (from construction on); `run` runs the cache and
    checks the prepared claims it misses."""

    def __init__(self, claims: Informer, index: ClaimIndex, kube: KubeApi, labels: Mapping[str, str]) -> None:
        self._claims = claims
        self._index = index
        self._kube = kube
        self._labels = dict(labels)
        #: prepared claims (by UID) the cache lacks, to read from the API; insertion order
        self._missing: dict[str, None] = {}
        self._wake = trio.Event()
        #: claims read because the cache lacked them, and those labelled (debug state, tests)
        self.reads = 0
        self.labelled = 0
        claims.handlers.append(self._changed)
        claims.list_handlers.append(self._listed)

    @property
    def missing(self) -> frozenset[str]:
        """Prepared claims the cache lacks that are not read yet."""
        return frozenset(self._missing)

    async def run(self, ready: Ready) -> None:
        with excgroup.single_error_unwrapped():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._check_missing)
                await self._claims.run(ready)

    # -- the cache's changes --------------------------------------------------------------------------

    def _changed(self, old: JsonObject | None, new: JsonObject | None) -> None:
        if new is not None:
            self._reserve(new)
        elif old is not None:
            self._lost(_uid(old))

    def _listed(self) -> None:
        """Every prepared claim as the list says, as a watch may have missed a change."""
        for uid in self._index.prepared_claim_uids():
            obj = self._claims.by_uid(uid)
            if obj is None:
                self._lost(uid)
            else:
                self._reserve(obj)

    def _reserve(self, obj: JsonObject) -> None:
        uid = _uid(obj)
        if uid:
            self._missing.pop(uid, None)
            self._index.set_reserved(uid, reserved_pod_uids(obj.get("status") or {}))

    def _lost(self, uid: str) -> None:
        """Not in the cache (deleted, or no longer labelled): no pod joins it until it is read."""
        if uid not in self._index.prepared_claim_uids():
            return
        self._index.set_reserved(uid, ())
        self._missing[uid] = None
        self._wake.set()

    # -- the reads --------------------------------------------------------------------------------

    async def _check_missing(self) -> None:
        while True:
            while self._missing:
                uid = next(iter(self._missing))
                del self._missing[uid]
                try:
                    await self._check(uid)
                except BaseException:
                    self._missing.setdefault(uid, None)  # read again after the restart
                    raise
            self._wake = trio.Event()
            await self._wake.wait()

    async def _check(self, uid: str) -> None:
        """Read one missing claim: gone stays cleared; alive counts again (and gets the label)."""
        ref = self._index.prepared_claim(uid)
        if ref is None or self._claims.by_uid(uid) is not None:
            return  # unprepared meanwhile, or the watch brought it back
        self.reads += 1
        try:
            obj = await self._kube.get_resource_claim(ref.namespace, ref.name)
        except NotFound:
            return
        if _uid(obj) != uid or self._claims.by_uid(uid) is not None:
            return
        self._index.set_reserved(uid, reserved_pod_uids(obj.get("status") or {}))
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if any(key in labels for key in self._labels):
            if not self._labels.items() <= labels.items():
                log.info(
                    "claim %s/%s (%s) is labelled for another node: %s", ref.namespace, ref.name, uid, labels
                )
            return
        try:
            await self._kube.patch_resource_claim_metadata(
                ref.namespace, ref.name, uid=uid, labels=self._labels
            )
        except (NotFound, Conflict):
            self._index.set_reserved(uid, ())  # deleted (or replaced) since the read
            return
        self.labelled += 1
        log.info("claim %s/%s (%s) labelled for this node's claim cache", ref.namespace, ref.name, uid)


def _uid(obj: JsonObject) -> str:
    uid = (obj.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""

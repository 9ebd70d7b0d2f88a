"""Keeps the claim index's reservations current from the claim cache (a watch of every ResourceClaim).

The NRI plugin injects a container only for a pod its claim is reserved for, and must not ask the
API on the hook's path. Prepare records the `reservedFor` it saw; a pod that joins a shared claim
later is not prepared again by the kubelet, so the claim cache's changes tell the index. Only claims
this node has prepared are kept (their reserved pod UIDs, nothing else). After every complete list,
a prepared claim missing from the cache is gone: no pod may join it any more. The cache
(`vgpud.kube.informer`) is the supervised component; it is the same one the registry reads.
"""

from __future__ import annotations

from vgpud.dra.claimindex import ClaimIndex, reserved_pod_uids
from vgpud.kube import JsonObject
from vgpud.kube.informer import Informer


class ClaimWatch:
    """Binds the claim cache's changes to the index (from construction on)."""

    def __init__(self, claims: Informer, index: ClaimIndex) -> None:
        self._claims = claims
        self._index = index
        claims.handlers.append(self._changed)
        claims.list_handlers.append(self._listed)

    def _changed(self, old: JsonObject | None, new: JsonObject | None) -> None:
        if new is None:
            assert old is not None
            self._reserve(old, deleted=True)
        else:
            self._reserve(new, deleted=False)

    def _listed(self) -> None:
        """Every prepared claim as the list says (missing: gone), as a watch may have missed one."""
        for uid in self._index.prepared_claim_uids():
            obj = self._claims.by_uid(uid)
            if obj is None:
                self._index.set_reserved(uid, ())
            else:
                self._reserve(obj, deleted=False)

    def _reserve(self, obj: JsonObject, *, deleted: bool) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        if isinstance(uid, str):
            self._index.set_reserved(uid, () if deleted else reserved_pod_uids(obj.get("status") or {}))

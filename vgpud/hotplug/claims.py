"""The slave pod's side of an attachment: its vGPU claims prepared on this node, from the claim index."""

from __future__ import annotations

from vgpud.dra.claimindex import ClaimIndex
from vgpud.hotplug.rules import SlaveClaim


def slave_claims(index: ClaimIndex, pod_uid: str) -> list[SlaveClaim]:
    """Every vGPU claim in PrepareCompleted on this node whose reservedFor (as the claim watch last saw
    it, else as Prepare recorded it) names `pod_uid`, sorted. A few dict lookups per prepared claim."""
    found = []
    for uid in index.vgpu_claim_namespaces():
        reserved = index.reserved_pods(uid)
        ref = index.prepared_claim(uid)
        if pod_uid in reserved and ref is not None:
            found.append(SlaveClaim(ref.namespace, ref.name, uid, index.prepared_devices(uid), reserved))
    return sorted(found)

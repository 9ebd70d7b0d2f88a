"""A `ClaimAdmission` for NRI tests that do not run a DRA driver: a predicate on (claim UID,
namespace) decides, every pod of an admitted claim is reserved, and the guard is a real lock.
The real one, `vgpud.dra.claimindex.ClaimIndex`, is tested in tests/unit/dra and end to end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from vgpud.partition.admission import Admission, Verdict


class StaticAdmission:
    def __init__(self, prepared: Callable[[str, str], bool]) -> None:
        self._prepared = prepared
        self._lock = trio.Lock()

    def check(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        if self._prepared(claim_uid, namespace):
            return Admission(Verdict.INJECT)
        return Admission(
            Verdict.UNPREPARED,
            f"claim {claim_uid} is not a vGPU claim of namespace {namespace} prepared on this node",
        )

    async def admit(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        return self.check(claim_uid, namespace, pod_uid)

    @asynccontextmanager
    async def guard(self, claim_uid: str) -> AsyncIterator[None]:
        async with self._lock:
            yield

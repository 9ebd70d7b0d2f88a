"""Whether the NRI plugin may inject a container into a claim: the verdict and who gives it.

The NRI plugin asks; the DRA side (`vgpud.dra.claimindex.ClaimIndex`) answers from what it holds in
memory (the checkpoint and a watch of the claims), never from an API call on the hook's path.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Verdict(StrEnum):
    #: a vGPU claim prepared here, lazily, reserved for this pod: inject
    INJECT = "inject"
    #: no vGPU claim of the pod's namespace prepared on this node (a forged or stale claim UID)
    UNPREPARED = "unprepared"
    #: prepared here, but its reservedFor does not name this pod (another pod's claim)
    NOT_RESERVED = "not-reserved"
    #: prepared in eager mode: its CDI spec already carries the partition mounts (a mode mismatch)
    OTHER_MODE = "other-mode"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    #: why not, for the log and the recorded call ("" when injecting)
    reason: str = ""

    @property
    def inject(self) -> bool:
        return self.verdict is Verdict.INJECT


class ClaimAdmission(Protocol):
    def check(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        """The verdict from what is known now (Synchronize, removal hooks)."""
        ...

    async def admit(self, claim_uid: str, namespace: str, pod_uid: str) -> Admission:
        """CreateContainer's verdict: like `check`, but a pod not (yet) in the claim's reservedFor
        gets a short wait for the claim watch to catch up (bounded, well inside the hook deadline)."""
        ...

    def guard(self, claim_uid: str) -> AbstractAsyncContextManager[None]:
        """Held across admission and directory creation; Unprepare removes the claim under it, so a
        container is never given a directory of a claim that is being unprepared."""
        ...

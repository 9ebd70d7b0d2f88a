"""The drift self-check: do the vGPU containers the runtime reported, the directories on disk and the
checkpoint still agree? Differences are logged and counted, never fixed (DESIGN §5): a fix guessed
from a disagreement could delete the directory of a running container.

`compare` is pure (every rule below is one branch of it); `confirmed` keeps only what two consecutive
checks both found, because a hook in flight legitimately disagrees for a moment (CreateContainer makes
the directory before it records the container injected; RemoveContainer drops the record before the
directory goes).

Kinds (NRI: only with the NRI plugin and after its first Synchronize):

    runtime-not-cached       the runtime runs a container of a prepared vGPU claim of its
                             own namespace that vgpud did not inject                          NRI
    not-injected             the runtime reported a valid vGPU container without the mounts
                             and env vgpud intended (created while vgpud was away)             NRI
    directory-missing        an injected container's directory is not on disk                 NRI
    orphan-directory         a directory under `claims/<uid>/` no live container owns         NRI
    orphan-claim-directory   `claims/<uid>` of a claim the checkpoint does not hold prepared  always
    claim-directory-missing  a prepared vGPU claim without `claims/<uid>`                     always

The runtime's view is the last Synchronize plus the CreateContainer and removal events since (the
node's container store, `vgpud.containers`: one record per instance says both what the runtime
reported and what vgpud injected, so the two cannot name different claims or different containers),
keyed by container ID; the subject of a container difference is
`<pod UID>/<container> <ID>`. In eager mode the same periodic pass counts partition conflicts (bug-2): the
containers that now use requests Prepare put into different partitions (read from the API, only for
claims with more than one partition).
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import trio

from vgpud.containers.record import Injection, NodeContainer

if TYPE_CHECKING:
    from vgpud.containers.store import ContainerStore
    from vgpud.dra.driver import DraDriver

log = logging.getLogger("vgpud.observe.drift")

DEFAULT_INTERVAL = 60.0
#: differences logged one by one per check; beyond that only the count
LOGGED_PER_CHECK = 20


class DriftKind(enum.StrEnum):
    RUNTIME_NOT_CACHED = "runtime-not-cached"
    NOT_INJECTED = "not-injected"
    DIRECTORY_MISSING = "directory-missing"
    ORPHAN_DIRECTORY = "orphan-directory"
    ORPHAN_CLAIM_DIRECTORY = "orphan-claim-directory"
    CLAIM_DIRECTORY_MISSING = "claim-directory-missing"


@dataclass(frozen=True, order=True)
class Difference:
    kind: DriftKind
    #: what disagrees: `<pod UID>/<container>`, a directory, or a claim UID
    subject: str
    detail: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[DriftKind, str]:
        return self.kind, self.subject

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "subject": self.subject, "detail": self.detail}


@dataclass(frozen=True)
class DiskState:
    """What is under `claims/`: claim directory names, and (lazy) every directory one level below."""

    claim_dirs: frozenset[str] = frozenset()
    container_dirs: frozenset[PurePosixPath] = frozenset()


@dataclass(frozen=True)
class NriView:
    """The NRI side of one check; None in a check when the node runs without NRI."""

    #: the containers with a vGPU claim UID in their env (every injection state)
    containers: Sequence[NodeContainer]
    #: the store has been rebuilt by a Synchronize (before that the NRI rules do not apply)
    synced: bool
    #: compare the directories below claim directories (lazy mode: one per container)
    lazy: bool = True


def compare(
    *,
    nri: NriView | None,
    disk: DiskState,
    prepared: frozenset[str],
    vgpu_claims: Mapping[str, str],
) -> list[Difference]:
    """Every disagreement between the vGPU containers, the disk and the checkpoint, sorted.
    `vgpu_claims`: the prepared vGPU claims -> their namespace (only a pod of that namespace gets one)."""
    found: list[Difference] = []
    for claim in sorted(disk.claim_dirs - prepared):
        found.append(Difference(DriftKind.ORPHAN_CLAIM_DIRECTORY, claim, "not a prepared claim"))
    for claim in sorted(vgpu_claims.keys() - disk.claim_dirs):
        found.append(Difference(DriftKind.CLAIM_DIRECTORY_MISSING, claim, "prepared vGPU claim"))
    if nri is not None and nri.synced:
        found.extend(_compare_nri(nri, disk, vgpu_claims))
    return sorted(found)


def _subject(pod_uid: str, container: str, container_id: str) -> str:
    return f"{pod_uid}/{container} {container_id}"


def _compare_nri(nri: NriView, disk: DiskState, vgpu_claims: Mapping[str, str]) -> Iterable[Difference]:
    owned: set[PurePosixPath] = set()
    for c in nri.containers:
        subject = _subject(c.pod_uid, c.name, c.container_id)
        if c.injection is Injection.INJECTED:
            if nri.lazy and c.directory not in disk.container_dirs:
                yield Difference(DriftKind.DIRECTORY_MISSING, subject, str(c.directory))
        elif c.injection is Injection.MISSING:
            yield Difference(
                DriftKind.NOT_INJECTED,
                subject,
                f"{c.pod_namespace}/{c.pod_name}, claim {c.claim_uid}, missing {', '.join(c.missing)}",
            )
        elif vgpu_claims.get(c.claim_uid) == c.pod_namespace:
            where = f"{c.pod_namespace}/{c.pod_name}" if c.pod_name else "pod ?"
            yield Difference(DriftKind.RUNTIME_NOT_CACHED, subject, f"{where}, claim {c.claim_uid}")
        if c.directory is not None:
            owned.add(c.directory)
    if nri.lazy:
        for directory in sorted(disk.container_dirs - owned):
            yield Difference(DriftKind.ORPHAN_DIRECTORY, str(directory), "no live container owns it")


def confirmed(previous: Iterable[Difference], current: Iterable[Difference]) -> list[Difference]:
    """The current differences that the previous check found too (by kind and subject)."""
    seen = {d.key for d in previous}
    return [d for d in current if d.key in seen]


def scan_disk(claims_dir: Path, *, containers: bool) -> DiskState:
    """Blocking: the claim directories under `claims_dir` and, with `containers`, their subdirectories.
    A directory that vanishes while being listed is skipped (a hook removed it)."""
    claim_dirs: set[str] = set()
    container_dirs: set[PurePosixPath] = set()
    for claim in _subdirectories(claims_dir):
        claim_dirs.add(claim.name)
        if containers:
            container_dirs.update(PurePosixPath(sub) for sub in _subdirectories(claim))
    return DiskState(frozenset(claim_dirs), frozenset(container_dirs))


def _subdirectories(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


@dataclass(frozen=True)
class DriftStatus:
    """What the debug state and the metrics show."""

    interval: float
    checks: int = 0
    #: wall clock of the last completed check
    last_check: float | None = None
    #: the last check's confirmed differences
    differences: tuple[Difference, ...] = ()
    #: confirmed differences per kind, summed over every check
    detected: Mapping[str, int] = field(default_factory=dict)
    #: partition conflicts the last check found (eager mode; None when not checked)
    conflicts: int | None = None
    last_error: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "interval_seconds": self.interval,
            "checks": self.checks,
            "last_check": self.last_check,
            "differences": [d.to_dict() for d in self.differences],
            "detected": dict(self.detected),
            "partition_conflicts": self.conflicts,
            "last_error": self.last_error,
        }


class DriftChecker:
    """The supervised component: a check every `interval` seconds (the first after one interval, when
    the NRI plugin has had its first Synchronize)."""

    def __init__(
        self,
        claims_dir: Path,
        driver: DraDriver,
        containers: ContainerStore | None,
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        """`driver`: its prepared claims, and (eager mode) the claims' partitions; `containers`: the NRI
        plugin's store (None in eager mode)."""
        if interval <= 0:
            raise ValueError(f"drift interval must be > 0, got {interval}")
        self._claims_dir = claims_dir
        self._driver = driver
        self._containers = containers
        self._interval = interval
        self._previous: list[Difference] = []
        self._reported: set[tuple[DriftKind, str]] = set()
        self._conflicts: set[tuple[str, str]] = set()
        self._detected: Counter[str] = Counter()
        self._status = DriftStatus(interval)

    def status(self) -> DriftStatus:
        return self._status

    async def run(self, ready: Callable[[], None]) -> None:
        ready()
        while True:
            await trio.sleep(self._interval)
            await self.check()

    async def check(self) -> DriftStatus:
        """One pass: compare, confirm, log what changed, count; the new status."""
        store, index = self._containers, self._driver.index
        lazy = store is not None
        disk = await trio.to_thread.run_sync(lambda: scan_disk(self._claims_dir, containers=lazy))
        # everything else is read right after the disk, on the Trio thread, with no await between
        nri = NriView(store.select(), synced=store.synced) if store is not None else None
        current = compare(
            nri=nri,
            disk=disk,
            prepared=index.prepared_claim_uids(),
            vgpu_claims=index.vgpu_claim_namespaces(),
        )
        found = confirmed(self._previous, current)
        self._previous = current
        self._log_changes(found)
        self._detected.update(d.kind.value for d in found)
        conflicts, error = await self._partition_conflicts() if not lazy else (None, "")
        self._status = DriftStatus(
            self._interval,
            checks=self._status.checks + 1,
            last_check=time.time(),
            differences=tuple(found),
            detected=dict(self._detected),
            conflicts=conflicts,
            last_error=error,
        )
        return self._status

    def _log_changes(self, found: list[Difference]) -> None:
        keys = {d.key for d in found}
        new = [d for d in found if d.key not in self._reported]
        for d in new[:LOGGED_PER_CHECK]:
            log.warning("drift: %s %s (%s); not fixed", d.kind.value, d.subject, d.detail)
        if len(new) > LOGGED_PER_CHECK:
            log.warning("drift: %d more differences (see vgpud debug state)", len(new) - LOGGED_PER_CHECK)
        gone = self._reported - keys
        if gone:
            log.info("drift: %d earlier difference(s) no longer found", len(gone))
        self._reported = keys

    async def _partition_conflicts(self) -> tuple[int, str]:
        """Eager mode: the containers that now use more than one partition of one claim."""
        found = await self._driver.claim_partitions(min_partitions=2)
        errors = [f"claim {c.claim.namespace}/{c.claim.name}: {c.error}" for c in found if c.error]
        current = {}
        for claim in found:
            for conflict in claim.conflicts:
                current[(claim.claim.uid, conflict.container.node)] = conflict.reason
        for key in current.keys() - self._conflicts:
            log.warning("partition conflict: claim %s: %s", key[0], current[key])
        self._conflicts = set(current)
        return len(current), "; ".join(errors)

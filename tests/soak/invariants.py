"""The soak's invariants: pure functions over a `Snapshot` (snapshot.py collects one from the node).

- Every running vGPU container of the soak has its directory, holding the registration target
  (`config/pids.config`, what vgpu-register writes); NRI track: the NRI cache entry of that directory
  lists the container; eager track: one of its claim's partitions lists it. A container the runtime
  created without vgpud's injection (vgpud down or not yet registered with NRI) is *reported* instead:
  vgpud lists it in `nri.not_injected`, as docs/decisions.md says it must ("Containers without their
  injection are reported, not evicted").
- No claim directory, CDI spec or checkpoint entry without a claim that a pod still needs, and on the
  NRI track no container directory whose pod is gone. A checkpoint entry still PrepareStarted (vgpud
  killed mid-Prepare) whose claim is gone is *pending*: vgpud's cleanup rolls it back at its next start
  or within its cleanup interval (vgpud/dra/cleanup.py), so the runner checks it after a restart.
- vgpud's health is SERVING.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

SERVING = 1
PREPARE_STARTED = "PrepareStarted"
PIDS_TARGET = "config/pids.config"


@dataclass(frozen=True)
class Container:
    """A running container of a soak pod that references a vGPU claim."""

    namespace: str
    pod: str
    pod_uid: str
    name: str
    container_id: str
    claim_uid: str

    def describe(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.name} ({self.container_id[:12]})"


@dataclass
class Snapshot:
    """What the invariants look at, read at one moment."""

    #: "lazy" (NRI track) or "eager"; "" when vgpud's debug state could not be read
    mode: str
    #: vgpud's gRPC health status (1 = SERVING), None when it did not answer
    health: int | None
    running: list[Container] = field(default_factory=list)
    #: UIDs of every pod in the API (any namespace, any phase)
    pod_uids: set[str] = field(default_factory=set)
    #: UIDs of the claims a pod in the API references or that are reserved for one
    needed_claims: set[str] = field(default_factory=set)
    #: claim UID -> the paths under its claim directory that hold `config/pids.config`, relative to it
    claim_dirs: dict[str, set[str]] = field(default_factory=dict)
    cdi_specs: set[str] = field(default_factory=set)
    #: claim UID -> checkpoint state
    checkpoint: dict[str, str] = field(default_factory=dict)
    #: NRI cache: directory (relative to the claims dir) -> container IDs
    nri_cache: dict[str, set[str]] = field(default_factory=dict)
    not_injected: set[str] = field(default_factory=set)
    #: eager partitions: directory (relative to the claims dir) -> container node names
    partitions: dict[str, set[str]] = field(default_factory=dict)
    #: why the debug state was not read ("" when it was)
    state_error: str = ""


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    #: containers vgpud reports as not injected (documented, counted, not a violation)
    reported: list[str] = field(default_factory=list)
    #: PrepareStarted checkpoint entries of gone claims, left to vgpud's cleanup
    pending: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def check(snap: Snapshot) -> Verdict:
    verdict = Verdict()
    if snap.health != SERVING:
        verdict.violations.append(f"vgpud health is {snap.health} (not SERVING)")
    if snap.state_error:
        verdict.violations.append(f"vgpud's debug state unreadable: {snap.state_error}")
        return verdict
    check_running(snap, verdict)
    check_leftovers(snap, verdict)
    return verdict


def container_dir(claim_uid: str, pod_uid: str, container: str) -> str:
    """The NRI track's per-container directory, relative to the claims dir (vgpud/partition/layout.py)."""
    return f"{claim_uid}/{pod_uid}_{container}"


def partition_node(pod_uid: str, container: str) -> str:
    """How the eager partitions name an app container (`<pod UID>/<init|app>/<name>`)."""
    return f"{pod_uid}/app/{container}"


def check_running(snap: Snapshot, verdict: Verdict) -> None:
    """Every running vGPU container has its directory, registration target and cache/partition entry."""
    for c in snap.running:
        if c.container_id in snap.not_injected:
            verdict.reported.append(f"{c.describe()}: created without vgpud's injection (nri.not_injected)")
            continue
        if snap.mode == "lazy":
            rel = container_dir(c.claim_uid, c.pod_uid, c.name)
            dirs = {rel} if c.container_id in snap.nri_cache.get(rel, set()) else set()
            if not dirs:
                verdict.violations.append(f"{c.describe()}: no NRI cache entry {rel} lists it")
        else:
            node = partition_node(c.pod_uid, c.name)
            dirs = {
                d
                for d, members in snap.partitions.items()
                if node in members and d.startswith(f"{c.claim_uid}/")
            }
            if not dirs:
                verdict.violations.append(f"{c.describe()}: in no partition of claim {c.claim_uid}")
        for rel in sorted(dirs):
            sub = rel.split("/", 1)[1]
            if sub not in snap.claim_dirs.get(c.claim_uid, set()):
                verdict.violations.append(f"{c.describe()}: directory {rel} or its {PIDS_TARGET} is missing")


def check_leftovers(snap: Snapshot, verdict: Verdict) -> None:
    """Nothing on disk or in the checkpoint for a claim (or, NRI track, a pod) that is gone."""
    for uid in sorted(set(snap.claim_dirs) - snap.needed_claims):
        verdict.violations.append(f"claim directory {uid} left without a claim that needs it")
    for uid in sorted(snap.cdi_specs - snap.needed_claims):
        verdict.violations.append(f"CDI spec of claim {uid} left without a claim that needs it")
    for uid, state in sorted(snap.checkpoint.items()):
        if uid in snap.needed_claims:
            continue
        if state == PREPARE_STARTED:
            verdict.pending.append(f"checkpoint entry {uid} ({state}) awaits vgpud's cleanup")
        else:
            verdict.violations.append(f"checkpoint entry {uid} ({state}) left without a claim that needs it")
    if snap.mode != "lazy":
        return
    for uid, subs in sorted(snap.claim_dirs.items()):
        for sub in sorted(subs):
            pod_uid = sub.split("_", 1)[0]
            if pod_uid not in snap.pod_uids:
                verdict.violations.append(f"container directory {uid}/{sub} left after its pod is gone")
    for rel, ids in sorted(snap.nri_cache.items()):
        pod_uid = rel.split("/", 1)[-1].split("_", 1)[0]
        if pod_uid not in snap.pod_uids:
            verdict.violations.append(
                f"NRI cache entry {rel} ({len(ids)} containers) left after its pod is gone"
            )


# --------------------------------------------------------------------------------------------------
# Resource growth


@dataclass(frozen=True)
class Growth:
    name: str
    first: float
    last: float
    #: the allowed growth: absolute and/or relative to the first quarter's median
    allow_abs: float
    allow_rel: float

    @property
    def limit(self) -> float:
        return self.first + self.allow_abs + self.first * self.allow_rel

    @property
    def ok(self) -> bool:
        return self.last <= self.limit


#: the growth bound: last-quarter median vs first-quarter median
FD_ALLOW = 8
RSS_ALLOW = 0.30


def quarters(samples: list[float]) -> tuple[float, float]:
    """Median of the first and of the last quarter (at least one sample each)."""
    if not samples:
        raise ValueError("no samples")
    q = max(1, len(samples) // 4)
    return statistics.median(samples[:q]), statistics.median(samples[-q:])


def growth(fds: list[float], rss_kib: list[float]) -> list[Growth]:
    fd_first, fd_last = quarters(fds)
    rss_first, rss_last = quarters(rss_kib)
    return [
        Growth("open fds", fd_first, fd_last, FD_ALLOW, 0.0),
        Growth("RSS KiB", rss_first, rss_last, 0.0, RSS_ALLOW),
    ]


def growth_table(rows: list[Growth]) -> str:
    lines = [f"{'':10} {'first-q median':>15} {'last-q median':>14} {'limit':>10}  verdict"]
    for g in rows:
        verdict = "ok" if g.ok else "GROWN"
        lines.append(f"{g.name:10} {g.first:15.0f} {g.last:14.0f} {g.limit:10.0f}  {verdict}")
    return "\n".join(lines)

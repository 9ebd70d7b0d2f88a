"""The soak loop: each step, then the invariants (polled to a deadline: vgpud cleans up and re-syncs
asynchronously), then a sample of vgpud's fds and RSS; at the end every soak pod and claim deleted, a
vgpud restart (its cleanup pass runs at start) and a strict check. A failure names the seed, the step
and the replay command."""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.e2e import workload as w
from tests.e2e.node import LocalNode
from tests.kubeapi import log_tail
from tests.soak import invariants, ops
from tests.soak.invariants import Verdict
from tests.soak.plan import Step, plan
from tests.soak.snapshot import collect, resources

#: how long the invariants may take to hold after a step (re-sync after a restart, cleanup after a delete)
SETTLE_S = 60.0


class SoakFailure(AssertionError):
    pass


@dataclass
class Result:
    seed: int
    n: int
    track: str
    steps: list[tuple[Step, str, float]] = field(default_factory=list)
    fds: list[float] = field(default_factory=list)
    rss_kib: list[float] = field(default_factory=list)
    #: each container vgpud reported as not injected -> the step after which it was first seen
    reported: dict[str, str] = field(default_factory=dict)
    pending_seen: int = 0
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    vgpud_starts: int = 1
    elapsed: float = 0.0

    def growth(self) -> list[invariants.Growth]:
        return invariants.growth(self.fds, self.rss_kib)

    def report(self) -> str:
        kinds = Counter(step.name for step, _, _ in self.steps)
        skipped = Counter(step.name for step, outcome, _ in self.steps if outcome.startswith("skipped"))
        lines = [
            f"soak: {len(self.steps)} steps, seed {self.seed}, {self.track} track, {self.elapsed:.0f} s; "
            f"vgpud started {self.vgpud_starts} times",
            "  operation                 runs  skipped  seconds",
        ]
        for kind in sorted(kinds):
            took = sum(t for step, _, t in self.steps if step.name == kind)
            lines.append(f"  {kind:24} {kinds[kind]:5} {skipped[kind]:8} {took:8.1f}")
        if self.recoveries:
            worst = max(self.recoveries, key=lambda r: r[1])
            lines.append(
                f"  recovery to SERVING: {len(self.recoveries)} faults, slowest {worst[1]:.1f} s ({worst[0]})"
            )
        lines.append(f"  invariants: held after every step; {self.pending_seen} checks saw a cleanup pending")
        if self.reported:
            lines.append(f"  reported by vgpud (not a violation): {len(self.reported)} containers")
        for what, where in self.reported.items():
            lines.append(f"    {what} (first seen after {where})")
        lines.append("  vgpud resources (last-quarter vs first-quarter median of one sample per step):")
        lines += [f"    {line}" for line in invariants.growth_table(self.growth()).splitlines()]
        return "\n".join(lines)


def settle(node: LocalNode, namespace: str, deadline: float, *, strict: bool = False) -> Verdict:
    """Poll the invariants until they hold (and, `strict`, nothing is pending) or the deadline passes."""
    while True:
        verdict = invariants.check(collect(node, namespace))
        if verdict.ok and not (strict and verdict.pending):
            return verdict
        if time.monotonic() > deadline:
            return verdict
        time.sleep(0.5)


def _fail(result: Result, step: str, why: str, node: LocalNode) -> SoakFailure:
    replay = f"SOAK_SEED={result.seed} SOAK_N={result.n} SOAK_TRACK={result.track} make soak"
    return SoakFailure(
        f"soak FAILED at {step} (seed {result.seed}):\n{why}\nreplay: {replay}\n"
        f"--- vgpud log tail:\n{log_tail(node.vgpud_log())}"
    )


def _judge(result: Result, verdict: Verdict, where: str, node: LocalNode) -> None:
    if verdict.violations:
        raise _fail(
            result, where, "invariants broken:\n  " + "\n  ".join(verdict.violations + verdict.pending), node
        )
    for line in verdict.reported:
        result.reported.setdefault(line, where)
    result.pending_seen += bool(verdict.pending)


def run_soak(
    node: LocalNode, seed: int, n: int, *, track: str, exclude: frozenset[str] = frozenset(), log: bool = True
) -> Result:
    """`n` seeded steps on a running node; raises SoakFailure at the first broken invariant."""
    started = time.monotonic()
    result = Result(seed=seed, n=n, track=track)
    soak = ops.Soak(node, w.namespace(node, "soak"))
    for step in plan(seed, n, exclude):
        began = time.monotonic()
        try:
            outcome = ops.OPS[step.name](soak, step)
        except AssertionError as err:
            raise _fail(result, step.describe(), str(err), node) from None
        except RuntimeError as err:  # LocalNode's own waits (a daemon not back in time)
            raise _fail(result, step.describe(), str(err), node) from None
        took = time.monotonic() - began
        _judge(result, settle(node, soak.namespace, time.monotonic() + SETTLE_S), step.describe(), node)
        fds, rss = resources(node.procs["vgpud"].pid)
        result.fds.append(fds)
        result.rss_kib.append(rss)
        result.steps.append((step, outcome, took))
        if log:
            print(
                f"[{step.index:3}] {step.name:22} {took:6.1f} s  fds {fds:3} "
                f"rss {rss // 1024:4} MiB  {outcome}",
                flush=True,
            )
    ops.drain(soak)
    _judge(result, settle(node, soak.namespace, time.monotonic() + SETTLE_S), "the end (pods deleted)", node)
    # a PrepareStarted entry of a gone claim waits for vgpud's cleanup pass, which runs at each start
    ops.restart_vgpud(soak, signal.SIGTERM)
    verdict = settle(node, soak.namespace, time.monotonic() + SETTLE_S, strict=True)
    if verdict.pending:
        verdict.violations += verdict.pending
    _judge(result, verdict, "the end (after vgpud's cleanup pass)", node)
    result.recoveries, result.vgpud_starts = soak.recoveries, soak.vgpud_starts
    result.elapsed = time.monotonic() - started
    bad = [g for g in result.growth() if not g.ok]
    if bad:
        raise _fail(result, "the end", "resource growth:\n" + invariants.growth_table(result.growth()), node)
    return result

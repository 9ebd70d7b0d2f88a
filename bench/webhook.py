"""Webhook: how the rules scale with a pod's size, and whether a large review holds up a small one.

Decision time: `rules.check_pod` over a pod of N init and N app containers that all use both
requests of one claim template (every init container shares with every app: the shape that was
quadratic, issue 21), for N = 1 (the reference: the same shape, smallest), 1,000 and 2,000; the
median of --rounds runs each. Each prints its time, its ratio to the reference and the ratio per
container (1.0 is linear). The goal: 2,000 + 2,000 in under 100 ms.

Concurrency: the Admitter decides a 2,000 + 2,000 pod of a named claim in a namespace of 2,000 pods
of 50 containers (rule 4 reads them all) while small reviews are decided one after another; the small
reviews' latency (p50, p99, max) alone and while the large one runs, for the rules in a worker thread
(the webhook's `CpuLane`) and, to compare, for every step on the event loop.

Exits 1 when a decision is wrong (a violation count, the summary, a small review denied).

    .venv/bin/python bench/webhook.py [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests import objects as o
from tests.unit.webhook.builders import POLICY, FakeLookup, review, spec_claim, template
from vgpud.webhook.admit import Admitter
from vgpud.webhook.cpu import INLINE_BODY_BYTES, CpuLane
from vgpud.webhook.review import parse_review
from vgpud.webhook.rules import check_pod
from vgpud.webhook.violations import Rule, summary

GOAL_MS = 100.0
SIZES = (1, 1000, 2000)
TEMPLATES = {"gpu-template": template("gpu-template", o.exactly("r0"), o.exactly("r1"))}
CLAIM = spec_claim("gpu-claim", o.exactly("r0"), o.exactly("r1"))
T = TypeVar("T")


def shared_pod(n: int, **kwargs: Any) -> dict[str, Any]:
    """N init and N app containers, every one using every request of the pod's claim "gpu"."""
    return o.pod(
        "shared",
        o.POD1_UID,
        containers=[o.container(f"a{k}", o.ref("gpu")) for k in range(n)],
        init=[o.container(f"i{k}", o.ref("gpu")) for k in range(n)],
        **kwargs,
    )


def expected_wrongs(n: int, violations: list[Any]) -> list[str]:
    """What is wrong with the violations of `shared_pod(n)` (2 requests): [] when right."""
    rules = [v.rule for v in violations]
    want = {Rule.ONE_APP_PER_REQUEST: 2 * (n - 1), Rule.INIT_SHARES_WITH_ONE_APP: n if n > 1 else 0}
    wrong = [
        f"{n}+{n}: {count} {rule} violations, expected {want[rule]}"
        for rule in want
        if (count := rules.count(rule)) != want[rule]
    ]
    if len(rules) != sum(want.values()):
        wrong.append(f"{n}+{n}: {len(rules)} violations, expected {sum(want.values())}")
    if n > 5 and not summary(violations).endswith(f"; and {len(rules) - 5} more"):
        wrong.append(f"{n}+{n}: the summary does not end with the count of the rest")
    return wrong


def timed(rounds: int, step: Callable[[], T]) -> tuple[float, T]:
    """The median seconds of `rounds` calls, and the last result."""
    times, result = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - started)
    assert result is not None
    return statistics.median(times), result


@dataclass
class Scaling:
    seconds: dict[int, float]
    wrong: list[str]


def scaling(rounds: int) -> Scaling:
    seconds: dict[int, float] = {}
    wrong: list[str] = []
    for n in SIZES:
        pod = shared_pod(n, templates={"gpu": None})
        elapsed, violations = timed(
            rounds if n > 1 else 200 * rounds, partial(check_pod, pod, {}, TEMPLATES, [], POLICY)
        )
        seconds[n] = elapsed
        wrong += expected_wrongs(n, violations)
    return Scaling(seconds, wrong)


class OnTheLoop(CpuLane):
    """Every step inline, whatever its size: the webhook without worker threads, to compare."""

    async def run(self, large: bool, step: Callable[..., T], *args: object) -> T:
        return step(*args)


class Listed(FakeLookup):
    """`listed_at`: when the crowded namespace's pods were listed (the large review's rules start).
    Its pods are kept by namespace, so a list costs the bench nothing that the webhook would not
    pay (the FakeLookup's own list filters every pod it holds)."""

    listed_at = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_namespace: dict[str, list[Any]] = {}
        for pod in self.pods:
            self._by_namespace.setdefault(pod["metadata"]["namespace"], []).append(pod)

    async def list_pods(self, namespace: str) -> list[Any]:
        await self._enter("pods", namespace)
        pods = self._by_namespace.get(namespace, [])
        if pods:
            self.listed_at = time.perf_counter()
        return pods


@dataclass
class Concurrency:
    alone: list[float]
    during: list[float]
    large: float
    wrong: list[str]


async def concurrency(lane: CpuLane, small_reviews: int) -> Concurrency:
    crowd = [
        o.pod(
            f"p{k}", f"00000000-0000-4000-8000-{k:012d}", containers=[o.container(f"c{j}") for j in range(50)]
        )
        for k in range(2000)
    ]
    lookup = Listed({"gpu-claim": CLAIM}, pods=crowd)
    admitter = Admitter(lookup, POLICY, cpu=lane)
    small_body = json.dumps(
        review(
            o.pod("small", o.POD2_UID, containers=[o.container("a", o.ref("gpu", "r0"))], namespace="quiet")
        )
    ).encode()
    large_body = json.dumps(review(shared_pod(2000))).encode()
    wrong: list[str] = []

    async def small() -> tuple[float, float]:
        """One small review: (when it started, when it was answered)."""
        started = time.perf_counter()
        decision = await admitter.decide(parse_review(small_body))
        if not decision.allowed:
            wrong.append(f"a small review was denied: {decision.message}")
        return started, time.perf_counter()

    alone = [end - start for start, end in [await small() for _ in range(small_reviews)]]
    answered: list[tuple[float, float]] = []
    large_answered = 0.0

    async def large(done: trio.Event) -> None:
        nonlocal large_answered
        # as the server reads a body: a large one in a worker thread (cpu.py)
        request = await lane.run(len(large_body) > INLINE_BODY_BYTES, parse_review, large_body)
        decision = await admitter.decide(request)
        large_answered = time.perf_counter()
        if decision.allowed or decision.code != 403:
            wrong.append(f"the large review: {decision}")
        done.set()

    async def smalls(done: trio.Event) -> None:
        while not done.is_set():
            answered.append(await small())

    async with trio.open_nursery() as nursery:
        done = trio.Event()
        nursery.start_soon(smalls, done)
        await trio.sleep(0.05)  # small reviews are flowing (the bench measures, it does not assert)
        nursery.start_soon(large, done)
    large_started = lookup.listed_at
    during = [end - start for start, end in answered if end > large_started and start < large_answered]
    large_seconds = large_answered - large_started
    return Concurrency(alone, during, large_seconds, wrong)


def ms(seconds: float) -> float:
    return seconds * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs per pod size, median taken (default 5)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"webhook bench: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    scale = scaling(args.rounds)
    reference = scale.seconds[1]
    print(f"\n{'pod (init + app containers)':<30} {'decision':>12} {'vs 1 + 1':>10} {'per container':>14}")
    for n, seconds in scale.seconds.items():
        ratio = seconds / reference
        print(f"{f'{n} + {n}':<30} {ms(seconds):>10.3f}ms {ratio:>9.0f}x {ratio / n:>13.2f}x")

    lanes = {"worker thread": CpuLane(), "on the loop": OnTheLoop()}
    runs = {name: trio.run(concurrency, lane, 50) for name, lane in lanes.items()}
    print(f"\n{'small reviews (ms)':<44} {'p50':>8} {'p99':>8} {'max':>8} {'count':>6} {'large':>9}")
    for name, run in runs.items():
        for label, values in (("alone", run.alone), ("while a 2,000 + 2,000 pod", run.during)):
            if values:
                p50, p99, most = (ms(percentile(values, p)) for p in (50, 99, 100))
                print(
                    f"{f'{name}, {label}':<44} {p50:>8.2f} {p99:>8.2f} {most:>8.2f} {len(values):>6}", end=""
                )
            else:
                print(f"{f'{name}, {label}':<44} {'-':>8} {'-':>8} {'-':>8} {0:>6}", end="")
            print(f" {ms(run.large):>7.0f}ms" if label != "alone" else "")
    wrong = scale.wrong + [w for run in runs.values() for w in run.wrong]
    for line in wrong:
        print(f"FAILED: {line}", file=sys.stderr)
    threaded = runs["worker thread"]
    during_p99 = ms(percentile(threaded.during, 99)) if threaded.during else float("nan")
    alone_p99 = ms(percentile(threaded.alone, 99))
    big = scale.seconds[2000]
    emit(
        "webhook",
        [
            Figure(
                "rules, 2,000 + 2,000 pod",
                ms(big),
                "ms",
                reference="the same shape, 1 + 1",
                ratio=big / reference,
                goal=f"<= {GOAL_MS:.0f} ms",
                met=ms(big) <= GOAL_MS,
            ),
            Figure(
                "rules, 1,000 + 1,000 pod",
                ms(scale.seconds[1000]),
                "ms",
                reference="1 + 1",
                ratio=scale.seconds[1000] / reference,
            ),
            Figure(
                "small review p99 while a large one is decided",
                during_p99,
                "ms",
                reference="small review p99 alone",
                ratio=during_p99 / alone_p99,
            ),
        ],
        ok=not wrong,
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The soak's sequence of operations, drawn from the seed alone.

Each step is an operation name and the seeded numbers it needs (which pod or container it picks, the
pod's shape, how long it waits before a kill): the executor maps `pick` onto whatever exists at that
step, so the same seed replays the same sequence. Every kind appears at least once when the sequence
is long enough for all of them: the weighted draw is topped up at seeded positions.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

#: operation name -> relative weight of the draw
WEIGHTS: dict[str, float] = {
    "create_pod": 5,
    "delete_pod": 7,
    "container_exit": 3,
    "kill_vgpud": 1,
    "term_vgpud": 1,
    "kill_vgpud_mid_create": 2,
    "term_vgpud_mid_create": 1,
    "restart_containerd": 1,
    "restart_kubelet": 1,
    "nri_outage": 0.4,
}
KINDS = tuple(WEIGHTS)
#: operations that take minutes (the NRI socket gone longer than vgpud's grace period)
SLOW = frozenset({"nri_outage"})
#: pod shapes: one container; two containers on one claim (one request each); two pods on one claim
SHAPES = ("single", "pair", "split")
#: the longest seeded wait between starting a pod and killing vgpud (mid-Prepare to mid-CreateContainer)
MAX_KILL_DELAY_S = 2.5


@dataclass(frozen=True)
class Step:
    index: int
    name: str
    #: in [0, 1): which existing pod or container the step acts on
    pick: float
    #: the shape of a pod it creates
    shape: str
    #: seconds between starting a pod and the kill (the *_mid_create steps)
    delay: float
    #: SIGKILL rather than SIGTERM (restart_kubelet)
    hard: bool

    def describe(self) -> str:
        return f"step {self.index} {self.name}"


def plan(seed: int, n: int, exclude: frozenset[str] = frozenset()) -> list[Step]:
    """`n` steps drawn from `seed`; the kinds in `exclude` never appear."""
    unknown = exclude - set(KINDS)
    if unknown:
        raise ValueError(
            f"no such soak operation: {', '.join(sorted(unknown))}; the kinds: {', '.join(KINDS)}"
        )
    if n < 0:
        raise ValueError(f"a soak of {n} steps")
    kinds = [k for k in KINDS if k not in exclude]
    if not kinds:
        raise ValueError("every soak operation excluded")
    rng = random.Random(seed)
    names = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds], k=n)
    if n >= len(kinds):
        _top_up(rng, names, kinds)
    return [
        Step(
            index=i,
            name=name,
            pick=rng.random(),
            shape=rng.choice(SHAPES),
            delay=round(rng.uniform(0.0, MAX_KILL_DELAY_S), 3),
            hard=rng.random() < 0.5,
        )
        for i, name in enumerate(names)
    ]


def _top_up(rng: random.Random, names: list[str], kinds: list[str]) -> None:
    """Put every kind the draw missed at a seeded position that holds a kind drawn more than once."""
    counts = Counter(names)
    for kind in kinds:
        if counts[kind]:
            continue
        spare = [i for i, name in enumerate(names) if counts[name] > 1]
        at = rng.choice(spare)
        counts[names[at]] -= 1
        names[at] = kind
        counts[kind] += 1

"""The short soak of `make test` (issue 19 item 4): 15 seeded operations on the session's node (both
tracks), the invariants after each (tests/soak). `make soak` is the long one; the NRI outage (minutes:
vgpud's health grace) is left to it."""

from __future__ import annotations

from tests.e2e.node import LocalNode
from tests.soak.plan import SLOW
from tests.soak.runner import run_soak

#: a seed whose 15 steps skip none (each acts on a pod) and make pods of all three shapes
SEED = 2
STEPS = 15


def test_short_soak(node: LocalNode) -> None:
    result = run_soak(node, SEED, STEPS, track="nri" if node.nri else "eager", exclude=SLOW)
    print(result.report())
    assert len(result.steps) == STEPS

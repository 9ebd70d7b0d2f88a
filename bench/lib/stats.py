"""The benches' one percentile, so every bench reports p50/p99 the same way."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], p: float) -> float:
    """The value at percentile `p` (0-100) of `values`: nearest rank over n-1 intervals."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

"""The benches' one percentile (bench/lib/stats.py)."""

from __future__ import annotations

import pytest

from bench.lib.stats import percentile


def test_nearest_rank_over_the_sorted_values() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 100..1, unsorted on purpose
    assert percentile(values, 0) == 1
    assert percentile(values, 50) == 51  # rank round(0.5 * 99) = 50 (0-based)
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7


def test_no_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)

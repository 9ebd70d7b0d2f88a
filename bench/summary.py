"""`make bench`'s closing table: every bench's key figures, their same-run reference and ratio, the goal.

Reads the JSON lines the benches appended (bench/lib/results.py) and names the benches in --ran that
wrote none (their own output above says what they measured). Exits 1 when a bench's correctness check
failed or a bench in --expect wrote no line.

    .venv/bin/python bench/summary.py RESULTS.jsonl [--ran NAME ...] [--expect NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.results import load


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{text} {unit}".strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument(
        "--ran",
        nargs="*",
        default=[],
        help="benches that ran (named when they wrote no line)",
    )
    parser.add_argument("--expect", nargs="*", default=[], help="benches that must have written a line")
    args = parser.parse_args()
    rows = load(args.results) if args.results.exists() else []
    print(f"{'bench':<12} {'figure':<44} {'value':>12} {'ratio':>7}  {'reference':<34} {'goal':<14} met")
    failed = []
    for row in rows:
        if not row.get("ok"):
            failed.append(f"{row['bench']}: its correctness check failed")
        for fig in row["figures"]:
            met = {True: "yes", False: "NO", None: ""}[fig.get("met")]
            ratio = "-" if fig.get("ratio") is None else f"{fig['ratio']:.2f}x"
            print(
                f"{row['bench']:<12} {fig['name']:<44} {_number(fig['value'], fig['unit']):>12} "
                f"{ratio:>7}  {fig.get('reference', ''):<34} {fig.get('goal', ''):<14} {met}"
            )
    seen = {row["bench"] for row in rows}
    for name in args.ran:
        if name not in seen:
            print(f"{name:<12} (no result line: its own table above)")
    failed += [f"{name}: wrote no result line" for name in args.expect if name not in seen]
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One JSON line per bench for `make bench`'s summary table (bench/summary.py prints it).

A bench calls `emit` once at its end with its key figures; the line goes to the file named by
$VGPUD_BENCH_RESULTS (the Makefile sets it; unset, nothing is written). Each figure carries its
value, the reference measured in the same run and their ratio, and the goal where the issue sets one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS_ENV = "VGPUD_BENCH_RESULTS"


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    #: what `value` is compared with, measured in the same run ("" when the figure has none)
    reference: str = ""
    ratio: float | None = None
    #: the goal as text ("<= 50 ms"); `met` says whether `value` (or `ratio`) meets it
    goal: str = ""
    met: bool | None = None


def emit(bench: str, figures: list[Figure], *, ok: bool) -> None:
    """Append the bench's line (`ok`: its correctness check passed) when $VGPUD_BENCH_RESULTS is set."""
    target = os.environ.get(RESULTS_ENV)
    if not target:
        return
    line = json.dumps({"bench": bench, "ok": ok, "figures": [asdict(f) for f in figures]})
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(line + "\n")


def load(path: Path) -> list[dict]:
    """The lines `emit` wrote, in order; ValueError naming the line that is not one."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("figures"), list):
                raise ValueError("not an object with a figures list")
        except ValueError as err:
            raise ValueError(f"{path}:{number}: not a bench result line: {err}") from None
        rows.append(row)
    return rows

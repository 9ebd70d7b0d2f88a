"""docs/observability.md lists every metric vgpud exposes, as vgpud.metrics_names declares it: a new or
renamed metric that the operator's reference does not show fails here."""

from __future__ import annotations

import re

from tests.support import REPO
from vgpud import metrics_names as names

DOC = REPO / "docs" / "observability.md"
BLOCK = re.compile(r"<!-- metrics-table:start -->\n(.*?)<!-- metrics-table:end -->", re.S)


def expected_rows() -> list[str]:
    return [f"| `{m.name}` | {', '.join(m.labels) if m.labels else '-'} | {m.help} |" for m in names.ALL]


def test_the_metrics_table_is_metrics_names() -> None:
    match = BLOCK.search(DOC.read_text())
    assert match, f"{DOC} has no metrics-table block"
    rows = [line for line in match.group(1).splitlines() if line.startswith("| `")]
    expected = expected_rows()
    assert rows == expected, (
        "docs/observability.md's metrics table is stale; its rows should be:\n" + "\n".join(expected)
    )

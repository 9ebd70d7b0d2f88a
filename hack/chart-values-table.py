"""Write the table of the chart's values into helm/vgpud/README.md, from values.yaml and its comments.

    .venv/bin/python hack/chart-values-table.py [--check] [--values FILE] [--readme FILE]

Every value is documented where it is set: the `# --` comment right above its key (helm-docs'
convention), continued by the comment lines below it up to the key. A map whose keys carry such
comments is documented key by key (`metrics.serviceMonitor.enabled`), a map without them and a list
are one row with their whole default. A key without a description is an error naming it, so a value
cannot be added undocumented. The table goes between the README's `<!-- values-table:start -->` and
`<!-- values-table:end -->` lines, in values.yaml's order: the same values give the same README.
`--check` writes nothing, prints the diff and exits 1 when the README is not what it would write.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

CHART = Path(__file__).resolve().parent.parent / "helm" / "vgpud"
START = "<!-- values-table:start -->"
END = "<!-- values-table:end -->"
#: defaults longer than this are cut, with "..." (values.yaml has them whole)
MAX_DEFAULT = 60
HEADER = "| key | type | default | description |\n|---|---|---|---|"

_DOC = re.compile(r"^#\s*--(\s|$)")
_CODE_SPAN = re.compile(r"(`[^`]*`)")


class ValuesDocError(ValueError):
    """values.yaml or the README cannot give a table: what is wrong, naming the key or the file."""


@dataclass(frozen=True)
class Row:
    """One line of the table: a value as the user sets it (dotted key), and what it is."""

    key: str
    type: str
    default: str
    description: str


def description(lines: list[str], line: int) -> str | None:
    """The `# --` comment of the key on `line` (0-based): the comment lines right above it, from the
    `# --` line on, joined into one line; None when there is none."""
    first = line
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    block = [text.strip() for text in lines[first:line]]
    starts = [n for n, text in enumerate(block) if _DOC.match(text)]
    if not starts:
        return None
    if len(starts) > 1:
        raise ValuesDocError(f"line {line + 1}: two `# --` comments above one key")
    words = [_DOC.sub("", block[starts[0]], count=1)] + [text[1:] for text in block[starts[0] + 1 :]]
    text = " ".join(" ".join(words).split())
    if not text:
        raise ValuesDocError(f"line {line + 1}: an empty `# --` comment")
    return text


def rows(values_yaml: str) -> list[Row]:
    """One row per documented value, in the file's order. ValuesDocError names every undocumented
    key, one per line."""
    lines = values_yaml.splitlines()
    root = yaml.compose(values_yaml, Loader=yaml.SafeLoader)
    if root is None:
        return []
    if not isinstance(root, MappingNode):
        raise ValuesDocError("values.yaml is not a map of values")
    found: list[Row] = []
    problems: list[str] = []
    _walk(root, "", lines, found, problems)
    if problems:
        raise ValuesDocError("\n".join(problems))
    return found


def _walk(node: MappingNode, prefix: str, lines: list[str], found: list[Row], problems: list[str]) -> None:
    for key_node, value_node in node.value:
        line = key_node.start_mark.line
        if not isinstance(key_node, ScalarNode):
            problems.append(f"line {line + 1}: a key that is not a scalar")
            continue
        key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
        try:
            doc = description(lines, line)
            inner = _documented_inside(value_node, lines)
        except ValuesDocError as err:
            problems.append(f"{key}: {err}")
            continue
        if inner is not None and isinstance(value_node, SequenceNode):
            problems.append(
                f"{key}: `# --` comments inside a list (line {inner + 1}): document the list as a whole, "
                "above its key"
            )
        elif inner is not None and isinstance(value_node, MappingNode):
            if doc is None:
                _walk(value_node, key, lines, found, problems)
            else:
                problems.append(
                    f"{key} has a `# --` comment and so do keys under it (line {inner + 1}): document "
                    "the map as a whole or each of its keys"
                )
        elif doc is None:
            where = (
                " (a map: above it, or above each of its keys)" if isinstance(value_node, MappingNode) else ""
            )
            problems.append(f"{key} (line {line + 1}) has no `# --` comment saying what it does{where}")
        else:
            value = _construct(value_node)
            found.append(Row(key, _type(value), _default(value), doc))


def _documented_inside(node: Node, lines: list[str]) -> int | None:
    """The line of the first key under `node` that has a `# --` comment; None when none has. A flow
    collection (`{a: 1}`, `[1]`) shares its lines with its parent: nothing in it has a comment."""
    if getattr(node, "flow_style", False):  # a collection's; a scalar has none
        return None
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if description(lines, key_node.start_mark.line) is not None:
                return int(key_node.start_mark.line)
            inner = _documented_inside(value_node, lines)
            if inner is not None:
                return inner
    elif isinstance(node, SequenceNode):
        for item in node.value:
            inner = _documented_inside(item, lines)
            if inner is not None:
                return inner
    return None


def _construct(node: Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _type(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "list")):
        if isinstance(value, kind):
            return name
    return "object"


def _default(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_DEFAULT else text[: MAX_DEFAULT - 3] + "..."


def table(found: list[Row]) -> str:
    """The markdown table: keys and defaults as code, `|` escaped, `<` and `>` outside code as entities
    (a renderer would take `<release>` for a tag)."""
    lines = [HEADER]
    for row in found:
        cells = (_code(row.key), row.type, _code(row.default), _prose(row.description))
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _prose(text: str) -> str:
    parts = _CODE_SPAN.split(text)
    return "".join(
        part if part.startswith("`") else part.replace("<", "&lt;").replace(">", "&gt;") for part in parts
    )


def with_table(readme: str, rendered: str) -> str:
    """`readme` with the table between the two marker lines replaced by `rendered`."""
    lines = readme.splitlines(keepends=True)
    marks = {mark: [n for n, line in enumerate(lines) if line.strip() == mark] for mark in (START, END)}
    if len(marks[START]) != 1 or len(marks[END]) != 1 or marks[START][0] > marks[END][0]:
        raise ValuesDocError(f"the README needs one {START} line and, after it, one {END} line")
    start, end = marks[START][0], marks[END][0]
    return "".join([*lines[: start + 1], rendered, "\n", *lines[end:]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when the README is stale")
    parser.add_argument("--values", type=Path, default=CHART / "values.yaml", help="the values file")
    parser.add_argument("--readme", type=Path, default=CHART / "README.md", help="the README to write")
    args = parser.parse_args(argv)
    try:
        current = args.readme.read_text()
        wanted = with_table(current, table(rows(args.values.read_text())))
    except (OSError, yaml.YAMLError, ValuesDocError) as err:
        for problem in str(err).splitlines():
            print(f"chart-values-table: error: {problem}", file=sys.stderr)
        return 2
    if wanted == current:
        return 0
    if args.check:
        name = _shown(args.readme)
        sys.stdout.writelines(
            difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), name, f"{name} (wanted)")
        )
        print(f"chart-values-table: {name} is out of date: run make chart-docs", file=sys.stderr)
        return 1
    args.readme.write_text(wanted)
    print(f"chart-values-table: wrote the values table of {_shown(args.readme)}")
    return 0


def _shown(path: Path) -> str:
    """`path` as a user in the repository names it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    raise SystemExit(main())

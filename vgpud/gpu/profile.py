"""The flat YAML subset that GPU profiles are written in.

Two readers share every profile: the mock backend (here) and the fake NVML library in C
(`csrc/fakenvml/fakenvml.c`), which has no YAML library. So a profile must stay inside this subset,
and this module rejects anything outside it even where PyYAML would cope. The grammar, line by line:

    (blank)                     empty or spaces only
    # text                      a comment line (any indentation)
    KEY: VALUE                  top-level scalar, at column 0
    gpus:                       the one list, at column 0, nothing (but a comment) after the colon
      - KEY: VALUE              starts a list item: exactly two spaces, "-", one space
        KEY: VALUE              continues the item: exactly four spaces

    KEY    [A-Za-z][A-Za-z0-9]*, followed by ":" and at least one space before VALUE
    VALUE  "text"   double-quoted printable ASCII without '"' or backslash
           'text'   single-quoted printable ASCII without "'"
           plain    [A-Za-z0-9] then [A-Za-z0-9 ._()+-]*; trailing spaces dropped
    A VALUE may be followed by spaces and a "# comment". No tabs, no flow style, no anchors, no
    multi-line scalars. A key appears once per mapping. Lines are at most 511 bytes.

Whether a VALUE is an integer or a string is the schema's business (`mock.py`); `mock.py` also checks
that PyYAML reads every value the same way, so a profile means one thing to every reader.

The keys (each shipped profile's header comment lists them too): top level driverVersion and
cudaDriverVersion; per GPU uuid, index, minor, productName, brand, architecture, memoryTotal, pciBusId
and computeCapability, and the optional numaNode, addressingMode and three MIG keys, flat like the rest:

    migMode: enabled            the MIG mode now: enabled or disabled (left out: disabled)
    migModePending: disabled    the mode after the GPU's next reset (left out: as migMode)
    migDevices: 3g.20gb 1g.5gb  with migMode enabled: its MIG devices' profiles, space-separated

Both readers refuse MIG keys on a GPU without MIG, migDevices without migMode enabled, a profile the
GPU does not offer and more than its 7 slices (the rules and the table: `migtable.py`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .model import GpuInventoryError

LIST_KEY = "gpus"
MAX_LINE_BYTES = 511

_KEY = r"(?P<key>[A-Za-z][A-Za-z0-9]*)"
_VALUE = r"""(?P<value>"[ !#-\[\]-~]*"|'[ -&(-~]*'|[A-Za-z0-9][A-Za-z0-9 ._()+-]*?)"""
_PAIR = re.compile(rf"{_KEY}:(?:[ ]+{_VALUE})?(?:[ ]+#.*)?[ ]*")
_ITEM_START = "  - "
_ITEM_CONTINUE = "    "


@dataclass(frozen=True)
class Scalar:
    """One VALUE as written, with where it was written (for error messages)."""

    text: str  # without the quotes
    quoted: bool
    line: int


@dataclass
class FlatDocument:
    """A parsed profile: top-level scalars and the items of the one list."""

    top: dict[str, Scalar] = field(default_factory=dict)
    items: list[dict[str, Scalar]] = field(default_factory=list)
    item_lines: list[int] = field(default_factory=list)
    list_line: int | None = None


def profile_error(source: Path | str, line: int, why: str) -> GpuInventoryError:
    """The one shape of a profile error: file, line, what is wrong."""
    return GpuInventoryError(f"profile {source}: line {line}: {why}")


def parse_flat_yaml(text: str, source: Path | str) -> FlatDocument:
    """Parse `text` (the contents of `source`) under the subset grammar, or raise GpuInventoryError."""
    doc = FlatDocument()
    in_list = False
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        fail = functools.partial(profile_error, source, number)
        if len(line.encode()) > MAX_LINE_BYTES:
            raise fail(f"line longer than {MAX_LINE_BYTES} bytes")
        stripped = line.strip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        if "\t" in line:
            raise fail("tab character (indent with spaces)")
        if line.startswith(_ITEM_START):
            if not in_list:
                raise fail(f"list item outside the {LIST_KEY!r} list")
            doc.items.append({})
            doc.item_lines.append(number)
            target, rest = doc.items[-1], line[len(_ITEM_START) :]
        elif line.startswith(_ITEM_CONTINUE) and not line.startswith(_ITEM_CONTINUE + " "):
            if not in_list or not doc.items:
                raise fail("indented line that continues no list item")
            target, rest = doc.items[-1], line[len(_ITEM_CONTINUE) :]
        elif line[0] != " ":
            in_list = False
            target, rest = doc.top, line
        else:
            raise fail(
                "unexpected indentation (top-level keys at column 0, list items as '  - key: value', "
                "their other keys indented by four spaces)"
            )
        match = _PAIR.fullmatch(rest)
        if match is None:
            raise fail(f"not a 'key: value' line in the profile subset: {rest!r}")
        key, value = match["key"], match["value"]
        if key in target or (target is doc.top and key == LIST_KEY and doc.list_line is not None):
            raise fail(f"duplicate key {key!r}")
        if target is doc.top and key == LIST_KEY:
            if value is not None:
                raise fail(f"{LIST_KEY!r} takes its items on the following lines, not a value")
            in_list, doc.list_line = True, number
            continue
        if value is None:
            raise fail(f"key {key!r} has no value")
        quoted = value[0] in "\"'"
        target[key] = Scalar(value[1:-1] if quoted else value, quoted, number)
    return doc


def render_flat_yaml(top: dict[str, str | int], items: list[dict[str, str | int | None]]) -> str:
    """Write a document in the subset (strings double-quoted, None values left out)."""

    def scalar(value: str | int) -> str:
        if isinstance(value, int):
            return str(value)
        if '"' in value or "\\" in value or not value.isascii() or not value.isprintable():
            raise ValueError(f"value {value!r} cannot be written in the profile subset")
        return f'"{value}"'

    lines = [f"{key}: {scalar(value)}" for key, value in top.items()]
    lines.append(f"{LIST_KEY}:")
    for item in items:
        pairs = [f"{key}: {scalar(value)}" for key, value in item.items() if value is not None]
        lines.append(_ITEM_START + pairs[0])
        lines.extend(_ITEM_CONTINUE + pair for pair in pairs[1:])
    return "\n".join(lines) + "\n"

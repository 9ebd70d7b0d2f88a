"""The README's Layout table checked against the tree, and the documents' links checked against the
repository, so neither can drift:

- every package under `vgpud/` (a directory with an `__init__.py`; of the generated `vgpud/_pb/`,
  only itself) has a row: a row's first cell names its paths in backticks;
- every tracked top-level directory (`git ls-files`) has a row, but those in `EXEMPT`;
- every path a row names exists: its own paths, and in its text each backticked token that looks like
  a path of this repository (`path_tokens`). A file name without a `/` is a name in the row's own
  directory (`hooks.py` in the row of `vgpud/nri/`); a token with a `/` (`node/`, `tests/fakedriver.py`)
  may also start at the root;
- in README.md, docs/*.md and every tracked Markdown file, each relative link leads to a file inside
  the repository, and nothing names the design documents that live outside it (`FOREIGN`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from tests.support import REPO, require

README = REPO / "README.md"
LAYOUT_HEADING = "## Layout"
#: tracked top-level directories that need no row, each with the reason (none today)
EXEMPT: dict[str, str] = {}
#: the endings of a backticked token that names a file of this repository (a token ending in `/`
#: names a directory); other tokens (`checkpoint.json`, `libvgpu-control.so`) are runtime names
SUFFIXES = (".py", ".md", ".sh", ".c", ".h", ".proto", ".yaml", ".toml")
#: what no document may name: the founding design and reference documents outside the repository
FOREIGN = ("../shared", "shared/reference/", "shared/seed/", "DESIGN.md")

_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")
_BACKTICKED = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Row:
    #: the paths of the first cell, as written (`vgpud/nri/`, `tests/unit`)
    paths: tuple[str, ...]
    #: the other cells
    text: str
    line: int


def parse_layout(markdown: str, heading: str = LAYOUT_HEADING) -> list[Row]:
    """The rows of the first table after `heading` (its header and separator rows left out)."""
    lines = markdown.splitlines()
    start = lines.index(heading)
    rows: list[Row] = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if not line.startswith("|"):
            if rows:
                break
            continue
        first, *rest = (cell.strip() for cell in _CELL_SEPARATOR.split(line.strip())[1:-1])
        if set(first) <= set("-: "):  # the separator row
            continue
        paths = tuple(_BACKTICKED.findall(first))
        if paths:  # the header row has none
            rows.append(Row(paths, " | ".join(rest), number))
    return rows


def path_tokens(text: str) -> list[str]:
    """The backticked tokens of `text` that name a path of this repository: no blank, not absolute
    or home- or variable-relative, no placeholder (`<uid>`, `*`), ending in `/` or in one of SUFFIXES."""
    return [
        token
        for token in _BACKTICKED.findall(text)
        if not re.search(r"[\s<>*{}$=~]", token)
        and not token.startswith("/")
        and (token.endswith("/") or token.endswith(SUFFIXES))
    ]


def missing_paths(rows: list[Row], root: Path) -> list[str]:
    """Every path a row names that is not in the tree under `root`."""
    report = []
    for row in rows:
        for path in row.paths:
            if not (root / path).exists():
                report.append(f"line {row.line}: the row's path `{path}` does not exist")
        for token in path_tokens(row.text):
            bases = [root / path for path in row.paths]
            if "/" in token:  # a directory, or a path with directories: it may start at the root
                bases.append(root)
            if not any((base / token).exists() for base in bases):
                where = " or ".join(f"{base.relative_to(root).as_posix() or '.'}/" for base in bases)
                report.append(f"line {row.line}: `{token}` is not in {where}")
    return report


def packages(root: Path) -> set[str]:
    """`vgpud/<...>/` for every directory under root/vgpud holding an `__init__.py` (not below `_pb`)."""
    found = set()
    for init in (root / "vgpud").rglob("__init__.py"):
        package = init.parent.relative_to(root)
        if "_pb" not in package.parts[:-1]:
            found.add(f"{package.as_posix()}/")
    return found


def _row_paths(rows: list[Row]) -> set[str]:
    return {path.rstrip("/") + "/" for row in rows for path in row.paths}


def missing_packages(rows: list[Row], found: set[str]) -> list[str]:
    named = _row_paths(rows)
    return [f"package {package} has no row" for package in sorted(found - named)]


def missing_top_level(rows: list[Row], directories: set[str], exempt: dict[str, str]) -> list[str]:
    named = {PurePosixPath(path).parts[0] for path in _row_paths(rows)}
    return [f"top-level directory {d}/ has no row" for d in sorted(directories - named - set(exempt))]


def bad_links(document: Path, root: Path) -> list[str]:
    """The relative links of a Markdown file that lead outside `root` or to nothing, and every
    mention of a document outside the repository."""
    text = document.read_text()
    name = document.relative_to(root).as_posix()
    report = [f"{name} names {foreign!r}" for foreign in FOREIGN if foreign in text]
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):  # a URL, or an anchor of its own
            continue
        path = (document.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(root.resolve()):
            report.append(f"{name} links to {target}, outside the repository")
        elif not path.exists():
            report.append(f"{name} links to {target}, which does not exist")
    return report


def tracked() -> list[str]:
    """Every tracked file of the repository, by `git ls-files`."""
    git = shutil.which("git")
    require(git is not None and (REPO / ".git").exists(), "a git checkout", "clone the repository")
    assert git is not None
    out = subprocess.run([git, "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


ROWS = parse_layout(README.read_text())


def test_the_table_is_found() -> None:
    assert len(ROWS) > 10
    assert any(row.paths == ("vgpud/",) for row in ROWS)


def test_every_package_has_a_row() -> None:
    wrong = missing_packages(ROWS, packages(REPO))
    assert not wrong, "\n".join(wrong)


def test_every_tracked_top_level_directory_has_a_row() -> None:
    directories = {path.split("/")[0] for path in tracked() if "/" in path}
    wrong = missing_top_level(ROWS, directories, EXEMPT)
    assert not wrong, "\n".join(wrong)


def test_every_path_the_table_names_exists() -> None:
    wrong = missing_paths(ROWS, REPO)
    assert not wrong, "\n".join(wrong)


def test_documents_link_only_inside_the_repository() -> None:
    documents = {README, *(REPO / "docs").glob("*.md")}
    documents |= {REPO / path for path in tracked() if path.endswith(".md")}
    wrong = [problem for document in sorted(documents) for problem in bad_links(document, REPO)]
    assert not wrong, "\n".join(wrong)


# --- the checks catch what they are for ---

_SYNTHETIC = """\
# x

## Layout

| path | what |
|---|---|
| `vgpud/` | `cli.py`, `nri/`, `gone.py`; no paths: `vgpud run`, `checkpoint.json`, `/etc/x/`, `<a>/b.py` |
| `vgpud/nri/` | `hooks.py`, `cli.py` (not in nri/), `vgpud/cli.py` (from the root), `docs/x.md` |
| `docs/`, `tests/unit` | `x.md`, `test_a.py` |

after the table: `lost.py`
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in (
        "vgpud/__init__.py",
        "vgpud/cli.py",
        "vgpud/nri/__init__.py",
        "vgpud/nri/hooks.py",
        "vgpud/hotplug/__init__.py",
        "vgpud/_pb/__init__.py",
        "vgpud/_pb/nri/__init__.py",
        "docs/x.md",
        "tests/unit/test_a.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    return tmp_path


def test_the_parser_reads_the_rows() -> None:
    rows = parse_layout(_SYNTHETIC)
    assert [(row.paths, row.line) for row in rows] == [
        (("vgpud/",), 7),
        (("vgpud/nri/",), 8),
        (("docs/", "tests/unit"), 9),
    ]
    assert path_tokens(rows[0].text) == ["cli.py", "nri/", "gone.py"]


def test_the_package_rule_catches_a_package_without_a_row(tree: Path) -> None:
    assert packages(tree) == {"vgpud/", "vgpud/nri/", "vgpud/hotplug/", "vgpud/_pb/"}
    assert missing_packages(parse_layout(_SYNTHETIC), packages(tree)) == [
        "package vgpud/_pb/ has no row",
        "package vgpud/hotplug/ has no row",
    ]


def test_the_path_rule_catches_a_missing_file(tree: Path) -> None:
    assert missing_paths(parse_layout(_SYNTHETIC), tree) == [
        "line 7: `gone.py` is not in vgpud/",
        "line 8: `cli.py` is not in vgpud/nri/",
    ]
    (tree / "docs").rename(tree / "doc")
    assert missing_paths(parse_layout(_SYNTHETIC), tree)[2:] == [
        "line 8: `docs/x.md` is not in vgpud/nri/ or ./",
        "line 9: the row's path `docs/` does not exist",
        "line 9: `x.md` is not in docs/ or tests/unit/",
    ]


def test_the_top_level_rule_catches_a_directory_without_a_row() -> None:
    rows = parse_layout(_SYNTHETIC)
    directories = {"vgpud", "docs", "tests", "hack", ".ci"}
    assert missing_top_level(rows, directories, {}) == [
        "top-level directory .ci/ has no row",
        "top-level directory hack/ has no row",
    ]
    assert missing_top_level(rows, directories, {".ci": "why", "hack": "why"}) == []


def test_the_link_rule_catches_links_out_of_the_repository(tree: Path) -> None:
    document = tree / "docs" / "y.md"
    document.write_text(
        "[ok](x.md) [ok](../vgpud/cli.py#L1) [anchor](#a) [web](https://example.com/a)\n"
        "[out](../../elsewhere.md) [gone](nothing.md) see ../shared/DESIGN.md\n"
    )
    assert bad_links(document, tree) == [
        "docs/y.md names '../shared'",
        "docs/y.md names 'DESIGN.md'",
        "docs/y.md links to ../../elsewhere.md, outside the repository",
        "docs/y.md links to nothing.md, which does not exist",
    ]

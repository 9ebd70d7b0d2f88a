"""The dependency rules, read from the source (AST) of every vgpud module:

- the components never import `vgpud.observe` (observe only reads them; the wiring in `daemon` and the
  `cli` are the two places that know both);
- `partition` (but `pidsfile`) and the sans-IO codecs import no I/O module;
- the private internals of grpclib, hypercorn and pynvml are named only in `vgpud/compat/`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "vgpud"
#: the wiring: the only modules outside observe/ that may import it
WIRING = {"vgpud.daemon", "vgpud.cli"}
PURE = {
    *(f"vgpud.partition.{m}" for m in ("assigner", "eager", "edits", "layout", "lazy", "model", "nrionly")),
    "vgpud.relaxations",
    "vgpud.wire",
    "vgpud.grpccodec",
    "vgpud.nri.ttrpc",
    "vgpud.nri.mux",
    "vgpud.gpu.healthrules",
    "vgpud.quantity",
    "vgpud.registry.cgroup",
    "vgpud.hotplug.rules",
    "vgpud.nvdriver.elfso",
    "vgpud.nvdriver.ldcache",
}
#: what else a pure module may import (prefix match): generated messages, the protobuf runtime,
#: grpclib's codec interface
PURE_MAY_IMPORT = (
    "vgpud._pb",
    "betterproto2",
    "grpclib.const",
    "grpclib.exceptions",
    "grpclib.encoding.",
)
#: standard-library modules without I/O that the pure modules use
STDLIB_PURE = {
    "__future__", "collections", "dataclasses", "enum", "typing", "re", "hashlib", "uuid", "struct",
    "functools", "itertools", "json", "fractions", "decimal", "math", "abc", "string", "base64",
    "operator", "types",
}  # fmt: skip
#: of `os` and `pathlib`, the pure names (`import os` is allowed for these only)
PURE_NAMES = {"os": {"fspath", "PathLike", "sep"}, "pathlib": {"PurePosixPath", "PurePath"}}
#: grpclib's public modules; any other grpclib module is an internal
GRPCLIB_PUBLIC = {
    "grpclib", "grpclib.client", "grpclib.server", "grpclib.const", "grpclib.exceptions",
    "grpclib.encoding.proto", "grpclib.encoding.base", "grpclib.metadata", "grpclib.events",
    "grpclib.health.check", "grpclib.health.service", "grpclib.reflection.service", "grpclib.utils",
}  # fmt: skip
#: private attributes reached on other libraries' objects (`self._server` is a class's own)
PRIVATE_ATTRIBUTES = {"_stream", "_server", "_transport", "nvmlLib", "libLoadLock"}


@dataclass(frozen=True)
class Import:
    module: str
    names: tuple[str, ...]
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "_pb" not in path.relative_to(PACKAGE).parts
    }


def imports(name: str, tree: ast.Module) -> Iterator[Import]:
    """Every import in the module, function-level ones included, relative ones resolved."""
    package = name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            yield Import(base, tuple(a.name for a in node.names), node.lineno)


MODULES = sources()


def test_every_module_is_read() -> None:
    assert {"vgpud.daemon", "vgpud.observe.serve", "vgpud.compat.grpclib"} <= set(MODULES)
    assert set(MODULES) >= PURE, PURE - set(MODULES)


def _observe_imports(name: str, tree: ast.Module) -> Iterator[str]:
    for imp in imports(name, tree):
        if imp.module.startswith("vgpud.observe") or (imp.module == "vgpud" and "observe" in imp.names):
            yield f"{name}:{imp.line} imports {imp.module}"


def test_components_never_import_observe() -> None:
    wrong = [
        use
        for name, tree in MODULES.items()
        if not name.startswith("vgpud.observe") and name not in WIRING
        for use in _observe_imports(name, tree)
    ]
    assert not wrong
    assert list(_observe_imports("vgpud.nri.hooks", ast.parse("from vgpud import observe")))
    assert list(_observe_imports("vgpud.dra.x", ast.parse("from ..observe.state import DebugState")))


def _io_imports(name: str, tree: ast.Module) -> Iterator[str]:
    for imp in imports(name, tree):
        top = imp.module.split(".")[0]
        where = f"{name}:{imp.line} imports"
        if top in PURE_NAMES:
            bare = set() if top == "os" else {top}  # `import os`: its attributes are checked below
            impure = set(imp.names) - PURE_NAMES[top] if imp.names else bare
            if impure:
                yield f"{where} {sorted(impure)} from {imp.module}"
        elif top in STDLIB_PURE or imp.module in PURE or imp.module.startswith(PURE_MAY_IMPORT):
            continue
        elif imp.module in ("vgpud", "vgpud.partition", "vgpud.nri"):  # `from vgpud.partition import x`
            impure = {n for n in imp.names if f"{imp.module}.{n}" not in PURE}
            if impure:
                yield f"{where} {sorted(impure)} from {imp.module}"
        else:
            yield f"{where} {imp.module}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr not in PURE_NAMES["os"]
        ):
            yield f"{name}:{node.lineno} uses os.{node.attr}"


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_no_io(name: str) -> None:
    assert not list(_io_imports(name, MODULES[name]))


@pytest.mark.parametrize(
    "source",
    [
        "import socket",
        "import logging",
        "import trio",
        "import pathlib",
        "from pathlib import Path",
        "import os\nos.stat('x')",
        "from vgpud.partition import pidsfile",
        "from vgpud.fsutil import write_atomic",
        "from vgpud.sockpath import remove_stale_socket",
        "from kubernetes import client",
        "from grpclib.server import Server",
    ],
)
def test_the_io_rule_catches(source: str) -> None:
    assert list(_io_imports("vgpud.partition.model", ast.parse(source)))


def _private_uses(name: str, tree: ast.Module) -> Iterator[str]:
    for imp in imports(name, tree):
        top = imp.module.split(".")[0]
        if top == "hypercorn" or (top == "grpclib" and imp.module not in GRPCLIB_PUBLIC):
            yield f"{name}:{imp.line} imports {imp.module}"
        elif top == "pynvml" and any(n.startswith("_") or n in PRIVATE_ATTRIBUTES for n in imp.names):
            yield f"{name}:{imp.line} imports {imp.names} from pynvml"
    for node in ast.walk(tree):
        if (  # getattr(x, "_transport")
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in PRIVATE_ATTRIBUTES
        ):
            yield f"{name}:{node.lineno} reaches {node.args[1].value} by {node.func.id}"
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value.id if isinstance(node.value, ast.Name) else None
        if owner == "pynvml" and node.attr.startswith("_"):
            yield f"{name}:{node.lineno} uses pynvml.{node.attr}"
        elif node.attr in PRIVATE_ATTRIBUTES and owner not in ("self", "cls"):
            yield f"{name}:{node.lineno} uses .{node.attr} of {owner or 'an expression'}"


def test_library_internals_are_named_only_in_compat() -> None:
    wrong = [
        use
        for name, tree in MODULES.items()
        if not name.startswith("vgpud.compat")
        for use in _private_uses(name, tree)
    ]
    assert not wrong


@pytest.mark.parametrize(
    "source",
    [
        "from hypercorn.trio.tcp_server import TCPServer",
        "from hypercorn.config import Config",
        "from grpclib.protocol import Stream",
        "import pynvml\npynvml._nvmlGetFunctionPointer_cache.clear()",
        "import pynvml\npynvml.nvmlLib = None",
        "from pynvml import _LoadNvmlLibrary",
        "async def f(stream):\n    await stream._stream.recv_data(5)",
        "def f(server):\n    return server._server.sockets",
        "def f(stream):\n    return getattr(stream.peer, '_transport', None)",
    ],
)
def test_the_internals_rule_catches(source: str) -> None:
    assert list(_private_uses("vgpud.x", ast.parse(source)))

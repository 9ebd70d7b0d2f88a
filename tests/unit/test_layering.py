"""The dependency rules, read from the source (AST) of every vgpud module:

- vgpud's packages (`vgpud.<sub>`) and top-level modules (`vgpud/<name>.py`) import each other in
  no cycle, and never upward through `LAYERS`; every one of them is placed in exactly one layer;
- the components never import `vgpud.observe` (observe only reads them; the wiring in
  `vgpud.node.observability` and the `cli` are the two places that know both);
- `partition` (but `pidsfile`) and the sans-IO codecs import no I/O module;
- the private internals of betterproto2, grpclib, hypercorn and pynvml are named only in
  `vgpud/compat/`, each listed in `COMPAT_INTERNALS`; no other library's private name is reached.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "vgpud"
#: the wiring: the only modules outside observe/ that may import it
WIRING = {"vgpud.node.observability", "vgpud.cli"}
PURE = {
    *(f"vgpud.partition.{m}" for m in ("assigner", "eager", "edits", "layout", "lazy", "model", "nrionly")),
    "vgpud.relaxations",
    "vgpud.wire",
    "vgpud.compat.betterproto2",
    "vgpud.grpccodec",
    "vgpud.nri.ttrpc",
    "vgpud.nri.mux",
    "vgpud.gpu.healthrules",
    *(f"vgpud.gpu.{m}" for m in ("model", "exclusion", "migtable")),
    "vgpud.kube.eventcorrelate",
    "vgpud.quantity",
    "vgpud.registry.cgroup",
    "vgpud.hotplug.rules",
    "vgpud.nvdriver.elfso",
    "vgpud.nvdriver.ldcache",
    *(f"vgpud.containers.{m}" for m in ("values", "linux", "record", "store")),
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
#: every library internal vgpud reaches, by the compat module that alone reaches it: attributes, and
#: hypercorn's modules (hypercorn is imported nowhere else, its public Config included)
COMPAT_INTERNALS = {
    "vgpud.compat.betterproto2": {"_betterproto"},
    "vgpud.compat.grpclib": {"_stream", "_server", "_transport"},
    "vgpud.compat.hypercorn": {
        "hypercorn.config", "hypercorn.trio.tcp_server", "hypercorn.trio.worker_context", "hypercorn.utils",
    },
    "vgpud.compat.pynvml": {"nvmlLib", "libLoadLock", "_nvmlGetFunctionPointer_cache"},
}  # fmt: skip
#: the internal attributes: reached elsewhere on anything but self/cls, each fails even where a vgpud
#: class has a private of the same name (`self._server`)
INTERNAL_ATTRIBUTES = {name for names in COMPAT_INTERNALS.values() for name in names if "." not in name}
#: underscored names that are no library's internal; any other, reached on a library's module or on an
#: object under a name that vgpud defines nowhere, is one
NOT_INTERNALS = {
    "_replace", "_asdict", "_fields", "_make",  # namedtuple's public API, underscored to free field names
    "_SubParsersAction",  # argparse's class of add_subparsers(), in an annotation (never evaluated)
}  # fmt: skip

#: vgpud's layers, bottom to top, of nodes: a package `vgpud.<sub>` or a top-level module
#: `vgpud/<name>.py` ("__init__": vgpud/__init__.py; "*" as in fnmatch). A node imports, at run time,
#: from its own layer (closing no cycle) and from those below, never from one above.
LAYERS: list[set[str]] = [
    # helpers: on the standard library, libraries, the generated messages (_pb) and each other
    {"__init__", "_pb", "artifacts", "compat", "componenthealth", "excgroup", "fsutil", "gates",
     "grpccodec", "grpcserve", "health", "logs", "metrics_names", "options", "parsers", "quantity",
     "ready", "recorder", "relaxations", "sockpath", "supervisor", "wire"},
    # the domain: the API server, the GPUs, the driver's files, the partitions, the node's containers
    {"kube", "gpu", "nvdriver", "partition", "containers"},
    # helpers over the domain: the settings, the host's set-up, the collector's freeze
    {"config", "nodesetup", "heap"},
    # the node's doors: kubelet's DRA, containerd's NRI, the device registry, the admission webhook
    {"dra", "nri", "registry", "webhook"},
    # devices into running containers, through dra's claims and the node's containers
    {"hotplug"},
    # the debug server and metrics: reads every component
    {"observe"},
    # the composition roots: start and wire everything
    {"daemon*", "node", "cli", "__main__"},
]  # fmt: skip


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


def _is_package(name: str) -> bool:
    return REPO.joinpath(*name.split("."), "__init__.py").is_file()


def _checks_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """`ast.walk`, but not into the body of an `if TYPE_CHECKING:` (its `else` runs)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _checks_type_checking(node.test):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def imports(name: str, tree: ast.Module, *, runtime_only: bool = False) -> Iterator[Import]:
    """Every import in the module, function-level ones included, relative ones resolved; with
    `runtime_only`, not those under `if TYPE_CHECKING:`."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    for node in _runtime_nodes(tree) if runtime_only else ast.walk(tree):
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


# --- packages: no cycle, no arrow up the layers ---


@dataclass(frozen=True)
class Arrow:
    """A runtime import from one node (package or top-level module) to another."""

    source: str
    target: str
    module: str  # the importing module
    line: int

    @property
    def site(self) -> str:
        return f"{self.module}:{self.line}"


def node_of(module: str) -> str:
    """The node holding a module: "vgpud.nri.hooks" -> "nri", "vgpud.wire" -> "wire",
    "vgpud" -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def nodes_on_disk() -> set[str]:
    """vgpud's packages (folders holding Python files) and top-level modules."""
    return {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if path.suffix == ".py" or (path.is_dir() and any(path.rglob("*.py")))
    }


def arrows(modules: Mapping[str, ast.Module], nodes: set[str]) -> list[Arrow]:
    """The runtime imports between distinct nodes (`from vgpud import x`: x's node when x is one)."""
    found = []
    for name, tree in modules.items():
        source = node_of(name)
        for imp in imports(name, tree, runtime_only=True):
            if imp.module == "vgpud":
                targets = {n if n in nodes else "__init__" for n in imp.names} or {"__init__"}
            elif imp.module.startswith("vgpud."):
                targets = {node_of(imp.module)}
            else:
                continue
            found += [Arrow(source, target, name, imp.line) for target in sorted(targets - {source})]
    return sorted(found, key=lambda arrow: (arrow.module, arrow.line, arrow.target))


def _graph(found: Iterable[Arrow]) -> dict[str, dict[str, list[str]]]:
    """source -> target -> the sites of its imports."""
    graph: dict[str, dict[str, list[str]]] = {}
    for arrow in found:
        graph.setdefault(arrow.source, {}).setdefault(arrow.target, []).append(arrow.site)
    return graph


def _reachable(graph: Mapping[str, Iterable[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _elementary_cycles(graph: Mapping[str, Iterable[str]]) -> Iterator[list[str]]:
    """Each cycle once, from its first node in sort order."""
    reach = {node: _reachable(graph, node) for node in graph}
    for start in sorted(graph):
        # the rest of start's strongly connected component, each node after start
        later = {node for node in reach[start] if node > start and start in reach.get(node, ())}
        todo = [[start]]
        while todo:
            path = todo.pop()
            for target in sorted(graph.get(path[-1], ())):
                if target == start:
                    yield path
                elif target in later and target not in path:
                    todo.append([*path, target])


def cycles(found: Iterable[Arrow], most: int = 20) -> list[str]:
    """Every import cycle between nodes (the first `most`), each with the imports that make its edges."""
    graph = _graph(found)
    report = []
    for cycle in _elementary_cycles(graph):
        if len(report) == most:
            report.append("... and more")
            break
        edges = zip(cycle, [*cycle[1:], cycle[0]], strict=True)
        report.append(
            "\n    ".join(
                [" -> ".join([*cycle, cycle[0]])]
                + [f"{a} -> {b}: {', '.join(graph[a][b])}" for a, b in edges]
            )
        )
    return report


def _layer(node: str, layers: list[set[str]]) -> list[int]:
    """The indices of the layers that name `node`."""
    return [i for i, layer in enumerate(layers) if any(fnmatch.fnmatchcase(node, entry) for entry in layer)]


def upward(found: Iterable[Arrow], layers: list[set[str]]) -> list[str]:
    """Every import from a node to one in a higher layer."""
    report = []
    for arrow in found:
        source, target = _layer(arrow.source, layers), _layer(arrow.target, layers)
        if source and target and source[0] < target[0]:
            up = f"{arrow.source} (LAYERS[{source[0]}]) imports {arrow.target} (LAYERS[{target[0]}])"
            report.append(f"{arrow.site}: {up}")
    return report


def misplaced(nodes: set[str], layers: list[set[str]]) -> list[str]:
    """Nodes in no layer or in several, and layers' entries that match no node."""
    report = []
    for node in sorted(nodes):
        found = _layer(node, layers)
        if len(found) != 1:
            where = "no layer" if not found else ", ".join(f"LAYERS[{i}]" for i in found)
            report.append(f"{node} is in {where}: exactly one layer of LAYERS must name it")
    for i, layer in enumerate(layers):
        for entry in sorted(layer):
            if not any(fnmatch.fnmatchcase(node, entry) for node in nodes):
                report.append(f"LAYERS[{i}] names {entry}, which is no package or module in vgpud/")
    return report


NODES = nodes_on_disk()
ARROWS = arrows(MODULES, NODES)


def test_every_package_and_top_level_module_is_in_exactly_one_layer() -> None:
    wrong = misplaced(NODES, LAYERS)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_packages() -> None:
    found = cycles(ARROWS)
    assert not found, "import cycles between vgpud's packages and top-level modules:\n" + "\n".join(found)


def test_no_import_points_up_the_layers() -> None:
    found = upward(ARROWS, LAYERS)
    assert not found, "imports from a lower layer to a higher one:\n" + "\n".join(found)


_SYNTHETIC = {
    "vgpud.a.x": "from vgpud.b import y\nfrom vgpud import a, c",
    "vgpud.b.y": "def later():\n    from ..a import x",  # function-level and relative: it counts
    "vgpud.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vgpud.a import x",  # not run
    "vgpud.d": "import vgpud.c\nfrom vgpud.a.x import z",
}


def _synthetic_arrows() -> list[Arrow]:
    return arrows({name: ast.parse(source) for name, source in _SYNTHETIC.items()}, {"a", "b", "c", "d"})


def test_the_cycle_rule_catches() -> None:
    assert cycles(_synthetic_arrows()) == ["a -> b -> a\n    a -> b: vgpud.a.x:1\n    b -> a: vgpud.b.y:2"]
    assert cycles(
        [Arrow("a", "b", "m", 1), Arrow("b", "c", "m", 2), Arrow("c", "a", "m", 3), Arrow("c", "b", "m", 4)]
    ) == [
        "a -> b -> c -> a\n    a -> b: m:1\n    b -> c: m:2\n    c -> a: m:3",
        "b -> c -> b\n    b -> c: m:2\n    c -> b: m:4",
    ]


def test_the_layer_rule_catches() -> None:
    assert upward(_synthetic_arrows(), [{"c"}, {"a", "b"}, {"d"}]) == []  # same layer: the cycle rule's
    assert upward(_synthetic_arrows(), [{"a"}, {"b", "c", "d"}]) == [
        "vgpud.a.x:1: a (LAYERS[0]) imports b (LAYERS[1])",
        "vgpud.a.x:2: a (LAYERS[0]) imports c (LAYERS[1])",
    ]


def test_the_placement_rule_catches() -> None:
    assert misplaced({"a", "b", "daemon_x", "new"}, [{"a", "gone"}, {"a", "daemon*"}, {"b"}]) == [
        "a is in LAYERS[0], LAYERS[1]: exactly one layer of LAYERS must name it",
        "new is in no layer: exactly one layer of LAYERS must name it",
        "LAYERS[0] names gone, which is no package or module in vgpud/",
    ]


# --- observe, purity ---


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


# --- library internals ---


def _is_private(name: str) -> bool:
    """`_x`, but not a dunder `__x__`."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def own_privates(modules: Mapping[str, ast.Module]) -> set[str]:
    """The underscored names the modules define: functions, classes, assigned names, attributes set
    on self/cls, `__slots__` entries (reaching one on another object is no library's internal)."""
    names: set[str] = set()
    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__slots__" for t in node.targets
            ):
                names |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    return {name for name in names if _is_private(name)}


def _private_uses(name: str, tree: ast.Module, own: set[str]) -> Iterator[tuple[str, str]]:
    """The library internals the module names: (the internal, where and how)."""
    libraries = {  # names bound to another library's module: `import pynvml`
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] != "vgpud"
    }

    def internal(attribute: str, owner: str | None) -> bool:
        """Whether `owner.attribute` (owner None: on an expression) reaches a library's internal."""
        if owner in ("self", "cls"):
            return False
        if attribute in INTERNAL_ATTRIBUTES:
            return True
        return (
            _is_private(attribute)
            and attribute not in NOT_INTERNALS
            and (owner in libraries or attribute not in own)
        )

    for imp in imports(name, tree):
        parts = imp.module.split(".")
        where = f"{name}:{imp.line} imports"
        if parts[0] == "vgpud":
            continue
        if (
            parts[0] == "hypercorn"
            or (parts[0] == "grpclib" and imp.module not in GRPCLIB_PUBLIC)
            or any(map(_is_private, parts))
        ):
            yield imp.module, f"{where} {imp.module}"
        for imported in imp.names:
            if imported in INTERNAL_ATTRIBUTES or (_is_private(imported) and imported not in NOT_INTERNALS):
                yield imported, f"{where} {imported} from {imp.module}"
    for node in ast.walk(tree):
        if (  # getattr(x, "_transport")
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            owner = node.args[0].id if isinstance(node.args[0], ast.Name) else None
            if internal(node.args[1].value, owner):
                yield (
                    node.args[1].value,
                    f"{name}:{node.lineno} reaches {node.args[1].value} by {node.func.id}",
                )
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if internal(node.attr, owner):
                yield node.attr, f"{name}:{node.lineno} uses .{node.attr} of {owner or 'an expression'}"


OWN_PRIVATES = own_privates(MODULES)


def test_library_internals_are_named_only_in_compat() -> None:
    wrong = [
        use
        for name, tree in MODULES.items()
        if not name.startswith("vgpud.compat")
        for _, use in _private_uses(name, tree, OWN_PRIVATES)
    ]
    assert not wrong, "\n".join(wrong)


def test_compat_names_exactly_the_listed_internals() -> None:
    reached = {
        name: {internal for internal, _ in _private_uses(name, tree, OWN_PRIVATES)}
        for name, tree in MODULES.items()
        if name.startswith("vgpud.compat")
    }
    assert {name: internals for name, internals in reached.items() if internals} == COMPAT_INTERNALS


def _synthetic_private_uses(source: str) -> list[str]:
    tree = ast.parse(source)
    return [use for _, use in _private_uses("vgpud.x", tree, own_privates({"vgpud.x": tree}))]


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
        "def f(message_type):\n    return message_type._betterproto.meta_by_field_name",
        "def f(message_type):\n    return getattr(message_type, '_betterproto')",
        "class A:\n    def __init__(self, s):\n        self._server = s._server",  # a namesake of one's own
        "import sys\nsys._getframe(1)",
        "from trio._core import current_root_task",
        "def f(lib):\n    return lib._internal_table",
    ],
)
def test_the_internals_rule_catches(source: str) -> None:
    assert _synthetic_private_uses(source)


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    __slots__ = ('_x',)\n\n    def same(self, other):\n        return other._x == self._x",
        "class A:\n    def _end(self): ...\n\ndef close(a):\n    a._end()",
        "def f(point):\n    return point._replace(x=1)._asdict()",
        "import argparse\ndef f(commands: argparse._SubParsersAction) -> None: ...",
        "from __future__ import annotations\nfrom vgpud.x import _helper",
    ],
)
def test_the_internals_rule_lets_through_what_is_no_librarys_internal(source: str) -> None:
    assert not _synthetic_private_uses(source)

"""Static checks of a built shared library, with binutils: the rules the control library must keep
(no load-time code, no bare dlsym, only the hook families exported). Functions so the tests can
also run them against a deliberately bad library and see them fail."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

EXPORT_FAMILIES = re.compile(r"^(cu[A-Z]\w*|cudbg\w*|nvml[A-Z]\w*|dlsym)$")
# readelf -SW: "[Nr] Name Type Address Off Size ..."
SECTION = re.compile(r"\]\s+(\.init_array|\.preinit_array|\.ctors|\.init)\s+\S+\s+\S+\s+\S+\s+([0-9a-f]+)")
DLSYM_BRANCH = re.compile(r"\b(call|jmp)\w*\s+\S+\s+<dlsym(@plt)?>")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def load_time_code(lib: Path) -> list[str]:
    """Dynamic entries and non-empty sections that make the loader run library code at load."""
    found = []
    dynamic = _run("readelf", "-dW", str(lib))
    for tag in ("INIT", "INIT_ARRAY", "PREINIT_ARRAY"):
        if re.search(rf"\({tag}\)", dynamic):
            found.append(f"DT_{tag}")
    for line in _run("readelf", "-SW", str(lib)).splitlines():
        match = SECTION.search(line)
        if match and int(match.group(2), 16) > 0:
            found.append(match.group(1))
    return found


def bare_dlsym_calls(lib: Path) -> list[str]:
    """Instructions in the library that call or jump to `dlsym` (ours or glibc's by PLT): the
    library must reach glibc's dlsym only through the pointer dlvsym returned."""
    listing = _run("objdump", "-d", "--no-show-raw-insn", str(lib))
    return [line.strip() for line in listing.splitlines() if DLSYM_BRANCH.search(line)]


def undefined_dlsym(lib: Path) -> bool:
    """Whether the library imports a `dlsym` symbol (a bare reference resolved at load)."""
    out = _run("nm", "-D", "--undefined-only", str(lib))
    return any(re.search(r"\bdlsym(@|$)", line.split()[-1]) for line in out.splitlines() if line.split())


def exported(lib: Path) -> dict[str, str]:
    """Defined dynamic symbols: name -> version ('' when unversioned)."""
    out = _run("nm", "-D", "--defined-only", "--with-symbol-versions", str(lib))
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        name, _, version = parts[2].partition("@")
        symbols[name] = version.lstrip("@")
    return symbols


def required_glibc(lib: Path) -> tuple[int, ...]:
    """The newest GLIBC_x.y version any imported symbol needs."""
    out = _run("objdump", "-T", str(lib))
    versions = [tuple(int(p) for p in v.split(".")) for v in re.findall(r"\(GLIBC_([0-9.]+)\)", out)]
    return max(versions, default=(0,))

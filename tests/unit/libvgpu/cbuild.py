"""Compile the small C programs and libraries the library tests run (gcc, into a temp dir)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def compile_c(out: Path, source: str, *flags: str, shared: bool = False) -> Path:
    """Build `source` into `out` (a program, or a shared library when `shared`)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    argv = ["gcc", "-std=gnu11", "-O1", "-g", "-Wall", "-Werror", "-o", str(out), str(src)]
    if shared:
        argv[1:1] = ["-shared", "-fPIC"]
    subprocess.run([*argv, *flags, "-ldl", "-lpthread"], check=True, capture_output=True, text=True)
    return out

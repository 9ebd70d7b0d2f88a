"""Run code in a fresh interpreter where the filesystem, the network and subprocesses raise.

The pure modules (partition algorithms, webhook rules) must be importable and usable there
(DESIGN §3). The top-level `vgpud` package reads its version from installed metadata, so it is
imported before the patch; every other vgpud module is imported by the body, after it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support import REPO

PRELUDE = textwrap.dedent("""
    import builtins, io, os, shutil, socket, subprocess, sys

    import vgpud
    assert not [m for m in sys.modules if m.startswith("vgpud.")]
    class IOAttempted(AssertionError):
        pass

    def forbidden(name):
        def refuse(*args, **kwargs):
            raise IOAttempted(f"{name} called with {args!r}")
        return refuse

    for module, names in [
        (builtins, ["open"]), (io, ["open", "FileIO"]),
        (os, ["open", "stat", "lstat", "fstat", "listdir", "scandir", "walk", "mkdir", "makedirs", "remove",
              "unlink", "rmdir", "rename", "replace", "chmod", "symlink", "readlink", "system", "popen"]),
        (shutil, ["rmtree", "copy", "move"]),
        (socket, ["socket", "create_connection", "getaddrinfo", "socketpair"]),
        (subprocess, ["Popen", "run"]),
    ]:
        for name in names:
            setattr(module, name, forbidden(f"{module.__name__}.{name}"))
    try:
        open("/etc/hostname")
    except IOAttempted:
        pass
    else:
        raise SystemExit("the patch is not in effect")
    before = set(sys.modules)
""")


def run_without_io(body: str, **values: object) -> subprocess.CompletedProcess[str]:
    """Run `body` (dedented) after the prelude, with `values` bound as globals; `before` holds the
    modules loaded until then."""
    assignments = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    code = PRELUDE + assignments + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )

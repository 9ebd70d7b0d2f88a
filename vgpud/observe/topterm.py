"""`vgpud top`'s terminal side: read the debug endpoint's state and draw `vgpud.observe.top`'s lines,
once (`--once`, `--json`) or every interval until `q` or Ctrl-C.

The live view is plain ANSI (home, each line erased and drawn, the rest of the screen erased), with
the cursor hidden and stdin in cbreak mode so one key press quits; both are restored on every way out
(q, Ctrl-C, SIGTERM, SIGHUP), which exits 0. A failed read shows its error above the last reading and
the next interval reads again. A resize (SIGWINCH) redraws the last reading at once, at the new size.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

from vgpud.observe.client import Endpoint, get_json
from vgpud.observe.top import json_view, render, screen

EXIT_OK, EXIT_FAILURE = 0, 1
STATE_TARGET = "/debug/state?calls=0"
#: `--once`'s width when stdout is not a terminal (and COLUMNS is unset)
ONCE_WIDTH = 120
#: an eager node's state waits up to 5 s for the claims from the API
READ_TIMEOUT = 10.0
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
HOME, ERASE_LINE, ERASE_BELOW = "\x1b[H", "\x1b[2K", "\x1b[J"
QUIT_KEYS = frozenset(b"qQ")


class _Quit(Exception):
    """SIGTERM or SIGHUP: leave the live view as `q` does."""


def read_state(endpoint: Endpoint) -> dict[str, Any]:
    """The state document without recent calls. OSError, RuntimeError or ValueError when unreadable."""
    document = get_json(endpoint, STATE_TARGET, timeout=READ_TIMEOUT)
    if not isinstance(document, dict):
        raise ValueError(f"{STATE_TARGET} answered {type(document).__name__}, not a JSON object")
    return document


def once(endpoint: Endpoint, *, as_json: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print one reading (the view, or its JSON); 1 with one error line when it cannot be read."""
    try:
        state = read_state(endpoint)
    except (OSError, RuntimeError, ValueError) as exc:
        err.write(f"vgpud top: {endpoint}: {exc}\n")
        return EXIT_FAILURE
    if as_json:
        out.write(json.dumps(json_view(state), indent=2) + "\n")
    else:
        width = shutil.get_terminal_size((ONCE_WIDTH, 40)).columns
        out.write("\n".join(render(state, width)) + "\n")
    return EXIT_OK


def live(endpoint: Endpoint, interval: float, *, out: TextIO = sys.stdout, keys: TextIO = sys.stdin) -> int:
    """Redraw every `interval` seconds until `q`, Ctrl-C, SIGTERM or SIGHUP: then 0."""
    title = f"vgpud top every {interval:g}s (q quits) reading {endpoint}"
    state: dict[str, Any] | None = None
    try:
        with _terminal(keys, out) as (keys_fd, resized):
            while True:
                error = ""
                try:
                    state = read_state(endpoint)
                except (OSError, RuntimeError, ValueError) as exc:
                    stamp = time.strftime("%H:%M:%S")
                    error = f"{stamp} cannot read the endpoint: {exc}; retrying every {interval:g}s"
                deadline = time.monotonic() + interval
                while True:  # redrawn on each resize until the next read is due
                    size = _terminal_size(out)
                    _draw(out, screen(state, error, title, size.columns, max(1, size.lines - 1)))
                    event = _wait(keys_fd, resized, deadline)
                    if event == "quit":
                        return EXIT_OK
                    if event == "due":
                        break
    except (KeyboardInterrupt, _Quit):
        return EXIT_OK


def _terminal_size(out: TextIO) -> os.terminal_size:
    """The terminal's own size, which a resize changes (shutil's would take an exported COLUMNS
    or LINES first, and keep it through every resize)."""
    try:
        return os.get_terminal_size(out.fileno())
    except (OSError, ValueError):
        return shutil.get_terminal_size()


def _draw(out: TextIO, lines: list[str]) -> None:
    """Over the previous frame: each line erased then written, then the rest of the screen erased. The
    frame leaves the last row free, so the cursor ends on a fresh line (a newline on the last row
    would scroll the screen), where the shell goes on after the view exits."""
    out.write(HOME + "".join(ERASE_LINE + line + "\n" for line in lines) + ERASE_BELOW)
    out.flush()


def _wait(keys_fd: int | None, resized: int, deadline: float) -> str:
    """ "quit" (a q key), "resize" (SIGWINCH) or "due" (the deadline passed)."""
    while (left := deadline - time.monotonic()) > 0:
        watched = [resized] if keys_fd is None else [resized, keys_fd]
        ready, _, _ = select.select(watched, [], [], left)
        if resized in ready:
            os.read(resized, 64)
            return "resize"
        if keys_fd is not None and keys_fd in ready:
            pressed = os.read(keys_fd, 64)
            if not pressed:  # the terminal hung up: no more keys, Ctrl-C or SIGHUP still end it
                keys_fd = None
            elif QUIT_KEYS.intersection(pressed):
                return "quit"
    return "due"


@contextlib.contextmanager
def _terminal(keys: TextIO, out: TextIO) -> Iterator[tuple[int | None, int]]:
    """stdin in cbreak mode (when a terminal), the cursor hidden, SIGWINCH to a pipe, SIGTERM and SIGHUP
    to _Quit; all undone on the way out. Yields (stdin's fd or None, the pipe's read end)."""
    keys_fd = keys.fileno() if keys.isatty() else None
    saved = termios.tcgetattr(keys_fd) if keys_fd is not None else None
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def on_resize(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):  # the pipe full: a redraw is pending anyway
            os.write(write_end, b"r")

    def on_quit(signum: int, frame: FrameType | None) -> None:
        raise _Quit

    handlers = {signal.SIGWINCH: on_resize, signal.SIGTERM: on_quit, signal.SIGHUP: on_quit}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        if keys_fd is not None:
            tty.setcbreak(keys_fd)
        out.write(HIDE_CURSOR)
        out.flush()
        yield keys_fd, read_end
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(OSError, termios.error):  # a hung-up terminal takes neither
            if keys_fd is not None and saved is not None:
                termios.tcsetattr(keys_fd, termios.TCSADRAIN, saved)
            out.write(SHOW_CURSOR)
            out.flush()
        os.close(read_end)
        os.close(write_end)

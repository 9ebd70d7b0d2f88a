"""`vgpud top` as a user runs it against the debug server of a node in this process: `--once` and
`--json` through a pipe, the live view in a pseudo-terminal (keys, Ctrl-C, SIGTERM, a resize, a
vgpud that is not there yet)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from tests.draharness import GPUS
from tests.unit.observe.node import Node, container_dir, prepared_node, serving, write_limits
from vgpud.observe.top import ELLIPSIS, json_view, render
from vgpud.observe.topterm import ERASE_BELOW, ERASE_LINE, HIDE_CURSOR, HOME, SHOW_CURSOR

GIB = 1 << 30
#: a container name long enough that the view is wider than 80 columns at 120
LONG = "serving-a-model-with-a-rather-long-name"
#: Ctrl-C raises KeyboardInterrupt in the child whatever this process made of SIGINT (an ignored
#: disposition and a blocked mask are inherited across exec)
WITH_SIGINT = (
    "import signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from vgpud.cli import main; sys.exit(main(sys.argv[1:]))"
)


def env() -> dict[str, str]:
    """This process's environment (PYTHONPATH: this tree's vgpud) without a size that would win over
    the terminal's."""
    return {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES"}}


async def node_with_two_containers(root: Path) -> Node:
    """Two containers of one pod on GPU 0 (4 GiB/30% and 2 GiB/20%), read by the usage reader."""
    node = await prepared_node(root, lazy=True)
    gpu0 = GPUS[0]
    main, side = await container_dir(node, LONG), await container_dir(node, "side")
    write_limits(main, gpu0.index, gpu0.uuid, 4 * GIB, 30)
    write_limits(side, gpu0.index, gpu0.uuid, 2 * GIB, 20)
    await node.usage.read()
    return node


def top(*argv: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpud", "top", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env(), **(extra_env or {})},
        check=False,
    )


async def test_once_prints_the_view_120_columns_wide_through_a_pipe(short_tmp: Path) -> None:
    node = await node_with_two_containers(short_tmp)
    sock = short_tmp / "debug.sock"
    async with serving(node, sock):
        shown = await trio.to_thread.run_sync(top, "--once", "--socket", str(sock))
        narrow = await trio.to_thread.run_sync(
            lambda: top("--once", "--socket", str(sock), extra_env={"COLUMNS": "60"})
        )
        state = await node.state.snapshot(calls=0)
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("node-a  vgpud ") and "  lazy mode  healthy  " in lines[0]
    assert lines[1:] == render(state, 120)[1:]  # the header's time is the reading's own
    assert max(len(line) for line in lines) > 80 and not any(ELLIPSIS in line for line in lines[:3])
    gpu0 = next(i for i, line in enumerate(lines) if line.startswith("  0  ok"))
    assert "6.0 GiB  15%" in lines[gpu0] and "50%" in lines[gpu0]
    assert narrow.returncode == 0 and max(len(line) for line in narrow.stdout.splitlines()) == 60


async def test_json_is_the_node_and_the_states_gpus(short_tmp: Path) -> None:
    node = await node_with_two_containers(short_tmp)
    sock = short_tmp / "debug.sock"
    async with serving(node, sock):
        shown = await trio.to_thread.run_sync(top, "--json", "--socket", str(sock))
        state = json.loads(json.dumps(await node.state.snapshot(calls=0)))
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    view = json.loads(shown.stdout)
    assert isinstance(view.pop("time"), float)
    expected = json_view(state)
    del expected["time"]
    assert view == expected
    assert [(v["container"], v["memory_limit_bytes"]) for v in view["gpus"][0]["vgpus"]] == [
        (LONG, 4 * GIB),
        ("side", 2 * GIB),
    ]


@dataclass
class Terminal:
    """A process on a pseudo-terminal, and everything it wrote."""

    proc: subprocess.Popen[bytes]
    master: int
    #: the terminal's side, kept open to read its modes
    slave: int
    raw: bytes = b""

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")

    def read_until(self, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        end = time.monotonic() + timeout
        while not predicate(self.text):
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out; the terminal shows:\n{self.text[-3000:]!r}")
            if select.select([self.master], [], [], min(left, 0.5))[0]:
                self._read()
            elif self.proc.poll() is not None:
                raise AssertionError(
                    f"the process ended ({self.proc.returncode}); it wrote:\n{self.text[-3000:]!r}"
                )
        return self.text

    def read_rest(self) -> str:
        """Whatever is left once the process has exited (the slave end stays open here: no EOF)."""
        while select.select([self.master], [], [], 0.5)[0] and self._read():
            pass
        return self.text

    def _read(self) -> bool:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the process is gone
            return False
        self.raw += data
        return bool(data)

    def lflag(self) -> int:
        return termios.tcgetattr(self.slave)[3]


def resize(fd: int, columns: int, lines: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))


@contextmanager
def terminal(
    argv: list[str], columns: int = 100, lines: int = 30, extra_env: dict[str, str] | None = None
) -> Iterator[Terminal]:
    """`python ARGV` on a new pseudo-terminal of this size, killed if still running at the end."""
    master, slave = pty.openpty()
    resize(master, columns, lines)
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env(), **(extra_env or {})},
        start_new_session=True,
    )
    try:
        yield Terminal(proc, master, slave)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
        os.close(slave)


def frames(text: str) -> list[list[str]]:
    """The complete frames drawn so far, each as its lines."""
    return [
        frame.split(ERASE_BELOW)[0].replace(ERASE_LINE, "").replace("\r", "").splitlines()
        for frame in text.split(HOME)[1:]
        if ERASE_BELOW in frame
    ]


def shows(text: str) -> Callable[[str], bool]:
    return lambda out: any(any(text in line for line in frame) for frame in frames(out))


async def test_the_live_view_redraws_until_q_and_restores_the_terminal(short_tmp: Path) -> None:
    node = await node_with_two_containers(short_tmp)
    sock = short_tmp / "debug.sock"
    argv = ["-m", "vgpud", "top", "--socket", str(sock), "--interval", "0.2"]
    async with serving(node, sock):
        with terminal(argv) as term:
            # two frames at least: it reads again every interval
            await trio.to_thread.run_sync(lambda: term.read_until(lambda out: len(frames(out)) >= 2))
            assert term.text.startswith(HIDE_CURSOR)
            assert not term.lflag() & (termios.ICANON | termios.ECHO)  # cbreak while it runs
            last = frames(term.text)[-1]
            assert last[0] == f"vgpud top every 0.2s (q quits) reading unix:{sock}"
            assert last[1].startswith("node-a  vgpud ") and all(len(line) <= 100 for line in last)
            assert any(f"/train/{LONG}" in line and "4.0 GiB" in line for line in last), last
            os.write(term.master, b"q")
            assert await trio.to_thread.run_sync(lambda: term.proc.wait(10)) == 0
            assert term.read_rest().endswith(ERASE_BELOW + SHOW_CURSOR)
            assert term.lflag() & termios.ICANON and term.lflag() & termios.ECHO


async def test_a_failed_read_shows_its_error_and_the_view_keeps_reading(short_tmp: Path) -> None:
    node = await node_with_two_containers(short_tmp)
    sock = short_tmp / "debug.sock"
    argv = ["-m", "vgpud", "top", "--socket", str(sock), "--interval", "0.2"]
    with terminal(argv) as term:
        error = "cannot read the endpoint: [Errno 2] No such file or directory; retrying every 0.2s"
        await trio.to_thread.run_sync(
            lambda: term.read_until(lambda out: sum(error in "\n".join(f) for f in frames(out)) >= 3)
        )
        assert term.proc.poll() is None
        async with serving(node, sock):  # vgpud comes up: the next reading shows it, no error
            await trio.to_thread.run_sync(lambda: term.read_until(shows("  0  ok")))
        assert error not in "\n".join(frames(term.text)[-1])
        term.proc.send_signal(signal.SIGTERM)
        code = await trio.to_thread.run_sync(lambda: term.proc.wait(10))
        assert code == 0 and term.read_rest().endswith(ERASE_BELOW + SHOW_CURSOR)
        assert term.lflag() & termios.ICANON


async def test_a_resize_redraws_at_once_and_ctrl_c_quits(short_tmp: Path) -> None:
    """A minute's interval: the narrower frame can only come from SIGWINCH. An exported COLUMNS and
    LINES (a shell's, a test runner's) do not stand for the terminal's size."""
    node = await node_with_two_containers(short_tmp)
    sock = short_tmp / "debug.sock"
    argv = ["-c", WITH_SIGINT, "top", "--socket", str(sock), "--interval", "60"]
    async with serving(node, sock):
        with terminal(argv, columns=120, extra_env={"COLUMNS": "50", "LINES": "10"}) as term:
            await trio.to_thread.run_sync(lambda: term.read_until(shows(LONG)))
            assert max(len(line) for line in frames(term.text)[-1]) > 60
            drawn = len(frames(term.text))
            resize(term.master, 60, 6)
            term.proc.send_signal(signal.SIGWINCH)
            await trio.to_thread.run_sync(lambda: term.read_until(lambda out: len(frames(out)) > drawn))
            narrow = frames(term.text)[-1]
            assert max(len(line) for line in narrow) == 60 and any(ELLIPSIS in line for line in narrow)
            # the last row stays free: 5 lines, the last saying what did not fit
            assert len(narrow) == 5 and narrow[-1].startswith(f"{ELLIPSIS} "), narrow
            term.proc.send_signal(signal.SIGINT)
            assert await trio.to_thread.run_sync(lambda: term.proc.wait(10)) == 0
            assert term.read_rest().endswith(ERASE_BELOW + SHOW_CURSOR)
            assert term.lflag() & termios.ECHO

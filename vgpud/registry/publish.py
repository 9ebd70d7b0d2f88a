"""The registry socket's lifecycle: staged bind, atomic publish, re-publish, ownership-checked unlink.

Unlike the kubelet-facing sockets (`vgpud.grpcserve.serve`), the registry socket is dialled by every
vGPU process on the node, any of which dies (FATAL in the library) if the path is missing for an
instant. So (contract "Registry", as the reference does it):

- the listener is bound at a staging name in the same directory, chmod 0666 (a container may run as
  any uid; the directory, 0711, is what keeps others from replacing it), listening, and only then
  renamed onto `socket.sock`: a client sees the old socket or the new one, never nothing. A socket a
  predecessor still serves is taken over the same way (a rolling upgrade overlaps); anything that is
  not a socket at the path is refused;
- a watcher re-publishes a new listener when the path disappears (an old release unlinks by path on
  shutdown, or an operator deletes it). A path that holds *another* inode is a successor's and is
  left alone, else two live servers would fight a rename war;
- at shutdown the path is unlinked only while it is still our inode.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio
import trio_asyncio
from grpclib.server import Server

from vgpud.compat.grpclib import stop_accepting
from vgpud.grpcserve import CLOSE_TIMEOUT, close_server, new_server
from vgpud.sockpath import SocketIdentity, check_socket_path, path_state, unlink_if_ours

log = logging.getLogger("vgpud.registry")

DIR_MODE = 0o711
SOCKET_MODE = 0o666
#: a single lstat; only needs to bound the outage after someone deletes the path
GUARD_INTERVAL = 5.0
#: every process of every container on the node may dial at once (a burst of pod starts); a full
#: backlog makes a non-blocking connect fail with EAGAIN, which the library treats as fatal
BACKLOG = 1024

_attempts = itertools.count(1)


def staged_path(path: Path) -> Path:
    """A name in the same directory (rename needs one filesystem), distinct per process and attempt."""
    return path.with_name(f".{path.name}.{os.getpid()}.{next(_attempts)}.staged")


def bind_published(path: Path, mode: int = SOCKET_MODE) -> tuple[socket.socket, SocketIdentity]:
    """A listening socket renamed onto `path` (replacing a socket there), and its identity."""
    check_socket_path(path)  # refuse a non-socket before binding anything
    staged = staged_path(path)
    staged.unlink(missing_ok=True)  # only a process killed between bind and rename leaves one
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(staged))
        os.chmod(staged, mode)
        st = os.lstat(staged)  # the identity of the staged name: the final one may race a takeover
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{staged} is not a socket after bind")
        sock.listen(BACKLOG)
        os.rename(staged, path)
    except BaseException:
        sock.close()
        staged.unlink(missing_ok=True)
        raise
    return sock, SocketIdentity.of(st)


class PublishedServer:
    """A set of grpclib servers for one path: the current one and any superseded by a re-publish."""

    def __init__(self, handlers: Sequence[Any], path: Path, socket_mode: int = SOCKET_MODE) -> None:
        self.handlers, self.path, self.socket_mode = handlers, path, socket_mode
        self.servers: list[Server] = []
        self.identity: SocketIdentity | None = None

    async def publish(self) -> None:
        sock, identity = bind_published(self.path, self.socket_mode)
        server = new_server(self.handlers)
        try:
            # grpclib hands `sock` to loop.create_server: a pre-bound socket of any family; unlike
            # create_unix_server it never unlinks the path itself
            await trio_asyncio.aio_as_trio(server.start)(sock=sock, backlog=BACKLOG)
        except BaseException:
            sock.close()
            unlink_if_ours(self.path, identity)
            raise
        if self.servers:
            stop_accepting(self.servers[-1])  # its calls in flight finish
        self.servers.append(server)
        self.identity = identity

    async def guard(self, interval: float) -> None:
        """Re-publish whenever the path has gone; leave a successor's socket alone."""
        while True:
            await trio.sleep(interval)
            assert self.identity is not None
            state = path_state(self.path, self.identity)
            if state == "missing":
                try:
                    await self.publish()
                except OSError as err:
                    log.error("registry socket %s vanished and cannot be re-published: %s", self.path, err)
                    continue
                log.warning("registry socket %s had been removed while serving; re-published it", self.path)
            elif state == "other":
                log.debug("registry socket %s now belongs to another instance; leaving it", self.path)

    async def close(self, close_timeout: float) -> None:
        with trio.CancelScope(shield=True):
            for server in self.servers:
                await close_server(server, f"unix:{self.path}", close_timeout)
            if self.identity is not None and not unlink_if_ours(self.path, self.identity):
                log.info("registry socket %s is no longer ours; left in place", self.path)


async def serve_published(
    handlers: Sequence[Any],
    path: Path,
    *,
    ready: Callable[[], None] | None = None,
    guard_interval: float = GUARD_INTERVAL,
    close_timeout: float = CLOSE_TIMEOUT,
    dir_mode: int = DIR_MODE,
    socket_mode: int = SOCKET_MODE,
) -> None:
    """Serve `handlers` at `path` until cancelled (inside `trio_asyncio.open_loop()`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, dir_mode)
    published = PublishedServer(handlers, path, socket_mode)
    try:
        await published.publish()
        log.info("gRPC %s serving on unix:%s", ", ".join(type(h).__name__ for h in handlers), path)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(published.guard, guard_interval)
            if ready is not None:
                ready()
            await trio.sleep_forever()
    finally:
        await published.close(close_timeout)
        log.info("gRPC server on unix:%s closed", path)

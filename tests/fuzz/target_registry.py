"""Fuzz target: the registry's request path, called directly: the gRPC message framing and strict
decode (`vgpud.grpcserve.read_unary` as the registry calls it, over grpclib's own receive buffer), the
request's validation (`request.parse_query`), and the caller's identity from its cgroup text
(`cgroup.parse_proc_cgroup`; a process may name its own sub-cgroups, so part of that text is the
caller's).

Contract per input:

* `read_unary` gives a ContainerDeviceRequest or a GRPCError of INVALID_ARGUMENT, RESOURCE_EXHAUSTED
  or UNIMPLEMENTED, and never waits for more bytes once the stream has ended;
* `parse_query` gives a query with the request's fields, or `BadRequest` (INVALID_ARGUMENT);
* `parse_proc_cgroup` gives None, a membership with a pod UID (and a 64-hex container ID when it names
  a container), or `CgroupParseError`.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Coroutine
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import Buffer

from tests.fuzz.driver import ContractBroken, Target, kind_of, surface_inputs, text
from tests.fuzz.messages import random_message
from vgpud._pb.registry import ContainerDeviceRequest
from vgpud.containers.values import is_pod_uid
from vgpud.grpcserve import MESSAGE_PREFIX, read_unary
from vgpud.registry.cgroup import CgroupParseError, parse_proc_cgroup
from vgpud.registry.request import BadRequest, parse_query
from vgpud.registry.server import MAX_MESSAGE

REQUEST, CGROUP = range(2)
POOL_SIZE = 64
STATUSES = frozenset({Status.INVALID_ARGUMENT, Status.RESOURCE_EXHAUSTED, Status.UNIMPLEMENTED})
_DRIVERS: tuple[bool | None, ...] = (None, True, False)


class _H2Stream:
    """What `recv_data` reads: grpclib's real receive buffer, filled with the input and ended."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.buffer = Buffer(lambda size: None)
        for chunk in chunks:
            self.buffer.add(chunk, len(chunk))
        self.buffer.eof()

    async def recv_data(self, size: int) -> bytes:
        return await self.buffer.read(size)


class _Stream:
    def __init__(self, chunks: list[bytes]) -> None:
        self._stream = _H2Stream(chunks)


def _complete(coro: Coroutine[Any, Any, ContainerDeviceRequest]) -> ContainerDeviceRequest:
    """Run a coroutine that must not wait (every byte is already in the buffer, and its end)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise ContractBroken("read_unary waits for bytes after the stream has ended")


def _request(rng: random.Random) -> bytes:
    """A framed request as the library sends it (or with the fields of no valid request)."""
    roll = rng.random()
    if roll < 0.4:
        message = ContainerDeviceRequest(register_uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    elif roll < 0.8:
        message = ContainerDeviceRequest(
            pod_uid=str(uuid.UUID(int=rng.getrandbits(128))),
            container_name=rng.choice(("main", "a-1", "x" * 63)),
        )
    else:
        message = random_message(rng, ContainerDeviceRequest)
    body = bytes(message)
    return MESSAGE_PREFIX.pack(False, len(body)) + body


def _cgroup(rng: random.Random) -> bytes:
    uid = str(uuid.UUID(int=rng.getrandbits(128)))
    cid = rng.randbytes(32).hex()
    if rng.random() < 0.5:
        path = f"/kubepods/{rng.choice(('', 'burstable/', 'besteffort/'))}pod{uid}/{cid}"
    else:
        qos = rng.choice(("", "-burstable", "-besteffort"))
        under = f"kubepods{qos}.slice/" if qos else ""
        pod = f"kubepods{qos}-pod{uid.replace('-', '_')}.slice"
        path = f"/kubepods.slice/{under}{pod}/cri-containerd-{cid}.scope"
    if rng.random() < 0.3:
        path += "/" + text(rng)  # a sub-cgroup the container made for itself
    if rng.random() < 0.5:
        return f"0::{path}\n".encode()
    return "".join(
        f"{n}:{c}:{path if rng.random() < 0.8 else '/'}\n" for n, c in enumerate(("cpu", "memory", "pids"))
    ).encode()


def _check_request(chunks: list[bytes]) -> str:
    try:
        request = _complete(read_unary(_Stream(chunks), ContainerDeviceRequest, MAX_MESSAGE))
    except GRPCError as err:
        if err.status not in STATUSES:
            raise ContractBroken(f"read_unary answered {err.status.name}: {err.message}") from None
        return kind_of(err, f"{err.status.name} {err.message}")
    try:
        query = parse_query(request.pod_uid, request.container_name, request.register_uuid)
    except BadRequest as err:
        return kind_of(err, str(err))
    if (query.pod_uid, query.container, query.register_uuid) != (
        request.pod_uid,
        request.container_name,
        request.register_uuid,
    ):
        raise ContractBroken(f"the query {query!r} is not the request {request!r}")
    return "query"


def _check_cgroup(data: bytes, systemd: bool | None) -> str:
    try:
        membership = parse_proc_cgroup(data.decode(errors="replace"), systemd)  # as identify() reads it
    except CgroupParseError as err:
        return kind_of(err, "disagree")
    if membership is None:
        return "no pod"
    if not is_pod_uid(membership.pod_uid):
        raise ContractBroken(f"membership names pod {membership.pod_uid!r}, no pod UID")
    cid = membership.container_id
    if cid is not None and (len(cid) != 64 or cid.strip("0123456789abcdef")):
        raise ContractBroken(f"membership names container {cid!r}, no container ID")
    return "container" if cid else "pod only"


def target(seed: int) -> Target:
    rng = random.Random(seed)
    pools = (tuple(_request(rng) for _ in range(POOL_SIZE)), tuple(_cgroup(rng) for _ in range(POOL_SIZE)))

    def check(data: bytes) -> str:
        if not data:
            return "empty"
        surface, step = data[0] & 1, (data[0] >> 1) + 1
        body = data[1:]
        if surface == REQUEST:
            return _check_request([body[i : i + step] for i in range(0, len(body), step)])
        return _check_cgroup(body, _DRIVERS[step % 3])

    return Target("registry", surface_inputs(pools), check)

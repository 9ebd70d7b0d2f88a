"""Decoding NRI Synchronize requests fast enough for the runtime's deadline.

A Synchronize carries every pod and container of the node, and all its chunks share one 2 s deadline;
a plugin that misses it is closed and injects nothing until it reconnects. betterproto2 decodes a
4 MiB chunk in about 2 s on this hardware, protobuf's C decoder (upb) in about 15 ms, so this one
message is decoded with the upb module generated beside the betterproto2 code (`make protos`), and
only what the cache rebuild and the injection check need is kept: every pod; of every container the
few facts a hot-plug target needs (`SyncTarget`: state, pid, cgroups path, device rules); and the
env and mounts only of those with a claim UID in their env (a node reports thousands, most of them
not vGPU ones). upb rejects malformed input as strictly as `vgpud.wire` does (truncation, bad
lengths, invalid UTF-8).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from google.protobuf.message import DecodeError

from vgpud._pb import nri_api_pb2
from vgpud._pb.nri.pkg.api.v1alpha1 import ContainerState
from vgpud.containers.linux import ContainerLinux
from vgpud.containers.record import Injection, NodeContainer
from vgpud.partition.layout import ENV_CLAIM_UID
from vgpud.wire import MalformedMessage

CONTAINER_STOPPED = int(ContainerState.CONTAINER_STOPPED)
#: the states in which a container has a live process (paused: frozen, still there)
LIVE_STATES = frozenset({int(ContainerState.CONTAINER_RUNNING), int(ContainerState.CONTAINER_PAUSED)})


# NamedTuples, not frozen dataclasses: as immutable, and a third of the cost to build (thousands each)
class SyncPod(NamedTuple):
    id: str
    uid: str
    name: str
    namespace: str


class SyncContainer(NamedTuple):
    """A container with a claim UID in its env."""

    id: str
    pod_sandbox_id: str
    name: str
    #: the value of the last `MANAGER_VGPU_CLAIM_UID=` entry of its env (never empty)
    claim_uid: str
    env: tuple[str, ...]
    #: (destination, source) of each mount: what the runtime actually gave the container
    mounts: tuple[tuple[str, str], ...] = ()
    #: the NRI ContainerState number (4: stopped)
    state: int = 0

    @property
    def stopped(self) -> bool:
        return self.state == CONTAINER_STOPPED


class SyncTarget(NamedTuple):
    """A container whose pod was not in its chunk (a split Synchronize), as much of it as a hot-plug
    needs: `target_of` makes its `NodeContainer` once its pod is known."""

    id: str
    pod_sandbox_id: str
    name: str
    #: the NRI ContainerState number
    state: int
    pid: int
    #: its cgroups path and device rules, read when needed
    linux: ContainerLinux


class SyncBatch(NamedTuple):
    """One Synchronize chunk, reduced to what identifies vGPU containers and hot-plug targets."""

    pods: tuple[SyncPod, ...] = ()
    #: the containers with a claim UID in their env
    claimed: tuple[SyncContainer, ...] = ()
    #: every container whose pod came in the same chunk (all of them, unless the request was split),
    #: without its vGPU claim's facts (the hooks add them)
    targets: tuple[NodeContainer, ...] = ()
    #: the others: their pods came in another chunk
    unresolved: tuple[SyncTarget, ...] = ()
    #: how many containers the chunk reported, with and without a claim UID
    reported: int = 0
    more: bool = False


class _GcPause:
    """How many blocks pause the collector now, and whether it was on before the first."""

    depth = 0
    was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block that makes tens of thousands of acyclic objects
    (a Synchronize's decode and cache rebuild): their allocations would trigger full collections that
    walk the whole heap, about 20 ms of a 10,000-container Synchronize. Reference counting still frees
    everything. Blocks may nest or overlap (Trio tasks): the collector is back on (if it was before
    the first) when the last one ends. Process-wide: only around a bounded piece of work (the session
    keeps it paused until a Synchronize's reply is sent)."""
    if _GcPause.depth == 0:
        _GcPause.was_enabled = gc.isenabled()
        gc.disable()
    _GcPause.depth += 1
    try:
        yield
    finally:
        _GcPause.depth -= 1
        if _GcPause.depth == 0 and _GcPause.was_enabled:
            gc.enable()


def decode_sync(data: bytes) -> SyncBatch:
    """A SynchronizeRequest's pods and claimed containers; MalformedMessage when the bytes are not one."""
    try:
        request = nri_api_pb2.SynchronizeRequest.FromString(data)  # type: ignore[attr-defined]
    except DecodeError as err:
        raise MalformedMessage("SynchronizeRequest", str(err) or "malformed", 0, len(data)) from None
    with gc_paused():
        return _reduce(request)


def target_of(t: SyncTarget, pod: SyncPod) -> NodeContainer:
    live = t.state in LIVE_STATES
    return NodeContainer(t.id, pod.uid, t.name, pod.namespace, pod.name, live, t.pid, t.linux)


def _reduce(request: nri_api_pb2.SynchronizeRequest) -> SyncBatch:  # type: ignore[name-defined]
    containers = request.containers
    pods = tuple([SyncPod(p.id, p.uid, p.name, p.namespace) for p in request.pods])
    pod_of = {pod.id: pod for pod in pods}
    claimed, targets, unresolved = [], [], []
    live, new = LIVE_STATES, tuple.__new__  # a third of the NamedTuple constructor's cost
    no_claim = ("", Injection.NO_CLAIM, None, ())  # its vGPU fields: the hooks set those of claimed ones
    prefix = f"{ENV_CLAIM_UID}="
    value_at = len(prefix)
    for c in containers:  # one pass, no generator per container: a node reports thousands
        cid, sandbox, name, state = c.id, c.pod_sandbox_id, c.name, c.state
        linux = ContainerLinux(c)  # read when a hot-plug needs it (vgpud.containers.linux)
        pod = pod_of.get(sandbox)
        if pod is not None:
            fields = (cid, pod.uid, name, pod.namespace, pod.name, state in live, c.pid, linux, *no_claim)
            targets.append(new(NodeContainer, fields))
        else:
            unresolved.append(SyncTarget(cid, sandbox, name, state, c.pid, linux))
        env = c.env
        # `env_value` inlined: a call per container was a tenth of this loop (10,000 containers)
        claim_uid = ""
        for item in env:
            if item.startswith(prefix):
                claim_uid = item[value_at:]
        if not claim_uid:
            continue
        mounts = c.mounts
        claimed.append(
            SyncContainer(
                cid,
                sandbox,
                name,
                claim_uid,
                tuple(env),
                tuple([(m.destination, m.source) for m in mounts]) if mounts else (),
                state,
            )
        )
    return SyncBatch(pods, tuple(claimed), tuple(targets), tuple(unresolved), len(containers), request.more)

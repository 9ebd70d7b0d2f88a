"""What the NRI plugin knows about its connection to the runtime, and the counters the metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from vgpud.containers.record import NodeContainer
from vgpud.nri.sync import SyncContainer, SyncPod, SyncTarget


@dataclass
class NriStats:
    """Counters the metrics read."""

    injected: int = 0
    skipped: int = 0
    rejected_unprepared: int = 0
    #: a claim prepared here whose reservedFor does not name the pod (another pod's claim)
    rejected_not_reserved: int = 0
    #: containers of claims prepared in eager mode, left to their CDI spec (a mode mismatch)
    other_mode: int = 0
    sync_reported: int = 0
    sync_rebuilt: int = 0
    sync_invalid: int = 0
    removed_dirs: int = 0
    #: sessions that ended (the runtime closed or dropped the connection, or vgpud stopped)
    connection_closes: int = 0
    #: requests the runtime sent, by method: how it delivers lifecycle events (NRI v0.12 runtimes
    #: call RemoveContainer, StopPodSandbox ...; older ones StateChange), unknown methods included
    requests: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NriSessionState:
    """What the debug endpoint shows about the connection to the runtime."""

    connected: bool
    runtime: str
    nri_version: str
    #: the timeouts the runtime applies to this plugin, from Configure (0: a runtime before NRI v0.7
    #: does not say; containerd 2.x says 5000 and 2000 unless configured otherwise)
    registration_timeout_ms: int
    request_timeout_ms: int
    synchronized: bool
    #: sessions begun since vgpud started (1 after the first connection)
    sessions: int
    #: why the last session ended ("" while none has)
    last_close: str
    #: wall clock of the last complete Synchronize (None before the first)
    last_sync_time: float | None


@dataclass
class SessionState:
    runtime: str = ""
    nri_version: str = ""
    registration_timeout_ms: int = 0
    request_timeout_ms: int = 0
    pods: list[SyncPod] = field(default_factory=list)
    #: the containers with a claim UID in their env, of the chunks received so far
    claimed: list[SyncContainer] = field(default_factory=list)
    #: every container of the chunks received so far (the hot-plug targets), and those of them whose
    #: pod was not in their chunk
    targets: list[NodeContainer] = field(default_factory=list)
    unresolved: list[SyncTarget] = field(default_factory=list)
    #: every container those chunks reported, with or without a claim UID
    reported: int = 0
    synchronized: trio.Event = field(default_factory=trio.Event)

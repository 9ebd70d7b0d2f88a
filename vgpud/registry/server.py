"""`VDeviceRegistry.RegisterContainerDevice`: the library's register call, and the registry component.

Per call: the peer PID (SO_PEERCRED) and its pod (`/proc/<pid>/cgroup`); the request, at most 16 KiB;
the in-flight limits (256 on the node, 8 per caller pod); resolution of the target directory with
the caller checked against it (`vgpud.registry.resolve`); then pids.config written in place. Every
call is recorded (component "registry"; a failure's detail starts with its status name, which the
metrics count by) and every failure is one gRPC status:

| INVALID_ARGUMENT   | malformed bytes; a register_uuid that is no UUID, a pod_uid that is no pod UID, |
|                    | a container_name that is no DNS label; neither a UUID nor pod UID + container   |
| RESOURCE_EXHAUSTED | a message over 16 KiB; over 256 calls in flight, or over 8 from one caller       |
| PERMISSION_DENIED  | unknown PID, a caller in no pod's container, a target of another pod, a caller   |
|                    | that (at the deadline) still is another container of the target's pod           |
| NOT_FOUND          | a target that cannot exist: unknown UUID, claim or pod gone, pod terminated      |
| DEADLINE_EXCEEDED  | still unresolved after 60 s (the reference says UNKNOWN; see ResolveTimeout)     |
| UNAVAILABLE        | pids.config lock held by another writer past its budget                          |
| INTERNAL           | pids.config could not be written (a symlink in its place is refused and logged)  |

Handlers run on grpclib's asyncio side; each call runs as a Trio task through trio-asyncio.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

import grpclib.const
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from vgpud._pb.registry import ContainerDeviceRequest, ContainerDeviceResponse, VDeviceRegistryBase
from vgpud.containers.store import ContainerStore
from vgpud.grpcserve import read_unary
from vgpud.kube.informer import Informer
from vgpud.logs import fields
from vgpud.partition.assigner import PartitionAssigner
from vgpud.partition.layout import Layout
from vgpud.partition.pidsfile import PidsFileError, PidsFileLockTimeout, write_pids_file
from vgpud.ready import Ready
from vgpud.recorder import HookCall, Outcome, Recorder
from vgpud.registry.identity import IdentityError, identify, peer_pid
from vgpud.registry.publish import GUARD_INTERVAL, serve_published
from vgpud.registry.request import (
    Admission,
    CallerRefused,
    RegisterError,
    WriteBusy,
    WriteFailed,
    parse_query,
)
from vgpud.registry.resolve import ClaimIndex, Resolved, Resolver

log = logging.getLogger("vgpud.registry")

MAX_MESSAGE = 16 * 1024
#: register UUIDs remembered as used (the debug state lists those issued and never used)
CONSUMED_REMEMBERED = 4096


class RegistryService(VDeviceRegistryBase):
    """The grpclib handler; `register` is the Trio side, callable directly in tests."""

    def __init__(
        self,
        resolver: Resolver,
        recorder: Recorder,
        *,
        proc_root: Path,
        admission: Admission | None = None,
        max_message: int = MAX_MESSAGE,
        systemd_cgroups: bool | None = None,
    ) -> None:
        """`systemd_cgroups`: the kubelet's cgroup driver is systemd (True), cgroupfs (False), or not
        configured (None: a caller's pod is read from either layout)."""
        self.resolver = resolver
        self.recorder = recorder
        self.proc_root = proc_root
        self.systemd_cgroups = systemd_cgroups
        self.admission = admission or Admission()
        self.max_message = max_message
        self._consumed: dict[str, None] = {}  # an ordered set, oldest first

    def consumed_register_uuids(self) -> frozenset[str]:
        """Register UUIDs that a successful register call has used (the newest few thousand)."""
        return frozenset(self._consumed)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        """The generated mapping with our stream handler (the generated one reads without a limit)."""
        return {path: h._replace(func=self._handle) for path, h in super().__mapping__().items()}

    async def _handle(self, stream: Any) -> None:
        pid = peer_pid(stream)
        try:
            request = await read_unary(stream, ContainerDeviceRequest, self.max_message)
        except GRPCError as err:
            await trio_asyncio.trio_as_aio(self._unreadable)(pid, err)
            raise
        await trio_asyncio.trio_as_aio(self.register)(request, pid)
        await stream.send_message(ContainerDeviceResponse())

    async def _unreadable(self, pid: int | None, err: GRPCError) -> None:
        """Record a request refused before it was decoded (oversize, malformed)."""
        log.info("register from pid %s refused: %s: %s", pid, err.status.name, err.message)
        self.recorder.record(
            HookCall(
                component="registry",
                call="RegisterContainerDevice",
                outcome=Outcome.REJECTED,
                detail=f"{err.status.name}: {err.message}",
            )
        )

    async def register(self, request: ContainerDeviceRequest, pid: int | None) -> Resolved:
        """Identify, admit, resolve and write; GRPCError with the status of whatever failed."""
        with self.recorder.timed(
            "registry",
            "RegisterContainerDevice",
            pod_uid=request.pod_uid[:64],
            container=request.container_name[:64],
        ) as call:
            try:
                query = parse_query(request.pod_uid, request.container_name, request.register_uuid)
                try:
                    caller = identify(self.proc_root, pid, self.systemd_cgroups)
                except IdentityError as err:
                    raise CallerRefused(str(err)) from None
                with self.admission.slot(caller.key):
                    resolved = await self.resolver.resolve(query, caller)
                    call.update(claim_uid=resolved.target.claim_uid or "")
                    await self._write(resolved)
                    self._consumed_uuid(query.register_uuid)
            except RegisterError as err:
                failed = err.status in (Status.DEADLINE_EXCEEDED, Status.INTERNAL, Status.UNAVAILABLE)
                call.outcome = Outcome.ERROR if failed else Outcome.REJECTED
                call.detail = f"{err.status.name}: {err}"  # the status first, as for unreadable requests
                log.log(
                    logging.WARNING if failed or err.status is Status.PERMISSION_DENIED else logging.INFO,
                    "register pod_uid=%r container=%r register_uuid=%r from pid %s: %s: %s",
                    request.pod_uid[:64],
                    request.container_name[:64],
                    request.register_uuid[:64],
                    pid,
                    err.status.name,
                    err,
                    extra=fields(pod=request.pod_uid[:64], container=request.container_name[:64]),
                )
                raise GRPCError(err.status, str(err)[:1024]) from None
        log.debug(  # every process of a container registers: the recorder keeps the history
            "registered container %s of pod %s (claim %s, caller pid %s): %d PIDs into %s",
            resolved.candidate.container,
            resolved.candidate.pod_uid,
            resolved.target.claim_uid or "-",
            pid,
            len(resolved.pids),
            resolved.target.config_dir,
        )
        return resolved

    def _consumed_uuid(self, register_uuid: str) -> None:
        if not register_uuid:
            return
        self._consumed.pop(register_uuid, None)
        self._consumed[register_uuid] = None
        if len(self._consumed) > CONSUMED_REMEMBERED:
            del self._consumed[next(iter(self._consumed))]

    async def _write(self, resolved: Resolved) -> None:
        """On the Trio thread first: with the lock free, the write is a few syscalls on a local file,
        like the identity reads, and a worker-thread hop would cost far more (256 concurrent calls
        queue for threads). Only a lock that another writer holds is waited for, in a worker thread."""
        directory = Path(resolved.target.config_dir)
        try:
            try:
                write_pids_file(directory, resolved.pids, lock_budget=0)
            except PidsFileLockTimeout:
                await trio.to_thread.run_sync(write_pids_file, directory, resolved.pids)
        except PidsFileLockTimeout as err:
            raise WriteBusy(str(err)) from None
        except (PidsFileError, OSError, ValueError) as err:
            if isinstance(err, OSError) and err.errno == errno.ELOOP:
                # nothing legitimate plants one: the container may be redirecting a privileged write
                log.error(
                    "SECURITY: %s",
                    err,
                    extra=fields(
                        pod=resolved.candidate.pod_uid,
                        container=resolved.candidate.container,
                        claim=resolved.target.claim_uid,
                    ),
                )
            raise WriteFailed(str(err)) from None


class RegistryServer:
    """The supervised component: the registry socket at `<root>/registry/socket.sock`. The pod and
    claim caches it resolves from are components of their own (`vgpud.kube.informer`); until both
    have listed once, a register call waits for them within its deadline."""

    def __init__(
        self,
        *,
        layout: Layout,
        assigner: PartitionAssigner,
        containers: ContainerStore | None,
        claims: ClaimIndex,
        pods: Informer,
        claim_objects: Informer,
        recorder: Recorder,
        driver_name: str,
        proc_root: Path,
        cgroup_root: Path,
        guard_interval: float = GUARD_INTERVAL,
        admission: Admission | None = None,
        systemd_cgroups: bool | None = None,
        other_assigner: PartitionAssigner | None = None,
    ) -> None:
        self.path = Path(layout.registry_socket)
        self.guard_interval = guard_interval
        self.resolver = Resolver(
            assigner=assigner,
            other_assigner=other_assigner,
            pods=pods,
            claim_objects=claim_objects,
            claims=claims,
            containers=containers,
            cgroup_root=cgroup_root,
            driver_name=driver_name,
        )
        self.service = RegistryService(
            self.resolver, recorder, proc_root=proc_root, admission=admission, systemd_cgroups=systemd_cgroups
        )

    def consumed_register_uuids(self) -> frozenset[str]:
        return self.service.consumed_register_uuids()

    async def run(self, ready: Ready) -> None:
        await serve_published([self.service], self.path, ready=ready, guard_interval=self.guard_interval)

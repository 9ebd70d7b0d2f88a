"""The NRI hooks: what vgpud does when containerd calls its `Plugin` service (seed §12.4-§12.12).

Transport-free: each hook takes the decoded request message and returns the response message (or
raises `HookError`, which becomes a ttrpc error status; `vgpud.nri.methods` is the table of decoders,
hooks and encoders the session dispatches by). One `NriHooks` lives as long as vgpud; its store
survives reconnects, while the split-Synchronize buffer is per session (`begin_session`).

- CreateContainer: a container whose env carries `MANAGER_VGPU_CLAIM_UID` of a vGPU claim this node
  prepared, reserved for the container's pod, gets its own directory (created, pids.config reset) and
  the mounts and identity env of the lazy assigner. No claim UID: not ours, no change. A claim UID
  this node did not prepare, or one not reserved for the pod: nothing injected, recorded as rejected
  and told to the pod (a VGPUContainerRefused Event; a pod may set that env itself; seed §12.12.1).
  A claim prepared in eager mode: left to its CDI spec, recorded as skipped and counted. Admission
  and directory creation run under the claim's guard, so an Unprepare cannot fall between them. A
  directory that cannot be made: an error, so the container is not created (fail-closed). A
  container with several vGPU claims carries one claim UID (containerd applies CDI env
  replace-by-name: the last claim's): only that claim's admission is checked (the kubelet prepared
  and reserved every claim of the pod before creating a container), and the directory lies under
  that claim's UID. Prepare refuses such claims when their devices are on the same GPU, whose limits
  would replace each other (docs/decisions.md).
- Synchronize: the store is rebuilt from the containers' env with the same validation; a container
  that does not validate is skipped and counted, and the sync itself still succeeds. A valid live
  one whose mounts and env lack the injection (created while vgpud was down, or after the runtime
  dropped the plugin for a missed deadline) is not cached but kept as not injected: one WARNING line
  and one VGPUNotInjected Event on its pod each, the metrics and the debug state show it. Eviction
  would let the kubelet recreate it, but the NRI runtime adaptation drops a plugin's eviction requests
  (v0.6.1 through v0.12.5; docs/decisions.md).
- RemoveContainer / StopPodSandbox / RemovePodSandbox, as dedicated RPCs (NRI v0.12) or as
  StateChange events (older runtimes): the instance's record goes, and its directory once no
  other injected instance of the container uses it (seed §12.10; a stale instance can be removed
  while a newer one runs).

Every container, vGPU or not, is kept in the node's container store (`vgpud.containers`: what the
registry, the hot-plug, drift, usage and the debug state read): replaced by each Synchronize
(`vgpud.nri.rebuild` decides its vGPU containers' state), added by CreateContainer (not running yet),
marked running with its pid by PostStartContainer (a StateChange event before NRI v0.12), not
running by StopContainer, and dropped by RemoveContainer / StopPodSandbox / RemovePodSandbox. The
`on_container_gone` listeners hear of each instance once, when it stops or goes (whichever comes
first; also when a Synchronize after a reconnect no longer reports it running). They run inside the
hook, while the runtime waits (and holds its NRI lock): a listener must be quick and must not call
the runtime (`vgpud.nri.runtime_link`) itself; its errors are logged, never the hook's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    ConfigureResponse,
    Container,
    CreateContainerRequest,
    CreateContainerResponse,
    Empty,
    Event,
    PodSandbox,
    PostStartContainerRequest,
    PostStartContainerResponse,
    RemoveContainerRequest,
    RemoveContainerResponse,
    RemovePodSandboxRequest,
    RemovePodSandboxResponse,
    StateChangeEvent,
    StopContainerRequest,
    StopContainerResponse,
    StopPodSandboxRequest,
    StopPodSandboxResponse,
    SynchronizeResponse,
    UpdateContainerRequest,
    UpdateContainerResponse,
)
from vgpud.containers.linux import ContainerLinux
from vgpud.containers.record import Injection, NodeContainer
from vgpud.containers.store import ContainerStore
from vgpud.fsutil import remove_tree
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import EventSink, Reason, pod_ref
from vgpud.logs import pod_fields
from vgpud.nri.adjust import adjustment, make_directories_soon
from vgpud.nri.envs import env_value
from vgpud.nri.events import WANTED_EVENTS, event_mask, known_events_mask
from vgpud.nri.rebuild import RUNTIME_FIELDS, SYNC_WARNINGS_SHOWN, ClaimFacts, claim_facts, warn_not_injected
from vgpud.nri.session import NriSessionState, NriStats, SessionState
from vgpud.nri.sync import SyncBatch, SyncContainer, SyncPod, SyncTarget, gc_paused, target_of
from vgpud.nri.ttrpc import Code
from vgpud.partition.admission import Admission, ClaimAdmission, Verdict
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import ENV_CLAIM_UID, LayoutError
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.pidsfile import PidsFileError
from vgpud.recorder import Outcome, Recorder, TimedCall

log = logging.getLogger("vgpud.nri")


class HookError(Exception):
    """A hook failure the runtime must see (a ttrpc error status)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


#: told the ID of a container instance that stopped or went away
GoneListener = Callable[[str], Awaitable[None]]


class NriHooks:
    def __init__(
        self,
        *,
        assigner: LazyAssigner,
        admission: ClaimAdmission,
        recorder: Recorder,
        containers: ContainerStore | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.assigner = assigner
        #: every container the runtime reported, vGPU or not: written here, read by the other parts
        self.containers = containers if containers is not None else ContainerStore()
        #: called with a container ID once per instance, when it stops or is gone (module docstring)
        self.on_container_gone: list[GoneListener] = []
        self._warned_not_injected: set[str] = set()
        self.stats = NriStats()
        self._sessions = 0
        self._connected = False
        self._last_close = ""
        self._last_sync_time: float | None = None
        self._admission = admission
        self._recorder = recorder
        #: the pods' Events: a container refused, or found without its injection
        self._events = events
        self._session = SessionState()

    def begin_session(self) -> trio.Event:
        """A new connection: forget the last session's half-received Synchronize. The returned event
        is set once this session's Synchronize is complete."""
        self._session = SessionState()
        self._sessions += 1
        self._connected = True
        return self._session.synchronized

    def end_session(self, reason: str) -> None:
        """The connection of the current session ended (counted for the metrics)."""
        self._connected = False
        self._last_close = reason
        self.stats.connection_closes += 1

    def session_state(self) -> NriSessionState:
        session = self._session
        return NriSessionState(
            connected=self._connected,
            runtime=session.runtime,
            nri_version=session.nri_version,
            registration_timeout_ms=session.registration_timeout_ms,
            request_timeout_ms=session.request_timeout_ms,
            synchronized=session.synchronized.is_set(),
            sessions=self._sessions,
            last_close=self._last_close,
            last_sync_time=self._last_sync_time,
        )

    # ---------------------------------------------------------------------------------------------

    async def configure(self, request: ConfigureRequest) -> ConfigureResponse:
        session = self._session
        session.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        session.nri_version = request.NRI_version
        session.registration_timeout_ms = request.registration_timeout
        session.request_timeout_ms = request.request_timeout
        mask = event_mask(WANTED_EVENTS) & known_events_mask(request.NRI_version)
        log.info(
            "NRI: configured by %s (NRI %s), events 0x%x, request timeout %s",
            session.runtime or "a runtime",
            request.NRI_version or "<= v0.11",
            mask,
            f"{request.request_timeout} ms" if request.request_timeout else "not said",
        )
        return ConfigureResponse(events=mask)

    async def synchronize(self, request: SyncBatch) -> SynchronizeResponse:
        """Rebuild the cache from every container; a split request is answered `more` until the last."""
        session = self._session
        session.pods.extend(request.pods)
        session.claimed.extend(request.claimed)
        session.targets.extend(request.targets)
        session.unresolved.extend(request.unresolved)
        session.reported += request.reported
        if request.more:
            return SynchronizeResponse(more=True)
        with self._recorder.timed("nri", "Synchronize") as call, gc_paused():
            pods = {pod.id: pod for pod in session.pods}
            invalid_before = self.stats.sync_invalid
            facts = claim_facts(
                pods,
                session.claimed,
                assigner=self.assigner,
                check=self._admission.check,
                invalid=lambda container, reason: self._count_invalid(container, reason, invalid_before),
            )
            gone = self._replace_containers(pods, session.targets, session.unresolved, facts)
            self._warned_not_injected = warn_not_injected(
                self.containers.select(Injection.MISSING), self._warned_not_injected, self._events
            )
            self._last_sync_time = time.time()
            injected = sum(1 for f in facts.values() if f.injection is Injection.INJECTED)
            not_injected = sum(1 for f in facts.values() if f.injection is Injection.MISSING)
            self.stats.sync_reported = session.reported
            self.stats.sync_rebuilt = injected
            invalid = len(session.claimed) - injected - not_injected
            call.detail = (
                f"{injected} vGPU containers of {session.reported}, {invalid} not valid here, "
                f"{not_injected} without their injection"
            )
        log.info("NRI: synchronized: %s", call.detail)
        session.pods, session.claimed, session.reported = [], [], 0
        session.targets, session.unresolved = [], []
        for container_id in gone:
            await self._container_gone(container_id)
        session.synchronized.set()
        return SynchronizeResponse()

    def _replace_containers(
        self,
        pods: dict[str, SyncPod],
        records: list[NodeContainer],
        unresolved: list[SyncTarget],
        facts: dict[str, ClaimFacts],
    ) -> list[str]:
        """Every container of a Synchronize into the store, with its vGPU fields; the IDs of the
        instances that ran before it and no longer do (they stopped or went while the plugin was
        away), when anyone listens. A container whose pod was not reported at all has no pod UID to be
        found by: left out."""
        for t in unresolved:
            pod = pods.get(t.pod_sandbox_id)
            if pod is not None:
                records.append(target_of(t, pod))
        store = self.containers
        ran = store.running_ids() if self.on_container_gone and store.synced else []
        # ClaimFacts are NodeContainer's last fields, in its order: a tuple join, not a _replace (a
        # node may run thousands of vGPU containers)
        cut, new, get = RUNTIME_FIELDS, tuple.__new__, facts.get
        store.replace(
            [r if (f := get(r.container_id)) is None else new(NodeContainer, r[:cut] + f) for r in records]
        )
        by_id = store.by_id
        return [cid for cid in ran if (now := by_id(cid)) is None or not now.running]

    def _count_invalid(self, container: SyncContainer, reason: str, invalid_before: int) -> None:
        """A Synchronize container that is not cached: counted, and logged up to a limit."""
        self.stats.sync_invalid += 1
        if self.stats.sync_invalid - invalid_before <= SYNC_WARNINGS_SHOWN:  # a node may have thousands
            log.warning(
                "NRI: Synchronize: container %s (%s) not cached: %s", container.name, container.id, reason
            )

    async def shutdown(self, request: Empty) -> Empty:
        log.info("NRI: the runtime asked the plugin to shut down")
        return Empty()

    async def create_container(self, request: CreateContainerRequest) -> CreateContainerResponse:
        """The session passes upb's message of the same name (`vgpud.nri.fastcodec`): only fields
        both have are read. The env holds one `MANAGER_VGPU_CLAIM_UID` however many vGPU claims the
        container uses (CDI env is applied replace-by-name: the last claim's); that claim is the one
        admitted, and the container's directory lies under its UID."""
        pod, container = request.pod or PodSandbox(), request.container or Container()
        claim_uid = env_value(container.env, ENV_CLAIM_UID)
        # a claimed container counts as refused until it is injected
        record = event_record(pod, container, running=False)._replace(
            claim_uid=claim_uid, injection=Injection.REFUSED if claim_uid else Injection.NO_CLAIM
        )
        self.containers.set(record)
        with self._timed("CreateContainer", pod, container.name, claim_uid) as call:
            if not claim_uid:
                call.outcome, call.detail = Outcome.SKIPPED, "no vGPU claim"
                self.stats.skipped += 1
                return CreateContainerResponse()
            context = ContainerContext(
                claim_uid=claim_uid,
                pod_uid=pod.uid,
                pod_name=pod.name,
                pod_namespace=pod.namespace,
                container=container.name,
            )
            try:
                async with self._admission.guard(claim_uid):
                    verdict = await self._admission.admit(claim_uid, pod.namespace, pod.uid)
                    if not verdict.inject:
                        self._refuse(call, verdict, pod, container.name, claim_uid)
                        return CreateContainerResponse()
                    plan = self.assigner.inject(context)
                    await make_directories_soon(plan)
            except (OSError, PidsFileError, ValueError) as err:
                message = (
                    f"vgpud: cannot set up the vGPU directory of container {container.name} in pod "
                    f"{pod.namespace}/{pod.name}: {err}"
                )
                log.error(
                    "NRI: %s",
                    message,
                    extra=pod_fields(pod.namespace, pod.name, container=container.name, claim=claim_uid),
                )
                self.containers.pop(container.id)  # creation fails: the runtime will not run it
                raise HookError(Code.FAILED_PRECONDITION, message) from err
            now = self.containers.by_id(container.id) or record
            self.containers.set(now._replace(injection=Injection.INJECTED, directory=plan.paths.base))
            self.stats.injected += 1
            call.detail = str(plan.paths.base)
            return CreateContainerResponse(adjust=adjustment(plan))

    def _refuse(
        self, call: TimedCall, verdict: Admission, pod: PodSandbox, container: str, claim_uid: str
    ) -> None:
        """Record and count a container that gets no injection, and say why."""
        if verdict.verdict is Verdict.OTHER_MODE:
            call.outcome, call.detail = Outcome.SKIPPED, f"{verdict.reason}: nothing injected"
            self.stats.other_mode += 1
        else:
            call.outcome, call.detail = Outcome.REJECTED, f"{verdict.reason}: nothing injected"
            if verdict.verdict is Verdict.NOT_RESERVED:
                self.stats.rejected_not_reserved += 1
            else:
                self.stats.rejected_unprepared += 1
            if self._events is not None:
                self._events.record(
                    pod_ref(pod.namespace, pod.name, pod.uid),
                    EventType.WARNING,
                    Reason.VGPU_CONTAINER_REFUSED,
                    f"container {container} gets no vGPU: {verdict.reason}",
                )
        log.warning(
            "NRI: %s/%s container %s: %s",
            pod.namespace,
            pod.name,
            container,
            call.detail,
            extra=pod_fields(pod.namespace, pod.name, container=container, claim=claim_uid),
        )

    async def update_container(self, request: UpdateContainerRequest) -> UpdateContainerResponse:
        return UpdateContainerResponse()

    async def post_start_container(self, request: PostStartContainerRequest) -> PostStartContainerResponse:
        """The container runs: its pid (a hot-plug enters its namespaces). upb's message
        (`upb_decoder`), or betterproto2's from a StateChange."""
        self._started(request.pod, request.container)
        return PostStartContainerResponse()

    async def stop_container(self, request: StopContainerRequest) -> StopContainerResponse:
        """Its process is gone (the instance stays until removed): not running, no pid."""
        pod, container = request.pod or PodSandbox(), request.container or Container()
        before = self.containers.by_id(container.id)
        self.containers.refresh(event_record(pod, container, running=False))
        if before is None or before.running:
            await self._container_gone(container.id)
        return StopContainerResponse()

    async def remove_container(self, request: RemoveContainerRequest) -> RemoveContainerResponse:
        await self._forget_container(request.pod, request.container)
        return RemoveContainerResponse()

    async def stop_pod_sandbox(self, request: StopPodSandboxRequest) -> StopPodSandboxResponse:
        await self._forget_pod(request.pod)
        return StopPodSandboxResponse()

    async def remove_pod_sandbox(self, request: RemovePodSandboxRequest) -> RemovePodSandboxResponse:
        await self._forget_pod(request.pod)
        return RemovePodSandboxResponse()

    async def state_change(self, request: StateChangeEvent) -> Empty:
        """Lifecycle events from runtimes before NRI v0.12."""
        if request.event == Event.POST_START_CONTAINER:
            self._started(request.pod, request.container)
        elif request.event == Event.REMOVE_CONTAINER:
            await self._forget_container(request.pod, request.container)
        elif request.event in (Event.STOP_POD_SANDBOX, Event.REMOVE_POD_SANDBOX):
            await self._forget_pod(request.pod)
        return Empty()

    # ---------------------------------------------------------------------------------------------

    def _timed(self, call: str, pod: PodSandbox, container: str, claim_uid: str) -> TimedCall:
        return self._recorder.timed(
            "nri",
            call,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            pod_uid=pod.uid,
            container=container,
            claim_uid=claim_uid,
        )

    def _started(self, pod: PodSandbox | None, container: Container | None) -> None:
        pod, container = pod or PodSandbox(), container or Container()
        self.containers.refresh(event_record(pod, container, running=True, pid=container.pid))

    async def _container_gone(self, container_id: str) -> None:
        """Tell the listeners; one that fails is logged, and neither the others nor the hook fail."""
        for listener in list(self.on_container_gone):
            try:
                await listener(container_id)
            except Exception:
                log.exception("NRI: a listener for the end of container %s failed", container_id)

    async def _forget_container(self, pod: PodSandbox | None, container: Container | None) -> None:
        """One instance is gone: its entries, and its directory unless another instance uses it."""
        pod, container = pod or PodSandbox(), container or Container()
        record = self.containers.pop(container.id)
        if record is None or record.running:
            await self._container_gone(container.id)
        entry = record if record is not None and record.vgpu else None
        claim_uid = entry.claim_uid if entry else env_value(container.env, ENV_CLAIM_UID)
        if not claim_uid or (
            entry is None and not self._admission.check(claim_uid, pod.namespace, pod.uid).inject
        ):
            return  # not a container vgpud injected (or one that never ran: its removal is harmless)
        with self._timed("RemoveContainer", pod, container.name, claim_uid) as call:
            users = self._directory_users(claim_uid, pod.uid, container.name)
            if users:
                call.detail = f"directory kept: used by {', '.join(users)}"
                log.info("NRI: container %s (%s) removed; %s", container.name, container.id, call.detail)
                return
            await self._remove_directory(claim_uid, pod.uid, container.name)

    async def _forget_pod(self, pod: PodSandbox | None) -> None:
        pod = pod or PodSandbox()
        records = self.containers.pop_pod(pod.uid)
        for record in records:
            if record.running:
                await self._container_gone(record.container_id)
        gone = {(record.name, record.claim_uid) for record in records if record.vgpu}
        for container, claim_uid in sorted(gone):
            with self._timed("StopPodSandbox", pod, container, claim_uid):
                await self._remove_directory(claim_uid, pod.uid, container)

    def _directory_users(self, claim_uid: str, pod_uid: str, container: str) -> list[str]:
        """The injected instances that use this container's directory (a newer instance of it)."""
        try:
            directory = self.assigner.paths(claim_uid, pod_uid, container).base
        except LayoutError:
            return []
        return self.containers.users(directory)

    async def _remove_directory(self, claim_uid: str, pod_uid: str, container: str) -> None:
        try:
            cleanup = self.assigner.remove_container(claim_uid, pod_uid, container)
        except LayoutError as err:
            log.warning("NRI: not removing the directory of %s/%s: %s", pod_uid, container, err)
            return
        for path in cleanup.paths:
            try:
                removed = await trio.to_thread.run_sync(remove_tree, Path(path))
            except OSError as err:  # a removal hook must not fail: the directory is only garbage
                log.warning("NRI: cannot remove %s: %s", path, err)
                continue
            self.stats.removed_dirs += removed


def event_record(pod: PodSandbox, container: Container, *, running: bool, pid: int = 0) -> NodeContainer:
    """A container of a lifecycle event (upb's message or betterproto2's) as a record without its vGPU
    fields; its cgroups path and device rules read now (the event's message is not kept)."""
    linux = ContainerLinux.read(container)
    return NodeContainer(container.id, pod.uid, container.name, pod.namespace, pod.name, running, pid, linux)

"""The NRI hooks: what vgpud does when containerd calls its `Plugin` service (seed §12.4-§12.12).

Transport-free: each hook takes the decoded request message and returns the response message (or
raises `HookError`, which becomes a ttrpc error status). One `NriHooks` lives as long as vgpud; its
cache survives reconnects, while the split-Synchronize buffer is per session (`begin_session`).

- CreateContainer: a container whose env carries `MANAGER_VGPU_CLAIM_UID` of a vGPU claim this node
  prepared, reserved for the container's pod, gets its own directory (created, pids.config reset) and
  the mounts and identity env of the lazy assigner. No claim UID: not ours, no change. A claim UID
  this node did not prepare, or one not reserved for the pod: nothing injected, recorded as rejected
  (a pod may set that env itself; seed §12.12.1). A claim prepared in eager mode: left to its CDI
  spec, recorded as skipped and counted. Admission and directory creation run under the claim's
  guard, so an Unprepare cannot fall between them. A directory that cannot be made: an error, so the
  container is not created (fail-closed). A container with several vGPU claims carries one claim UID
  (containerd applies CDI env replace-by-name: the last claim's): only that claim's admission is
  checked (the kubelet prepared and reserved every claim of the pod before creating a container),
  and the directory lies under that claim's UID. Prepare refuses such claims when their devices are
  on the same GPU, whose limits would replace each other (docs/decisions.md).
- Synchronize: the cache is rebuilt from the containers' env with the same validation; a container
  that does not validate is skipped and counted, and the sync itself still succeeds. A valid live
  one whose mounts and env lack the injection (created while vgpud was down, or after the runtime
  dropped the plugin for a missed deadline) is not cached but kept as not injected: one WARNING line
  each, the metrics and the debug state show it. Eviction would let the kubelet recreate it, but the
  NRI runtime adaptation drops a plugin's eviction requests (v0.6.1 through v0.12.5; docs/decisions.md).
- RemoveContainer / StopPodSandbox / RemovePodSandbox, as dedicated RPCs (NRI v0.12) or as
  StateChange events (older runtimes): the instance's cache entry goes, and its directory once no
  other cached instance of the container uses it (seed §12.10; a stale instance can be removed
  while a newer one runs).

Every container, vGPU or not, is also kept in `targets` (`vgpud.nri.targets`: what a hot-plug needs
of its target, issue 18): replaced by each Synchronize, added by CreateContainer (not running yet),
marked running with its pid by PostStartContainer (a StateChange event before NRI v0.12), not
running by StopContainer, and dropped by RemoveContainer / StopPodSandbox / RemovePodSandbox. The
`on_container_gone` listeners hear of each instance once, when it stops or goes (whichever comes
first; also when a Synchronize after a reconnect no longer reports it running). They run inside the
hook, while the runtime waits (and holds its NRI lock): a listener must be quick and must not call
the runtime (`vgpud.nri.runtime_link`) itself; its errors are logged, never the hook's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import betterproto2
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
    PostCreateContainerRequest,
    PostCreateContainerResponse,
    PostStartContainerRequest,
    PostStartContainerResponse,
    PostUpdateContainerRequest,
    PostUpdateContainerResponse,
    PostUpdatePodSandboxRequest,
    PostUpdatePodSandboxResponse,
    RemoveContainerRequest,
    RemoveContainerResponse,
    RemovePodSandboxRequest,
    RemovePodSandboxResponse,
    RunPodSandboxRequest,
    RunPodSandboxResponse,
    StartContainerRequest,
    StartContainerResponse,
    StateChangeEvent,
    StopContainerRequest,
    StopContainerResponse,
    StopPodSandboxRequest,
    StopPodSandboxResponse,
    SynchronizeResponse,
    UpdateContainerRequest,
    UpdateContainerResponse,
    UpdatePodSandboxRequest,
    UpdatePodSandboxResponse,
)
from vgpud.fsutil import remove_tree
from vgpud.nri.adjust import adjustment, make_directories_soon
from vgpud.nri.cache import (
    CacheEntry,
    NotInjected,
    NotInjectedContainers,
    NriCache,
    RuntimeContainer,
    RuntimeContainers,
)
from vgpud.nri.envs import env_value
from vgpud.nri.events import WANTED_EVENTS, event_mask, known_events_mask
from vgpud.nri.fastcodec import decode_create_container, encode_create_container, upb_decoder
from vgpud.nri.session import NriSessionState, NriStats, SessionState
from vgpud.nri.sync import (
    SyncBatch,
    SyncContainer,
    SyncPod,
    SyncTarget,
    decode_sync,
    gc_paused,
    target_of,
)
from vgpud.nri.targets import ContainerLinux, TargetContainer, TargetContainers
from vgpud.nri.ttrpc import Code
from vgpud.nri.verify import missing_injection
from vgpud.partition.admission import Admission, ClaimAdmission, Verdict
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import ENV_CLAIM_UID, LayoutError, PartitionPaths
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.pidsfile import PidsFileError
from vgpud.recorder import Outcome, Recorder, TimedCall
from vgpud.wire import parse_strict

log = logging.getLogger("vgpud.nri")

#: per-container warnings one Synchronize logs; beyond that only the count in its summary line
SYNC_WARNINGS_SHOWN = 10


class HookError(Exception):
    """A hook failure the runtime must see (a ttrpc error status)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


Handler = Callable[[Any], Awaitable[betterproto2.Message]]
#: request bytes -> the message a handler takes; MalformedMessage for bytes that are not one
Decoder = Callable[[bytes], Any]
#: a handler's response -> its bytes
Encoder = Callable[[betterproto2.Message], bytes]
#: told the ID of a container instance that stopped or went away
GoneListener = Callable[[str], Awaitable[None]]


def _strict(message_type: type[betterproto2.Message]) -> Decoder:
    return partial(parse_strict, message_type=message_type)


class NriHooks:
    def __init__(
        self,
        *,
        assigner: LazyAssigner,
        admission: ClaimAdmission,
        recorder: Recorder,
        cache: NriCache | None = None,
    ) -> None:
        self.assigner = assigner
        self.cache = cache if cache is not None else NriCache()
        #: what the runtime reported (for the drift self-check; never decides anything)
        self.runtime = RuntimeContainers()
        #: running vGPU containers without the injection, as the last Synchronize found them
        self.not_injected = NotInjectedContainers()
        #: every container the runtime reported, vGPU or not (the hot-plug's targets)
        self.targets = TargetContainers()
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
        self._session = SessionState()
        #: bare method name -> (decoder of the request bytes, handler)
        self.methods: dict[str, tuple[Decoder, Handler]] = {
            "Configure": (_strict(ConfigureRequest), self.configure),
            "Synchronize": (decode_sync, self.synchronize),
            "Shutdown": (_strict(Empty), self.shutdown),
            "CreateContainer": (decode_create_container, self.create_container),
            "UpdateContainer": (_strict(UpdateContainerRequest), self.update_container),
            "PostStartContainer": (upb_decoder(PostStartContainerRequest), self.post_start_container),
            "StopContainer": (upb_decoder(StopContainerRequest), self.stop_container),
            "RemoveContainer": (_strict(RemoveContainerRequest), self.remove_container),
            "StopPodSandbox": (_strict(StopPodSandboxRequest), self.stop_pod_sandbox),
            "RemovePodSandbox": (_strict(RemovePodSandboxRequest), self.remove_pod_sandbox),
            "StateChange": (_strict(StateChangeEvent), self.state_change),
            **{name: (_strict(request), _acknowledge(response)) for name, request, response in _NO_OP_EVENTS},
        }
        #: bare method name -> the encoder of its response, where it is not `bytes` (betterproto2's)
        self.encoders: dict[str, Encoder] = {"CreateContainer": encode_create_container}  # type: ignore[dict-item]

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
            entries, not_injected, runtime = self._rebuild(pods, session.claimed)
            self.cache.replace(entries)
            self.not_injected.replace(not_injected)
            self._warn_not_injected()
            self.runtime.replace(runtime)
            gone = self._replace_targets(pods, session.targets, session.unresolved)
            self._last_sync_time = time.time()
            self.stats.sync_reported = session.reported
            self.stats.sync_rebuilt = len(entries)
            invalid = len(session.claimed) - len(entries) - len(not_injected)
            call.detail = (
                f"{len(entries)} vGPU containers of {session.reported}, {invalid} not valid here, "
                f"{len(not_injected)} without their injection"
            )
        log.info("NRI: synchronized: %s", call.detail)
        session.pods, session.claimed, session.reported = [], [], 0
        session.targets, session.unresolved = [], []
        for container_id in gone:
            await self._container_gone(container_id)
        session.synchronized.set()
        return SynchronizeResponse()

    def _replace_targets(
        self,
        pods: dict[str, SyncPod],
        targets: list[tuple[str, TargetContainer]],
        unresolved: list[SyncTarget],
    ) -> list[str]:
        """Every container of a Synchronize into `targets`; the IDs of the instances that ran before
        it and no longer do (they stopped or went while the plugin was away), when anyone listens.
        A container whose pod was not reported at all has no pod UID to be found by: left out."""
        for t in unresolved:
            pod = pods.get(t.pod_sandbox_id)
            if pod is not None:
                targets.append((t.id, target_of(t, pod)))
        ran = self.targets.running_ids() if self.on_container_gone and self.targets.synced else []
        self.targets.replace(targets)
        by_id = self.targets.by_id
        return [cid for cid in ran if (now := by_id(cid)) is None or not now.running]

    def _rebuild(
        self, by_id: dict[str, SyncPod], claimed: list[SyncContainer]
    ) -> tuple[
        list[tuple[str, CacheEntry]], list[tuple[str, NotInjected]], list[tuple[str, RuntimeContainer]]
    ]:
        """(cache entries, containers without their injection, what the runtime runs) of a Synchronize,
        by container ID, from the containers with a claim UID in their env and the pods by sandbox ID.
        One pass of string work per container: a node reports thousands."""
        entries: list[tuple[str, CacheEntry]] = []
        not_injected: list[tuple[str, NotInjected]] = []
        runtime: list[tuple[str, RuntimeContainer]] = []
        invalid_before = self.stats.sync_invalid
        layout, check = self.assigner.layout, self._admission.check
        for container in claimed:
            claim_uid = container.claim_uid
            pod = by_id.get(container.pod_sandbox_id)
            if pod is None:
                reason = f"its pod sandbox {container.pod_sandbox_id} was not reported"
                self._count_invalid(container, reason, invalid_before)
                continue
            runtime.append(
                (container.id, RuntimeContainer(pod.uid, container.name, claim_uid, pod.namespace, pod.name))
            )
            verdict = check(claim_uid, pod.namespace, pod.uid)
            try:
                base = layout.container_dir_text(claim_uid, pod.uid, container.name)
            except LayoutError as err:
                self._count_invalid(container, str(err), invalid_before)
                continue
            # a pod that joined the claim after Prepare, before the claim watch of this run has
            # listed: its directory proves an earlier admission (a refused pod never gets one)
            joined = verdict.verdict is Verdict.NOT_RESERVED and os.path.isdir(base)
            if not (verdict.inject or joined):
                self._count_invalid(container, verdict.reason, invalid_before)
                continue
            paths = PartitionPaths.of(base)
            # an exited container runs nothing that could register: only live ones are checked,
            # against the injection (built only for them: most of the per-container time)
            missing: tuple[str, ...] = ()
            if not container.stopped:
                ctx = ContainerContext(claim_uid, pod.uid, pod.name, pod.namespace, container.name)
                env, mounts = self.assigner.injection(ctx, paths)
                missing = missing_injection(mounts, env, container.mounts, container.env)
            if missing:
                found = NotInjected(
                    pod.uid, container.name, claim_uid, pod.namespace, pod.name, paths.base, missing
                )
                not_injected.append((container.id, found))
            else:
                entries.append((container.id, CacheEntry(pod.uid, container.name, claim_uid, paths.base)))
        return entries, not_injected, runtime

    def _count_invalid(self, container: SyncContainer, reason: str, invalid_before: int) -> None:
        """A Synchronize container that is not cached: counted, and logged up to a limit."""
        self.stats.sync_invalid += 1
        if self.stats.sync_invalid - invalid_before <= SYNC_WARNINGS_SHOWN:  # a node may have thousands
            log.warning(
                "NRI: Synchronize: container %s (%s) not cached: %s", container.name, container.id, reason
            )

    def _warn_not_injected(self) -> None:
        """One WARNING line per container found without its injection (once, not per Synchronize), for
        the first SYNC_WARNINGS_SHOWN new ones, then one line with how many more: a node may have
        thousands, and every one is in the debug state and the metric."""
        found_now = self.not_injected.items()  # sorted: one sort, not one per use
        current = {cid for cid, _ in found_now}
        new = [(cid, found) for cid, found in found_now if cid not in self._warned_not_injected]
        for cid, found in new[:SYNC_WARNINGS_SHOWN]:
            log.warning(
                "NRI: container %s (%s) of pod %s/%s runs without its vGPU injection (missing %s): it "
                "was created while vgpud was away; the runtime cannot evict it, recreate its pod",
                found.container,
                cid,
                found.pod_namespace,
                found.pod_name,
                ", ".join(found.missing),
            )
        if len(new) > SYNC_WARNINGS_SHOWN:
            log.warning(
                "NRI: %d more containers run without their vGPU injection (not listed here): "
                "`vgpud debug state` lists every one under nri.not_injected",
                len(new) - SYNC_WARNINGS_SHOWN,
            )
        self._warned_not_injected = current

    async def shutdown(self, request: Empty) -> Empty:
        log.info("NRI: the runtime asked the plugin to shut down")
        return Empty()

    async def create_container(self, request: CreateContainerRequest) -> CreateContainerResponse:
        """The session passes upb's message of the same name (`vgpud.nri.fastcodec`): only fields
        both have are read. The env holds one `MANAGER_VGPU_CLAIM_UID` however many vGPU claims the
        container uses (CDI env is applied replace-by-name: the last claim's); that claim is the one
        admitted, and the container's directory lies under its UID."""
        pod, container = request.pod or PodSandbox(), request.container or Container()
        self.targets.set(container.id, event_target(pod, container, running=False))
        claim_uid = env_value(container.env, ENV_CLAIM_UID)
        with self._timed("CreateContainer", pod, container.name, claim_uid) as call:
            if not claim_uid:
                call.outcome, call.detail = Outcome.SKIPPED, "no vGPU claim"
                self.stats.skipped += 1
                return CreateContainerResponse()
            self.runtime.set(
                container.id, RuntimeContainer(pod.uid, container.name, claim_uid, pod.namespace, pod.name)
            )
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
                        self._refuse(call, verdict, pod, container.name)
                        return CreateContainerResponse()
                    plan = self.assigner.inject(context)
                    await make_directories_soon(plan)
            except (OSError, PidsFileError, ValueError) as err:
                message = (
                    f"vgpud: cannot set up the vGPU directory of container {container.name} in pod "
                    f"{pod.namespace}/{pod.name}: {err}"
                )
                log.error("NRI: %s", message)
                self.runtime.pop(container.id)  # creation fails: the runtime will not run it
                self.targets.pop(container.id)
                raise HookError(Code.FAILED_PRECONDITION, message) from err
            self.cache.set(container.id, CacheEntry(pod.uid, container.name, claim_uid, plan.paths.base))
            self.stats.injected += 1
            call.detail = str(plan.paths.base)
            return CreateContainerResponse(adjust=adjustment(plan))

    def _refuse(self, call: TimedCall, verdict: Admission, pod: PodSandbox, container: str) -> None:
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
        log.warning("NRI: %s/%s container %s: %s", pod.namespace, pod.name, container, call.detail)

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
        before = self.targets.by_id(container.id)
        self.targets.set(container.id, event_target(pod, container, running=False))
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
        self.targets.set(container.id, event_target(pod, container, running=True, pid=container.pid))

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
        target = self.targets.pop(container.id)
        if target is None or target.running:
            await self._container_gone(container.id)
        self.runtime.pop(container.id)
        self.not_injected.pop(container.id)
        entry = self.cache.pop(container.id)
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
        for container_id, target in self.targets.pop_pod(pod.uid):
            if target.running:
                await self._container_gone(container_id)
        self.runtime.pop_pod(pod.uid)
        self.not_injected.pop_pod(pod.uid)
        gone = {(entry.container, entry.claim_uid) for _, entry in self.cache.pop_pod(pod.uid)}
        for container, claim_uid in sorted(gone):
            with self._timed("StopPodSandbox", pod, container, claim_uid):
                await self._remove_directory(claim_uid, pod.uid, container)

    def _directory_users(self, claim_uid: str, pod_uid: str, container: str) -> list[str]:
        """The cached instances that use this container's directory (a newer instance of it)."""
        try:
            directory = self.assigner.paths(claim_uid, pod_uid, container).base
        except LayoutError:
            return []
        return self.cache.uses(directory)

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


_NO_OP_EVENTS = (
    ("RunPodSandbox", RunPodSandboxRequest, RunPodSandboxResponse),
    ("UpdatePodSandbox", UpdatePodSandboxRequest, UpdatePodSandboxResponse),
    ("PostUpdatePodSandbox", PostUpdatePodSandboxRequest, PostUpdatePodSandboxResponse),
    ("PostCreateContainer", PostCreateContainerRequest, PostCreateContainerResponse),
    ("StartContainer", StartContainerRequest, StartContainerResponse),
    ("PostUpdateContainer", PostUpdateContainerRequest, PostUpdateContainerResponse),
)


def event_target(pod: PodSandbox, container: Container, *, running: bool, pid: int = 0) -> TargetContainer:
    """A container of a lifecycle event (upb's message or betterproto2's) as a target; its cgroups path
    and device rules read now (the event's message is not kept)."""
    linux = ContainerLinux(container)
    linux.facts()
    return TargetContainer(
        container.id, pod.uid, container.name, pod.namespace, pod.name, running, pid, linux
    )


def _acknowledge(response: type[betterproto2.Message]) -> Handler:
    """A handler for an event vgpud does not act on: an empty reply (never subscribed, but harmless)."""

    async def handler(request: Any) -> betterproto2.Message:
        return response()

    return handler

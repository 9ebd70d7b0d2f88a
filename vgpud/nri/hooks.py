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
  container is not created (fail-closed).
- Synchronize: the cache is rebuilt from the containers' env with the same validation; a container
  that does not validate is skipped and counted, and the sync itself still succeeds.
- RemoveContainer / StopPodSandbox / RemovePodSandbox, as dedicated RPCs (NRI v0.12) or as
  StateChange events (older runtimes): the cache entries go and the per-container directories with
  them (seed §12.10).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
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
from vgpud.nri.adjust import adjustment, make_directories
from vgpud.nri.cache import CacheEntry, NriCache, RuntimeContainer, RuntimeContainers
from vgpud.nri.envs import env_value
from vgpud.nri.events import WANTED_EVENTS, event_mask, known_events_mask
from vgpud.nri.session import NriSessionState, NriStats, SessionState
from vgpud.nri.sync import SyncBatch, SyncContainer, SyncPod, decode_sync
from vgpud.nri.ttrpc import Code
from vgpud.partition.admission import Admission, ClaimAdmission, Verdict
from vgpud.partition.assigner import ContainerContext
from vgpud.partition.layout import ENV_CLAIM_UID, LayoutError
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
            "CreateContainer": (_strict(CreateContainerRequest), self.create_container),
            "UpdateContainer": (_strict(UpdateContainerRequest), self.update_container),
            "StopContainer": (_strict(StopContainerRequest), self.stop_container),
            "RemoveContainer": (_strict(RemoveContainerRequest), self.remove_container),
            "StopPodSandbox": (_strict(StopPodSandboxRequest), self.stop_pod_sandbox),
            "RemovePodSandbox": (_strict(RemovePodSandboxRequest), self.remove_pod_sandbox),
            "StateChange": (_strict(StateChangeEvent), self.state_change),
            **{name: (_strict(request), _acknowledge(response)) for name, request, response in _NO_OP_EVENTS},
        }

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
        mask = event_mask(WANTED_EVENTS) & known_events_mask(request.NRI_version)
        log.info(
            "NRI: configured by %s (NRI %s), events 0x%x",
            session.runtime or "a runtime",
            request.NRI_version or "<= v0.11",
            mask,
        )
        return ConfigureResponse(events=mask)

    async def synchronize(self, request: SyncBatch) -> SynchronizeResponse:
        """Rebuild the cache from every container; a split request is answered `more` until the last."""
        session = self._session
        session.pods.extend(request.pods)
        session.containers.extend(request.containers)
        if request.more:
            return SynchronizeResponse(more=True)
        with self._recorder.timed("nri", "Synchronize") as call:
            entries = list(self._rebuild(session.pods, session.containers))
            self.cache.replace(entries)
            self.runtime.replace(_runtime_containers(session.pods, session.containers))
            self._last_sync_time = time.time()
            self.stats.sync_reported = len(session.containers)
            self.stats.sync_rebuilt = len(entries)
            invalid = len([c for c in session.containers if env_value(c.env, ENV_CLAIM_UID)]) - len(entries)
            call.detail = (
                f"{len(entries)} vGPU containers of {len(session.containers)}, {invalid} not valid here"
            )
        log.info("NRI: synchronized: %s", call.detail)
        session.pods, session.containers = [], []
        session.synchronized.set()
        return SynchronizeResponse()

    def _rebuild(
        self, pods: list[PodSandbox], containers: list[Container]
    ) -> Iterable[tuple[str, str, CacheEntry]]:
        by_id = {pod.id: pod for pod in pods}
        invalid_before = self.stats.sync_invalid
        for container in containers:
            claim_uid = env_value(container.env, ENV_CLAIM_UID)
            if not claim_uid:
                continue
            pod = by_id.get(container.pod_sandbox_id)
            reason = ""
            if pod is None:
                reason = f"its pod sandbox {container.pod_sandbox_id} was not reported"
            else:
                verdict = self._admission.check(claim_uid, pod.namespace, pod.uid)
                try:
                    paths = self.assigner.paths(claim_uid, pod.uid, container.name)
                except LayoutError as err:
                    reason = str(err)
                else:
                    # a pod that joined the claim after Prepare, before the claim watch of this run has
                    # listed: its directory proves an earlier admission (a refused pod never gets one)
                    joined = verdict.verdict is Verdict.NOT_RESERVED and Path(paths.base).is_dir()
                    if verdict.inject or joined:
                        yield pod.uid, container.name, CacheEntry(claim_uid, paths.base)
                        continue
                    reason = verdict.reason
            self.stats.sync_invalid += 1
            if self.stats.sync_invalid - invalid_before <= SYNC_WARNINGS_SHOWN:  # a node may have thousands
                log.warning(
                    "NRI: Synchronize: container %s (%s) not cached: %s", container.name, container.id, reason
                )

    async def shutdown(self, request: Empty) -> Empty:
        log.info("NRI: the runtime asked the plugin to shut down")
        return Empty()

    async def create_container(self, request: CreateContainerRequest) -> CreateContainerResponse:
        pod, container = request.pod or PodSandbox(), request.container or Container()
        claim_uid = env_value(container.env, ENV_CLAIM_UID)
        with self._timed("CreateContainer", pod, container.name, claim_uid) as call:
            if not claim_uid:
                call.outcome, call.detail = Outcome.SKIPPED, "no vGPU claim"
                self.stats.skipped += 1
                return CreateContainerResponse()
            self.runtime.set(pod.uid, container.name, RuntimeContainer(claim_uid, pod.namespace, pod.name))
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
                    await trio.to_thread.run_sync(make_directories, plan)
            except (OSError, PidsFileError, ValueError) as err:
                message = (
                    f"vgpud: cannot set up the vGPU directory of container {container.name} in pod "
                    f"{pod.namespace}/{pod.name}: {err}"
                )
                log.error("NRI: %s", message)
                self.runtime.pop(pod.uid, container.name)  # creation fails: the runtime will not run it
                raise HookError(Code.FAILED_PRECONDITION, message) from err
            self.cache.set(pod.uid, container.name, CacheEntry(claim_uid, plan.paths.base))
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

    async def stop_container(self, request: StopContainerRequest) -> StopContainerResponse:
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
        if request.event == Event.REMOVE_CONTAINER:
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

    async def _forget_container(self, pod: PodSandbox | None, container: Container | None) -> None:
        pod, container = pod or PodSandbox(), container or Container()
        self.runtime.pop(pod.uid, container.name)
        entry = self.cache.pop(pod.uid, container.name)
        claim_uid = entry.claim_uid if entry else env_value(container.env, ENV_CLAIM_UID)
        if not claim_uid or (
            entry is None and not self._admission.check(claim_uid, pod.namespace, pod.uid).inject
        ):
            return  # not a container vgpud injected (or one that never ran: its removal is harmless)
        with self._timed("RemoveContainer", pod, container.name, claim_uid):
            await self._remove_directory(claim_uid, pod.uid, container.name)

    async def _forget_pod(self, pod: PodSandbox | None) -> None:
        pod = pod or PodSandbox()
        self.runtime.pop_pod(pod.uid)
        for container, entry in self.cache.pop_pod(pod.uid):
            with self._timed("StopPodSandbox", pod, container, entry.claim_uid):
                await self._remove_directory(entry.claim_uid, pod.uid, container)

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


def _runtime_containers(
    pods: list[SyncPod], containers: list[SyncContainer]
) -> Iterable[tuple[str, str, RuntimeContainer]]:
    """Every container of a Synchronize with a claim UID in its env and a reported pod."""
    by_id = {pod.id: pod for pod in pods}
    for container in containers:
        claim_uid = env_value(container.env, ENV_CLAIM_UID)
        pod = by_id.get(container.pod_sandbox_id)
        if claim_uid and pod is not None:
            yield pod.uid, container.name, RuntimeContainer(claim_uid, pod.namespace, pod.name)


_NO_OP_EVENTS = (
    ("RunPodSandbox", RunPodSandboxRequest, RunPodSandboxResponse),
    ("UpdatePodSandbox", UpdatePodSandboxRequest, UpdatePodSandboxResponse),
    ("PostUpdatePodSandbox", PostUpdatePodSandboxRequest, PostUpdatePodSandboxResponse),
    ("PostCreateContainer", PostCreateContainerRequest, PostCreateContainerResponse),
    ("StartContainer", StartContainerRequest, StartContainerResponse),
    ("PostStartContainer", PostStartContainerRequest, PostStartContainerResponse),
    ("PostUpdateContainer", PostUpdateContainerRequest, PostUpdateContainerResponse),
)


def _acknowledge(response: type[betterproto2.Message]) -> Handler:
    """A handler for an event vgpud does not act on: an empty reply (never subscribed, but harmless)."""

    async def handler(request: Any) -> betterproto2.Message:
        return response()

    return handler

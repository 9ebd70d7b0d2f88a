"""The kubelet-facing gRPC services: plugin registration, the DRA node service (v1 and v1beta1), and
the DRA resource-health stream.

The node service is one implementation (`DraDriver`) behind two wire versions that differ only in
`Device.share_id` (v1). Handlers run on grpclib's asyncio side and call the Trio driver through
trio-asyncio. Every reply has an entry for every claim (the kubelet treats a missing one as an
error); per-claim failures go into the entry, so the whole call fails only at the transport level.

The health stream (`v1alpha1.DRAResourceHealth/NodeWatchResources`) reports the health board with the
NVMLDeviceHealthCheck gate on; the kubelet puts it into `allocatedResourcesStatus` of each container
using a device.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import grpclib
import grpclib.const
import trio
import trio_asyncio
from grpclib.client import Channel

from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1
from vgpud._pb.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationBase,
    RegistrationStatus,
    RegistrationStatusResponse,
    RegistrationStub,
)
from vgpud._pb.v1alpha1 import (
    DeviceHealth,
    DeviceIdentifier,
    DraResourceHealthBase,
    HealthStatus,
    NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
)
from vgpud.dra.checkpoint import PreparedDevice
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import PrepareOutcome
from vgpud.dra.driver import DraDriver
from vgpud.gpu.health import HealthBoard
from vgpud.logs import fields

log = logging.getLogger("vgpud.dra")

PLUGIN_TYPE = "DRAPlugin"
#: the kubelet (1.34+) picks the first entry it supports, so v1 comes first
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: advertised last when the health stream is served (its package is the bare "v1alpha1")
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
#: the kubelet stamps each report with the time it arrives and calls a device's health Unknown once
#: that is older than this (its default is 30 s)
HEALTH_CHECK_TIMEOUT_S = 60
#: the complete list goes out at least this often, so a quiet board never reads as Unknown
HEALTH_RESEND_INTERVAL_S = 20.0
#: the API's limit on a device health message
MAX_HEALTH_MESSAGE = 1024
NO_HEALTH = "vgpud does not report device health"


class RegistrationService(RegistrationBase):
    """What the kubelet's plugin watcher asks on `<driver>-reg.sock`. With `health_service` the
    health stream is advertised too: kubelets after 1.36 open it only when it is."""

    def __init__(self, driver_name: str, dra_socket: Path, *, health_service: bool = False) -> None:
        self._info = PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=str(dra_socket),
            supported_versions=[*SUPPORTED_VERSIONS, *([HEALTH_SERVICE] if health_service else [])],
        )
        #: the kubelet's last word on our registration: None until it says something
        self.registered: bool | None = None
        self.last_error = ""

    async def get_info(self, message: InfoRequest) -> PluginInfo:
        return self._info

    async def notify_registration_status(self, message: RegistrationStatus) -> RegistrationStatusResponse:
        self.registered, self.last_error = message.plugin_registered, message.error
        if message.plugin_registered:
            log.info("kubelet registered DRA plugin %s (endpoint %s)", self._info.name, self._info.endpoint)
        else:
            log.error("kubelet REFUSED DRA plugin %s: %s", self._info.name, message.error or "(no reason)")
        return RegistrationStatusResponse()


def _batch_fields(refs: list[ClaimRef]) -> dict[str, Any]:
    """The log fields of a whole call: its claim when it has one, its namespace when they share one."""
    if len(refs) == 1:
        return refs[0].log_fields()
    namespaces = {ref.namespace for ref in refs}
    return fields(namespace=namespaces.pop()) if len(namespaces) == 1 else {}


def _claim_refs(message: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in message.claims]


def _unexpected(ref: ClaimRef, err: Exception) -> str:
    return f"claim {ref.namespace}/{ref.name}: unexpected error: {type(err).__name__}: {err}"


def _node_service(pb: ModuleType, with_share_id: bool) -> type:
    """The DraPluginBase implementation for one wire version (`pb` is its generated module)."""

    def device(prepared: PreparedDevice) -> Any:
        fields: dict[str, Any] = dict(
            request_names=list(prepared.request_names),
            pool_name=prepared.pool,
            device_name=prepared.device,
            cdi_device_ids=list(prepared.cdi_device_ids),
        )
        if with_share_id and prepared.share_id:
            fields["share_id"] = prepared.share_id
        return pb.Device(**fields)

    def prepare_entry(outcome: PrepareOutcome) -> Any:
        if outcome.error:
            return pb.NodePrepareResourceResponse(error=outcome.error)
        return pb.NodePrepareResourceResponse(devices=[device(d) for d in outcome.devices])

    class NodeService(pb.DraPluginBase):
        def __init__(self, driver: DraDriver) -> None:
            self._driver = driver

        async def node_prepare_resources(self, message: Any) -> Any:
            refs = _claim_refs(message)
            try:
                outcomes = await trio_asyncio.trio_as_aio(self._driver.prepare)(refs) if refs else {}
            except Exception as err:  # a driver bug must still name every claim, never "Unknown"
                log.exception("NodePrepareResources failed", extra=_batch_fields(refs))
                outcomes = {ref.uid: PrepareOutcome(error=_unexpected(ref, err)) for ref in refs}
            return pb.NodePrepareResourcesResponse(
                claims={ref.uid: prepare_entry(outcomes[ref.uid]) for ref in refs}
            )

        async def node_unprepare_resources(self, message: Any) -> Any:
            refs = _claim_refs(message)
            try:
                errors = await trio_asyncio.trio_as_aio(self._driver.unprepare)(refs) if refs else {}
            except Exception as err:  # as above
                log.exception("NodeUnprepareResources failed", extra=_batch_fields(refs))
                errors = {ref.uid: _unexpected(ref, err) for ref in refs}
            return pb.NodeUnprepareResourcesResponse(
                claims={ref.uid: pb.NodeUnprepareResourceResponse(error=errors[ref.uid]) for ref in refs}
            )

    NodeService.__name__ = NodeService.__qualname__ = f"DraNodeService{pb.__name__.rsplit('.', 1)[-1]}"
    return NodeService


DraNodeServiceV1 = _node_service(dra_v1, with_share_id=True)
DraNodeServiceV1beta1 = _node_service(dra_v1beta1, with_share_id=False)


class DeviceHealthService(DraResourceHealthBase):
    """`v1alpha1.DRAResourceHealth`, which kubelets with ResourceHealthStatus (on by default in 1.36)
    open on every DRA plugin, advertised or not.

    With a health board (the NVMLDeviceHealthCheck gate): on open, the complete device list (pool =
    the slice's pool, device = `vgpu-<minor>`), then the complete list again on every board change and
    every `resend_interval` (the kubelet forgets a report after `HEALTH_CHECK_TIMEOUT_S`); a stream ends
    when the kubelet goes away or the server stops. Without one, a well-formed UNIMPLEMENTED (an
    unregistered method gets a reply without content-type, which grpc-go reports as a malformed header)."""

    def __init__(
        self,
        board: HealthBoard | None = None,
        *,
        pool: str = "",
        devices: Mapping[str, str] | None = None,
        resend_interval: float = HEALTH_RESEND_INTERVAL_S,
    ) -> None:
        """`devices`: GPU UUID -> DRA device name, in the order reported (`slicebuild.device_names`)."""
        self._board = board
        self._pool = pool
        self._devices = dict(devices or {})
        self._resend_interval = resend_interval
        #: how many streams are open right now
        self.open_streams = 0

    async def node_watch_resources(
        self, message: NodeWatchResourcesRequest
    ) -> AsyncIterator[NodeWatchResourcesResponse]:
        board = self._board
        if board is None:
            raise grpclib.GRPCError(grpclib.const.Status.UNIMPLEMENTED, NO_HEALTH)
        self.open_streams += 1
        log.info("kubelet opened the device health stream")
        try:
            seen = board.version
            yield self.report(board)
            while True:
                seen = await trio_asyncio.trio_as_aio(self._next_report)(board, seen)
                yield self.report(board)
        except asyncio.CancelledError:
            # grpclib cancels the handler when the client resets the stream and when the server
            # closes. Ending here, not re-raising, lets grpclib end the stream with OK where the
            # connection still stands: the kubelet then reopens it at once instead of waiting on a
            # silent stream (a cancelled handler gets no end of stream at all).
            return
        finally:
            self.open_streams -= 1
            log.info("device health stream closed")

    async def _next_report(self, board: HealthBoard, seen: int) -> int:
        """(Trio) The board's version once it changes, or `seen` after the resend interval."""
        with trio.move_on_after(self._resend_interval):
            return await board.wait_changed(seen)
        return seen

    def report(self, board: HealthBoard) -> NodeWatchResourcesResponse:
        """Every device's health as the board has it now."""
        snapshot = board.snapshot()
        return NodeWatchResourcesResponse(
            devices=[
                DeviceHealth(
                    device=DeviceIdentifier(pool_name=self._pool, device_name=name),
                    health=HealthStatus.HEALTHY if health.healthy else HealthStatus.UNHEALTHY,
                    last_updated_time=int(health.since),
                    health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S,
                    message=health.reason[:MAX_HEALTH_MESSAGE],
                )
                for uuid, name in self._devices.items()
                if (health := snapshot.get(uuid)) is not None
            ]
        )


def node_services(driver: DraDriver, health: DeviceHealthService | None = None) -> list[object]:
    """Both wire versions of the node service, and the device-health stream (by default the one
    without a board: UNIMPLEMENTED), on the DRA socket."""
    return [DraNodeServiceV1(driver), DraNodeServiceV1beta1(driver), health or DeviceHealthService()]


def probes(registration_socket: Path, dra_socket: Path) -> list[Callable[[], Awaitable[None]]]:
    """The health checks the reference drivers do: GetInfo on the registration socket and an empty
    NodePrepareResources on the DRA socket (asyncio coroutines, for the health service)."""

    async def registration_answers() -> None:
        channel = Channel(path=str(registration_socket))
        try:
            await RegistrationStub(channel).get_info(InfoRequest())
        finally:
            channel.close()

    async def dra_answers() -> None:
        channel = Channel(path=str(dra_socket))
        try:
            await dra_v1.DraPluginStub(channel).node_prepare_resources(dra_v1.NodePrepareResourcesRequest())
        finally:
            channel.close()

    return [registration_answers, dra_answers]

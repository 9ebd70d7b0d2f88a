"""gRPC health service (`grpc.health.v1.Health`) for the kubelet's startup and liveness probes.

Services `""` and `liveness` are known (a kubelet gRPC probe names `liveness`); any other name is
NOT_FOUND, as in the reference drivers. SERVING requires every supervised component that counts for
health to be HEALTHY and every probe to pass: the probes call GetInfo and an empty
NodePrepareResources on our own sockets, so a wedged server is caught even when its task is alive.
The handlers run on the asyncio side of trio-asyncio, so probes are asyncio coroutines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpclib
import grpclib.const
from grpclib.client import Channel

from vgpud._pb.grpc.health.v1 import (
    HealthBase,
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
    HealthStub,
)
from vgpud.componenthealth import HealthRegistry

log = logging.getLogger("vgpud.health")

SERVICES = frozenset({"", "liveness"})
PROBE_TIMEOUT = 1.0
WATCH_INTERVAL = 1.0

#: A probe returns on success and raises (any exception) with the reason on failure.
Probe = Callable[[], Awaitable[None]]


class HealthService(HealthBase):
    def __init__(
        self,
        registry: HealthRegistry,
        probes: Sequence[Probe] = (),
        *,
        watch_interval: float = WATCH_INTERVAL,
    ) -> None:
        self._registry = registry
        self._probes = tuple(probes)
        self._watch_interval = watch_interval

    async def status(self) -> HealthCheckResponseServingStatus:
        """SERVING when every counted component is healthy and every probe passes."""
        if not self._registry.all_healthy():
            return HealthCheckResponseServingStatus.NOT_SERVING
        for probe in self._probes:
            try:
                await asyncio.wait_for(probe(), PROBE_TIMEOUT)
            except Exception as err:  # any failure of a probe means NOT_SERVING
                log.debug("health probe %s failed: %r", getattr(probe, "__name__", probe), err)
                return HealthCheckResponseServingStatus.NOT_SERVING
        return HealthCheckResponseServingStatus.SERVING

    async def check(self, message: HealthCheckRequest) -> HealthCheckResponse:
        _known(message.service)
        return HealthCheckResponse(status=await self.status())

    async def watch(self, message: HealthCheckRequest) -> AsyncIterator[HealthCheckResponse]:
        _known(message.service)
        last: HealthCheckResponseServingStatus | None = None
        while True:
            current = await self.status()
            if current != last:
                yield HealthCheckResponse(status=current)
                last = current
            await asyncio.sleep(self._watch_interval)


def _known(service: str) -> None:
    if service not in SERVICES:
        raise grpclib.GRPCError(grpclib.const.Status.NOT_FOUND, f"unknown service {service!r}")


async def check_remote(host: str, port: int, service: str, seconds: float) -> str:
    """One Check against a running vgpud: the status name, or UNREACHABLE / the gRPC error."""
    channel = Channel(host, port)
    try:
        response = await HealthStub(channel).check(HealthCheckRequest(service=service), timeout=seconds)
    except grpclib.GRPCError as err:
        return f"{err.status.name}: {err.message}"
    except (OSError, TimeoutError) as err:
        return f"UNREACHABLE: {err!r}"
    finally:
        channel.close()
    return HealthCheckResponseServingStatus(response.status).name

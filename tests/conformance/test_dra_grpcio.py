"""The kubelet-facing services driven by grpcio (an independent gRPC stack) over real unix sockets.

grpcio speaks with protoc-built classes from the same protos, the way the kubelet's Go client would:
registration GetInfo/NotifyRegistrationStatus, and NodePrepare/NodeUnprepareResources on both the
v1 and v1beta1 node services (v1 carries share_id, v1beta1 must not).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio_asyncio

from tests import objects as o
from tests.conformance.grpcio_calls import watch_resources
from tests.draharness import REF, Harness, single_container_claim
from tests.stdproto import message_class
from tests.support import require
from vgpud.dra.service import RegistrationService, node_services
from vgpud.grpcserve import serve

DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1"


@dataclass
class Plugin:
    harness: Harness
    registration: RegistrationService
    dra_socket: Path
    reg_socket: Path

    async def call(self, socket: Path, method: str, request: Any, response_type: str) -> Any:
        """One unary call through grpcio, in a worker thread (grpcio blocks)."""

        def blocking() -> Any:
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                stub = channel.unary_unary(
                    method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=message_class(response_type).FromString,
                )
                return stub(request, timeout=10)

        return await trio.to_thread.run_sync(blocking)


@pytest.fixture
async def plugin(short_tmp: Path) -> AsyncIterator[Plugin]:
    h = Harness(short_tmp)
    dra_socket = short_tmp / "plugins" / "dra.sock"
    reg_socket = short_tmp / "registry" / f"{o.DRIVER}-reg.sock"
    registration = RegistrationService(o.DRIVER, dra_socket)
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        for handlers, path in ((node_services(h.driver), dra_socket), ([registration], reg_socket)):
            await nursery.start(_serve, handlers, path)
        yield Plugin(h, registration, dra_socket, reg_socket)
        nursery.cancel_scope.cancel()
    assert not dra_socket.exists() and not reg_socket.exists(), "sockets are removed on shutdown"


async def _serve(handlers: list[object], path: Path, task_status: trio.TaskStatus[None]) -> None:
    await serve(handlers, path=path, ready=lambda _b: task_status.started())


def _claims_request(version: str, kind: str, *refs: Any) -> Any:
    request = message_class(f"{version}.Node{kind}ResourcesRequest")()
    for ref in refs:
        request.claims.add(namespace=ref.namespace, uid=ref.uid, name=ref.name)
    return request


async def _prepare(p: Plugin, version: str, *refs: Any) -> Any:
    return await p.call(
        p.dra_socket,
        f"/{version}.DRAPlugin/NodePrepareResources",
        _claims_request(version, "Prepare", *refs),
        f"{version}.NodePrepareResourcesResponse",
    )


async def _unprepare(p: Plugin, version: str, *refs: Any) -> Any:
    return await p.call(
        p.dra_socket,
        f"/{version}.DRAPlugin/NodeUnprepareResources",
        _claims_request(version, "Unprepare", *refs),
        f"{version}.NodeUnprepareResourcesResponse",
    )


async def test_registration_get_info_and_notify(plugin: Plugin) -> None:
    info = await plugin.call(
        plugin.reg_socket,
        "/pluginregistration.Registration/GetInfo",
        message_class("pluginregistration.InfoRequest")(),
        "pluginregistration.PluginInfo",
    )
    assert info.type == "DRAPlugin"
    assert info.name == o.DRIVER
    assert info.endpoint == str(plugin.dra_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    status = message_class("pluginregistration.RegistrationStatus")
    await plugin.call(
        plugin.reg_socket,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        status(plugin_registered=False, error="version mismatch"),
        "pluginregistration.RegistrationStatusResponse",
    )
    assert (plugin.registration.registered, plugin.registration.last_error) == (False, "version mismatch")
    await plugin.call(
        plugin.reg_socket,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        status(plugin_registered=True),
        "pluginregistration.RegistrationStatusResponse",
    )
    assert plugin.registration.registered is True


@pytest.mark.parametrize("version", [DRA_V1, DRA_V1BETA1])
async def test_empty_request_gets_an_empty_map(plugin: Plugin, version: str) -> None:
    assert dict((await _prepare(plugin, version)).claims) == {}
    assert dict((await _unprepare(plugin, version)).claims) == {}


@pytest.mark.parametrize("version", [DRA_V1, DRA_V1BETA1])
async def test_prepare_and_unprepare_over_the_wire(plugin: Plugin, version: str) -> None:
    claim, pod = single_container_claim()
    plugin.harness.kube.add_claim(claim)
    plugin.harness.kube.add_pod(pod)
    reply = await _prepare(plugin, version, REF)
    assert set(reply.claims) == {o.CLAIM_UID}
    entry = reply.claims[o.CLAIM_UID]
    assert entry.error == ""
    (device,) = entry.devices
    assert list(device.request_names) == ["r1"]
    assert (device.pool_name, device.device_name) == ("node-a", "vgpu-0")
    assert list(device.cdi_device_ids) == [
        f"k8s.{o.DRIVER}/claim={o.CLAIM_UID}-r1-vgpu-0-share-r1-vgpu-0-share"
    ]
    if version == DRA_V1:
        assert device.HasField("share_id") and device.share_id == "r1-vgpu-0-share"
    else:
        assert "share_id" not in {f.name for f in device.DESCRIPTOR.fields}

    again = await _prepare(plugin, version, REF)
    assert again == reply, "Prepare is idempotent"
    unprepared = await _unprepare(plugin, version, REF)
    assert dict(unprepared.claims)[o.CLAIM_UID].error == ""
    assert not plugin.harness.claim_dir().exists()


@pytest.mark.parametrize("version", [DRA_V1, DRA_V1BETA1])
async def test_every_claim_gets_an_entry_errors_per_claim(plugin: Plugin, version: str) -> None:
    claim, pod = single_container_claim()
    plugin.harness.kube.add_claim(claim)
    plugin.harness.kube.add_pod(pod)
    missing = type(REF)(o.NAMESPACE, "dddddddd-0000-4000-8000-000000000000", "missing")
    reply = await _prepare(plugin, version, REF, missing)
    assert set(reply.claims) == {o.CLAIM_UID, missing.uid}
    assert reply.claims[o.CLAIM_UID].error == ""
    assert reply.claims[missing.uid].error == "claim default/missing not found"
    assert list(reply.claims[missing.uid].devices) == []
    unprepared = await _unprepare(plugin, version, REF, missing)
    assert {uid: e.error for uid, e in unprepared.claims.items()} == {o.CLAIM_UID: "", missing.uid: ""}


async def test_unknown_method_is_unimplemented(plugin: Plugin) -> None:
    request = _claims_request(DRA_V1, "Prepare")
    with pytest.raises(grpc.RpcError) as info:
        await plugin.call(
            plugin.dra_socket,
            f"/{DRA_V1}.DRAPlugin/NoSuchMethod",
            request,
            f"{DRA_V1}.NodePrepareResourcesResponse",
        )
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_garbage_request_is_a_transport_error_and_the_server_keeps_serving(plugin: Plugin) -> None:
    def garbage() -> Any:
        with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as channel:
            raw: Callable[..., Any] = channel.unary_unary(
                f"/{DRA_V1}.DRAPlugin/NodePrepareResources",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            return raw(b"\x0a\x05ab", timeout=5)  # a claim of 5 bytes, 2 of them sent

    with pytest.raises(grpc.RpcError) as info:
        await trio.to_thread.run_sync(garbage)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed NodePrepareResourcesRequest" in info.value.details()
    assert dict((await _prepare(plugin, DRA_V1)).claims) == {}


async def test_device_health_stream_is_a_well_formed_unimplemented(plugin: Plugin) -> None:
    """Kubelets with ResourceHealthStatus open this stream unasked; the answer must be a proper gRPC
    status (grpc-go refuses a reply without content-type as malformed)."""

    with pytest.raises(grpc.RpcError) as info:
        await trio.to_thread.run_sync(lambda: list(watch_resources(plugin.dra_socket, timeout=5)))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert info.value.details() == "vgpud does not report device health"


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` as a read-only bind mount of itself for the body (needs root: mount(2))."""
    path.mkdir(parents=True, exist_ok=True)
    require(os.geteuid() == 0 and shutil.which("mount") is not None, "root and mount(8)", "run as root")
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


async def test_a_read_only_cdi_root_fails_each_claim_by_name(plugin: Plugin) -> None:
    """Bug 6: writing the spec fails (EROFS) and so does the rollback's unlink of it (EROFS even for a
    missing file): every claim of the call still gets its own error naming it, not a transport error."""
    h = plugin.harness
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    missing = type(REF)(o.NAMESPACE, "dddddddd-0000-4000-8000-000000000000", "missing")
    with read_only(h.cdi_root):
        reply = await _prepare(plugin, DRA_V1, REF, missing)
        assert set(reply.claims) == {o.CLAIM_UID, missing.uid}
        error = reply.claims[o.CLAIM_UID].error
        assert error.startswith(f"claim {REF.namespace}/{REF.name}: "), error
        assert "Read-only file system" in error and "rollback failed" in error, error
        assert reply.claims[missing.uid].error == "claim default/missing not found"
        unprepared = await _unprepare(plugin, DRA_V1, REF)
        assert unprepared.claims[o.CLAIM_UID].error.startswith(
            f"claim {REF.namespace}/{REF.name}: rollback failed"
        )
    reply = await _prepare(plugin, DRA_V1, REF)
    assert reply.claims[o.CLAIM_UID].error == ""

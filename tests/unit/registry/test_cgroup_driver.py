"""`--cgroup-driver` / `CGROUP_DRIVER`: when set, a registering caller must sit in a pod cgroup of that
layout (the kubelet names its pods one way only); unset, either layout is read. Through the real
registry socket with a grpcio client, and from the setting through the daemon's wiring."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from tests.unit.registry.test_server import ME, aregister, make_server, serving
from tests.unit.registry.world import Claims, World
from vgpud.config import add_settings_arguments, settings_from
from vgpud.kube.fake import FakeKube
from vgpud.node.build import build_caches, build_registry
from vgpud.node.checks import Startup
from vgpud.partition.assigner import Mode
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder


@pytest.fixture
async def world(short_tmp: Path) -> AsyncIterator[World]:
    node = World(short_tmp)
    async with node.caches():
        yield node


@pytest.mark.parametrize(
    ("systemd_cgroups", "caller_systemd", "refused_by"),
    [
        (None, True, None),
        (None, False, None),
        (True, True, None),
        (False, False, None),
        (False, True, "runs in a systemd-layout cgroup of pod {uid}, but the kubelet's cgroup driver is "
         "set to cgroupfs (--cgroup-driver, CGROUP_DRIVER)"),
        (True, False, "runs in a cgroupfs-layout cgroup of pod {uid}, but the kubelet's cgroup driver is "
         "set to systemd (--cgroup-driver, CGROUP_DRIVER)"),
    ],
    ids=["unset-systemd", "unset-cgroupfs", "systemd", "cgroupfs", "cgroupfs-refuses", "systemd-refuses"],
)  # fmt: skip
async def test_the_cgroup_driver_selects_the_layout_a_caller_must_be_in(
    world: World, systemd_cgroups: bool | None, caller_systemd: bool, refused_by: str | None
) -> None:
    uid, cid, config = world.add_container(1)
    world.place(ME, uid, cid, systemd=caller_systemd)
    server = make_server(world, systemd_cgroups=systemd_cgroups)
    answers = []

    async def body() -> None:
        answers.append(await aregister(server.path, pod_uid=uid, container_name="main"))

    await serving(server, body)
    ((code, details),) = answers
    if refused_by is None:
        assert (code, details) == (grpc.StatusCode.OK, "")
        assert (config / "pids.config").read_text() == f"{ME}\n"
    else:
        assert code is grpc.StatusCode.PERMISSION_DENIED
        assert f"caller pid {ME} {refused_by.format(uid=uid)}" in details
        assert (config / "pids.config").read_text() == ""  # nothing written


@pytest.mark.parametrize(("value", "systemd"), [(None, None), ("systemd", True), ("cgroupfs", False)])
def test_the_daemon_hands_the_setting_to_the_registry(
    short_tmp: Path, value: str | None, systemd: bool | None
) -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    gates = ["--feature-gates", "DevicePluginClientMode=true", "--root-prefix", str(short_tmp)]
    settings = settings_from(parser.parse_args(["--node-name", "n", *gates]), {"CGROUP_DRIVER": value or ""})
    assert settings.cgroup_driver == value
    layout = Layout(settings.manager_dir)
    startup = Startup(settings, [], FakeKube(), layout, "boot", Mode.LAZY, nri_fallback="")
    registry = build_registry(
        startup,
        LazyAssigner(layout, driver=settings.driver_name),
        SimpleNamespace(index=Claims()),
        None,
        Recorder(),
        caches=build_caches(startup, Claims()),
    )
    assert registry is not None
    assert registry.service.systemd_cgroups is systemd

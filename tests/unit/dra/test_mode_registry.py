"""Bug 2, the registry's part: a register call is resolved in the mode its claim was prepared in,
when a restart changed the node's mode (real claim index, real directories, fake /proc and API)."""

from __future__ import annotations

from pathlib import Path

from tests import objects as o
from tests.draharness import REF, Harness, single_container_claim
from tests.unit.registry.world import NODE, World, running, with_status
from vgpud.containers.store import ContainerStore
from vgpud.kube.informer import claim_informer, pod_informer
from vgpud.nri.adjust import make_directories
from vgpud.partition.assigner import ContainerContext, Mode, RegisterQuery, register_annotations
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.lazy import LazyAssigner
from vgpud.registry.identity import identify
from vgpud.registry.resolve import Resolver

PID = 4242
CID = "c" * 64


def prepared_in(root: Path, *, lazy: bool) -> Harness:
    h = Harness(root, lazy=lazy, client_mode=not lazy)
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(with_status(pod, {"main": CID}))
    return h


async def test_a_lazy_claim_resolves_to_its_container_directory_under_eager_mode(tmp_path: Path) -> None:
    lazy = prepared_in(tmp_path, lazy=True)
    assert not (await lazy.driver.prepare([REF]))[o.CLAIM_UID].error
    lazy_assigner = LazyAssigner(lazy.layout, driver=o.DRIVER)
    plan = lazy_assigner.inject(ContainerContext(o.CLAIM_UID, o.POD1_UID, "train", o.NAMESPACE, "main"))
    make_directories(plan)  # what the NRI plugin of the lazy run did

    eager = Harness(tmp_path, client_mode=True)  # restarted in eager mode (no NRI)
    eager.kube = lazy.kube
    driver = eager.new_driver()
    await driver.load()
    assert driver.index.mode_of(o.CLAIM_UID) is Mode.LAZY
    world = World(tmp_path)
    world.place(PID, o.POD1_UID, CID)
    pods, claims = pod_informer(lazy.kube, NODE), claim_informer(lazy.kube)
    resolver = Resolver(
        assigner=EagerAssigner(eager.layout, driver=o.DRIVER, client_mode=True),
        other_assigner=lazy_assigner,
        pods=pods,
        claim_objects=claims,
        claims=driver.index,
        containers=None,
        cgroup_root=world.cgroup,
        driver_name=o.DRIVER,
        timeout=1.0,
    )
    async with running(pods, claims):
        resolved = await resolver.resolve(
            RegisterQuery(pod_uid=o.POD1_UID, container="main"), identify(world.proc, PID)
        )
    assert Path(resolved.target.config_dir) == Path(plan.paths.config)
    assert resolved.target.claim_uid == o.CLAIM_UID and resolved.pids == (PID,)


async def test_an_eager_claim_resolves_by_register_uuid_under_lazy_mode(tmp_path: Path) -> None:
    eager = prepared_in(tmp_path, lazy=False)
    assert not (await eager.driver.prepare([REF]))[o.CLAIM_UID].error
    annotations = (await eager.kube.get_resource_claim(o.NAMESPACE, "gpu-claim"))["metadata"]["annotations"]
    ((register_uuid, key),) = register_annotations(annotations, o.DRIVER).items()

    lazy = Harness(tmp_path, lazy=True)  # restarted with NRI
    lazy.kube = eager.kube
    driver = lazy.new_driver()
    await driver.load()
    containers = ContainerStore()
    containers.replace([])
    world = World(tmp_path)
    world.place(PID, o.POD1_UID, CID)
    pods, claims = pod_informer(eager.kube, NODE), claim_informer(eager.kube)
    resolver = Resolver(
        assigner=LazyAssigner(lazy.layout, driver=o.DRIVER),
        other_assigner=EagerAssigner(lazy.layout, driver=o.DRIVER, client_mode=True),
        pods=pods,
        claim_objects=claims,
        claims=driver.index,
        containers=containers,
        cgroup_root=world.cgroup,
        driver_name=o.DRIVER,
        timeout=1.0,
    )
    async with running(pods, claims):
        resolved = await resolver.resolve(
            RegisterQuery(register_uuid=register_uuid), identify(world.proc, PID)
        )
    assert resolved.target.partition_key == key
    assert Path(resolved.target.config_dir) == eager.claim_dir() / key / "config"

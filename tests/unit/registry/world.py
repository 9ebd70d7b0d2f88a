"""A node as the registry sees it, in a temp dir: a fake host /proc and cgroup tree, pods whose status
says which container runs where, claims in the in-memory kube facade, the node's container store (as
the NRI plugin fills it) and the checkpoint's claim index. The unit tests, the gRPC end-to-end tests
and bench/registry.py build on it.

Pods and claims reach the registry as they do on a node: through its watch-fed caches over the
in-memory kube facade, running inside `async with world.caches():`.

`place(pid, ...)` puts any PID (the test process itself, a forked client) into a pod's container:
it writes `<proc>/<pid>/cgroup` the way the kernel would and adds the PID to the container cgroup's
`cgroup.procs`, so vgpud's real code reads both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from tests import objects as o
from vgpud.containers.record import Injection, NodeContainer
from vgpud.containers.store import ContainerStore
from vgpud.dra.claimwatch import ClaimWatch
from vgpud.kube.fake import FakeKube
from vgpud.kube.informer import Informer, claim_informer, pod_informer
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.pidsfile import reset_pids_file
from vgpud.recorder import Recorder
from vgpud.registry.resolve import Resolver
from vgpud.registry.server import RegistryServer, RegistryService

#: the node the world's pods are bound to (the pod cache's field selector)
NODE = "node-1"


def container_id(n: int) -> str:
    return f"{n:064x}"


def pod_uid(n: int) -> str:
    return f"{n:08x}-1111-4222-8333-444455556666"


def claim_uid(n: int) -> str:
    return f"{n:08x}-aaaa-4bbb-8ccc-ddddeeeeffff"


def cgroup_path(uid: str, cid: str, *, qos: str = "besteffort", systemd: bool = False) -> str:
    """The container's cgroup path as the kubelet and containerd name it (cgroupfs or systemd)."""
    if systemd:
        u = uid.replace("-", "_")
        slices = "kubepods.slice" if qos == "guaranteed" else f"kubepods.slice/kubepods-{qos}.slice"
        pod = f"kubepods-pod{u}.slice" if qos == "guaranteed" else f"kubepods-{qos}-pod{u}.slice"
        return f"/{slices}/{pod}/cri-containerd-{cid}.scope"
    parent = "kubepods" if qos == "guaranteed" else f"kubepods/{qos}"
    return f"/{parent}/pod{uid}/{cid}"


def with_status(pod: dict[str, Any], containers: dict[str, str | None]) -> dict[str, Any]:
    """`pod` Running on `NODE`, each named container Running with its containerd ID (None: still
    waiting)."""
    statuses = []
    for name, cid in containers.items():
        entry: dict[str, Any] = {"name": name, "ready": cid is not None, "restartCount": 0}
        if cid is None:
            entry["state"] = {"waiting": {"reason": "ContainerCreating"}}
        else:
            entry["containerID"] = f"containerd://{cid}"
            entry["state"] = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
        statuses.append(entry)
    pod = dict(pod)
    pod["spec"] = {"nodeName": NODE, **pod.get("spec", {})}
    pod["status"] = {**pod.get("status", {}), "phase": "Running", "qosClass": "BestEffort"}
    pod["status"]["containerStatuses"] = statuses
    return pod


@dataclass(frozen=True)
class Ref:
    namespace: str
    uid: str
    name: str


@dataclass
class Claims:
    """The checkpoint's claim index, as `DraDriver` answers it."""

    prepared: dict[str, Ref] = field(default_factory=dict)
    uuids: dict[str, Ref] = field(default_factory=dict)

    def prepared_claim(self, uid: str) -> Ref | None:
        return self.prepared.get(uid)

    def claim_for_register_uuid(self, register_uuid: str) -> Ref | None:
        return self.uuids.get(register_uuid)


def injected(
    cid: str,
    uid: str,
    name: str,
    claim: str,
    directory: PurePosixPath,
    *,
    namespace: str = o.NAMESPACE,
    pod_name: str = "",
    running: bool = True,
) -> NodeContainer:
    """The record of a container the NRI plugin injected (what a CreateContainer or Synchronize leaves)."""
    return NodeContainer(
        cid,
        uid,
        name,
        namespace,
        pod_name,
        running=running,
        claim_uid=claim,
        injection=Injection.INJECTED,
        directory=directory,
    )


class World:
    """A lazy (NRI) node: `add_container` prepares a claim, its pod and the container's directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc = root / "proc"
        self.cgroup = root / "cgroup"
        self.layout = Layout(root / "manager")
        self.kube = FakeKube()
        self.pods = pod_informer(self.kube, NODE)
        self.claim_objects = claim_informer(self.kube)
        self.containers = ContainerStore()
        self.claims = Claims()
        self.recorder = Recorder()
        self.assigner = LazyAssigner(self.layout, driver=o.DRIVER)

    @asynccontextmanager
    async def caches(self) -> AsyncIterator[None]:
        """The pod and claim caches, listed and watching, until the block ends."""
        async with running(self.pods, self.claim_objects):
            yield

    def place(self, pid: int, uid: str, cid: str, *, systemd: bool = False) -> None:
        """Make `pid` a process of container `cid` of pod `uid` (as /proc and the cgroup tree say)."""
        path = cgroup_path(uid, cid, systemd=systemd)
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
        directory = self.cgroup / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / "cgroup.procs").open("a") as procs:
            procs.write(f"{pid}\n")

    def place_outside(self, pid: int, path: str = "/user.slice/session-1.scope") -> None:
        (self.proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.proc / str(pid) / "cgroup").write_text(f"0::{path}\n")

    def add_container(
        self,
        n: int,
        *,
        name: str = "main",
        running: bool = True,
        cached: bool = True,
    ) -> tuple[str, str, Path]:
        """Claim n, reserved for pod n whose container `name` is `container_id(n)`; its record in the
        container store (injected; none when not `cached`) and the container's directory with an empty
        pids.config. (pod UID, container ID, dir)."""
        uid, cid, claim = pod_uid(n), container_id(n), claim_uid(n)
        claim_name, pod_name = f"claim-{n}", f"pod-{n}"
        pod = o.pod(pod_name, uid, containers=[o.container(name, o.ref("gpu"))], claims={"gpu": claim_name})
        self.kube.add_pod(with_status(pod, {name: cid if running else None}))
        self.kube.add_claim(
            o.claim(
                requests=[o.exactly("r1")],
                results=[o.result("r1", share_id=f"s{n}")],
                reserved_for=o.reserved(pod),
                name=claim_name,
                uid=claim,
            )
        )
        self.claims.prepared[claim] = Ref(o.NAMESPACE, claim, claim_name)
        paths = self.assigner.paths(claim, uid, name)
        for directory in paths.directories:
            Path(directory).mkdir(parents=True, exist_ok=True)
        reset_pids_file(Path(paths.config))
        if cached:
            self.containers.set(
                injected(cid, uid, name, claim, paths.base, pod_name=pod_name, running=running)
            )
        return uid, cid, Path(paths.config)

    def resolver(self, cls: type[Resolver] = Resolver, **kwargs: Any) -> Resolver:
        return cls(
            assigner=self.assigner,
            pods=self.pods,
            claim_objects=self.claim_objects,
            claims=self.claims,
            containers=self.containers,
            cgroup_root=self.cgroup,
            driver_name=o.DRIVER,
            **kwargs,
        )

    def service(self, **kwargs: Any) -> RegistryService:
        return RegistryService(self.resolver(), self.recorder, proc_root=self.proc, **kwargs)

    def server(self, **kwargs: Any) -> RegistryServer:
        """The whole registry server (socket under the layout) over this world."""
        return RegistryServer(
            layout=self.layout,
            assigner=self.assigner,
            containers=self.containers,
            claims=self.claims,
            pods=self.pods,
            claim_objects=self.claim_objects,
            recorder=self.recorder,
            driver_name=o.DRIVER,
            proc_root=self.proc,
            cgroup_root=self.cgroup,
            **kwargs,
        )


async def run_cache(
    cache: Informer | ClaimWatch, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """`cache.run`, started once it has listed and its watch is open (a ClaimWatch runs its cache)."""
    await cache.run(task_status.started)


@asynccontextmanager
async def running(*caches: Informer) -> AsyncIterator[None]:
    """Each cache listed and watching until the block ends."""
    async with trio.open_nursery() as nursery:
        for cache in caches:
            await nursery.start(run_cache, cache)
        yield
        nursery.cancel_scope.cancel()

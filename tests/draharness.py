"""A DraDriver over the in-memory kube facade, with real files under one directory: what the DRA
unit tests, the grpcio conformance tests and bench/prepare.py drive."""

from __future__ import annotations

import json
from pathlib import Path

from tests import objects as o
from vgpud.dra.cdi import spec_path
from vgpud.dra.checkpoint import CheckpointStore
from vgpud.dra.claimedits import NodeFacts
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.claimlabel import node_claim_labels
from vgpud.dra.driver import DraDriver
from vgpud.dra.driveredits import DriverEdits
from vgpud.gpu import open_inventory
from vgpud.gpu.mock import shipped_profiles
from vgpud.kube.events import EventSink
from vgpud.kube.fake import FakeKube
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder

NODE = "node-a"  # the pool the object builders allocate from
BOOT = "boot-1"
GPUS = open_inventory("mock", profile=shipped_profiles()["a100-40gb-x2"]).gpus()


class Harness:
    def __init__(
        self,
        root: Path,
        *,
        lazy: bool = False,
        client_mode: bool = False,
        boot: str = BOOT,
        driver_edits: DriverEdits | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.root = root
        self.events = events
        self.kube = FakeKube()
        self.kube.add_node({"metadata": {"name": NODE}})
        self.layout = Layout(root / "manager")
        self.cdi_root = root / "cdi"
        self.plugin_dir = root / "plugin"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.recorder = Recorder()
        self.lazy, self.client_mode = lazy, client_mode
        self.driver_edits = driver_edits
        #: what Prepare labels claims with: as `vgpud run` does, wherever a claim cache runs
        self.claim_labels = node_claim_labels(o.DRIVER, NODE) if lazy or client_mode else {}
        self.driver = self.new_driver(boot)

    def new_driver(self, boot: str = BOOT) -> DraDriver:
        """A driver as a restarted vgpud builds it: same dirs, fresh process state."""
        assigner = (
            LazyAssigner(self.layout, driver=o.DRIVER)
            if self.lazy
            else EagerAssigner(self.layout, driver=o.DRIVER, client_mode=self.client_mode)
        )
        facts = NodeFacts(
            driver=o.DRIVER,
            node_name=NODE,
            layout=self.layout,
            gpus_by_minor={g.minor: g for g in GPUS},
            client_mode=self.client_mode,
            cgroup_v2=False,
            memory_ratio=100,
            library_version="1.0",
            driver_edits=self.driver_edits,
            claim_labels=self.claim_labels,
        )
        return DraDriver(
            kube=self.kube,
            assigner=assigner,
            facts=facts,
            store=CheckpointStore(self.plugin_dir / "checkpoint.json", boot),
            cdi_root=self.cdi_root,
            lock_path=self.plugin_dir / "pu.lock",
            recorder=self.recorder,
            lock_timeout=1.0,
            events=self.events,
        )

    def checkpoint(self) -> dict:
        return json.loads((self.plugin_dir / "checkpoint.json").read_text())["v2"]["preparedClaims"]

    def spec(self, uid: str = o.CLAIM_UID) -> dict:
        return json.loads(spec_path(self.cdi_root, o.DRIVER, uid).read_text())

    def claim_dir(self, uid: str = o.CLAIM_UID) -> Path:
        return Path(self.layout.claim_dir(uid))


def single_container_claim(**kwargs: object) -> tuple[dict, dict]:
    pod = o.pod("train", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
    claim = o.claim(
        requests=[o.exactly("r1")], results=[o.result("r1")], reserved_for=o.reserved(pod), **kwargs
    )
    return claim, pod


REF = ClaimRef(o.NAMESPACE, o.CLAIM_UID, "gpu-claim")

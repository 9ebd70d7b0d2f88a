"""Prepare / Unprepare through DraDriver with the in-memory kube facade and real files in a temp dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests import objects as o
from tests.draharness import BOOT, GPUS, NODE, REF, Harness, single_container_claim
from vgpud.dra.cdi import spec_path
from vgpud.dra.checkpoint import CheckpointStore, ClaimEntry, PrepareState
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.materialize import WRITE_CHUNK
from vgpud.dra.prepare import REPLAYED
from vgpud.logs import JsonFormatter
from vgpud.partition import libfiles as F


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def env_of(edits: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in edits.get("env", []))


async def test_prepare_writes_spec_dirs_and_checkpoint(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    (device,) = out[o.CLAIM_UID].devices
    assert device.request_names == ("r1",)
    assert (device.pool, device.device) == (NODE, "vgpu-0")
    share = "r1-vgpu-0-share"
    assert device.share_id == share
    name = f"{o.CLAIM_UID}-r1-vgpu-0-share-{share}"
    assert device.cdi_device_ids == (f"k8s.{o.DRIVER}/claim={name}",)

    spec = h.spec()
    assert spec["kind"] == f"k8s.{o.DRIVER}/claim"
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == name
    env = env_of(cdi_device["containerEdits"])
    gpu0 = GPUS[0]
    assert env["MANAGER_VISIBLE_DEVICE_0"] == gpu0.uuid
    assert env["CUDA_MEM_LIMIT_0"] == "4096m"
    assert env["CUDA_CORE_LIMIT_0"] == "40"
    assert env["CUDA_CORE_SOFT_LIMIT_0"] == "40"
    common = env_of(spec["containerEdits"])
    assert common["LD_PRELOAD"] == "/etc/vgpu-manager/driver/libvgpu-control.so"
    assert common["MANAGER_COMPATIBILITY_MODE"] == "101"  # cgroup v1, no client registration
    assert common["MANAGER_VGPU_CLAIM_UID"] == ""  # eager mode: empty so a pod cannot forge it
    assert common["CUDA_MEM_LIMIT"] == ""
    # eager: the partition directory exists with an empty pids.config, mounted into the device
    mounts = {m["containerPath"]: m for m in cdi_device["containerEdits"]["mounts"]}
    pids = Path(mounts["/etc/vgpu-manager/config/pids.config"]["hostPath"])
    assert pids.is_file() and pids.read_bytes() == b""
    assert pids.is_relative_to(h.claim_dir())
    assert h.checkpoint()[o.CLAIM_UID]["checkpointState"] == "PrepareCompleted"
    assert h.driver.index.is_vgpu_claim_prepared(o.CLAIM_UID, o.NAMESPACE)
    assert not h.driver.index.is_vgpu_claim_prepared(o.CLAIM_UID, "another-namespace")


async def test_prepare_starts_the_partition_without_a_ledger_or_bucket(h: Harness) -> None:
    """Issue 13 item 4 (eager): files the library left in a claim directory before Prepare (a crash
    between Unprepare's steps, a reused UID) are gone after it: Prepare recreates the claim directory."""
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    stale = h.claim_dir() / "pod-stale" / "vmem_node"
    stale.mkdir(parents=True)
    (stale / "vmem_node.config").write_bytes(F.build_vmem_node({0: [F.LedgerEntry(1, 1 << 30)]}))
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    (cdi_device,) = h.spec()["devices"]
    mounts = {m["containerPath"]: Path(m["hostPath"]) for m in cdi_device["containerEdits"]["mounts"]}
    assert mounts["/tmp/.vmem_node"].is_dir() and mounts["/tmp/.sm_node"].is_dir()
    assert list(mounts["/tmp/.vmem_node"].iterdir()) == [] and list(mounts["/tmp/.sm_node"].iterdir()) == []
    assert not stale.exists()


async def test_repeated_prepare_returns_the_same_devices_without_redoing_work(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    first = await h.driver.prepare([REF])
    marker = h.claim_dir() / "marker"
    marker.write_text("still here")
    second = await h.new_driver().prepare([REF])  # also across a restart
    assert second == first
    assert marker.exists(), "a completed claim must not be prepared again"


async def test_a_replayed_prepare_is_recorded_and_logged_as_one(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    await h.driver.prepare([REF])
    caplog.set_level("INFO", logger="vgpud.dra")
    caplog.clear()
    await h.driver.prepare([REF])  # what a restarted kubelet asks for a new pod sandbox using the claim
    calls = h.recorder.recent(component="dra", call="Prepare")
    assert [(str(c.outcome), c.detail) for c in calls] == [("ok", ""), ("ok", REPLAYED)]
    assert [r.getMessage() for r in caplog.records] == [
        f"claim default/{REF.name} ({o.CLAIM_UID}) {REPLAYED}"
    ]


async def test_unprepare_removes_dir_spec_and_entry(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    await h.driver.prepare([REF])
    assert await h.driver.unprepare([REF]) == {o.CLAIM_UID: ""}
    assert not h.claim_dir().exists()
    assert not spec_path(h.cdi_root, o.DRIVER, o.CLAIM_UID).exists()
    assert o.CLAIM_UID not in h.checkpoint()
    assert not h.driver.index.is_vgpu_claim_prepared(o.CLAIM_UID, o.NAMESPACE)


async def test_unprepare_of_unknown_or_deleted_claim_succeeds(h: Harness) -> None:
    unknown = ClaimRef("default", "00000000-0000-4000-8000-000000000000", "gone")
    assert await h.driver.unprepare([unknown]) == {unknown.uid: ""}


async def test_crash_between_started_and_completed_is_rolled_back(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    # what a vgpud killed mid-Prepare leaves: a PrepareStarted entry, a half-made dir, a stale spec
    store = CheckpointStore(h.plugin_dir / "checkpoint.json", BOOT)
    entry = ClaimEntry(state=PrepareState.STARTED, name="gpu-claim", namespace=o.NAMESPACE)
    store.save(store.load().with_claim(o.CLAIM_UID, entry))
    (h.claim_dir() / "half-made").mkdir(parents=True)
    spec = spec_path(h.cdi_root, o.DRIVER, o.CLAIM_UID)
    spec.parent.mkdir(parents=True)
    spec.write_text("{}")

    restarted = h.new_driver()
    await restarted.load()
    assert not restarted.index.is_vgpu_claim_prepared(o.CLAIM_UID, o.NAMESPACE)
    out = await restarted.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    assert not (h.claim_dir() / "half-made").exists()
    assert h.checkpoint()[o.CLAIM_UID]["checkpointState"] == "PrepareCompleted"
    assert h.spec()["devices"]


async def test_cleanup_rolls_back_started_claims_whose_object_is_gone(h: Harness) -> None:
    store = CheckpointStore(h.plugin_dir / "checkpoint.json", BOOT)
    gone = ClaimEntry(state=PrepareState.STARTED, name="deleted", namespace=o.NAMESPACE)
    store.save(store.load().with_claim(o.CLAIM_UID, gone))
    (h.claim_dir() / "x").mkdir(parents=True)
    assert await h.driver.cleanup_stale() == 1
    assert o.CLAIM_UID not in h.checkpoint()
    assert not h.claim_dir().exists()
    assert await h.driver.cleanup_stale() == 0


async def test_cleanup_keeps_started_claims_that_still_exist(h: Harness) -> None:
    claim, _ = single_container_claim()
    h.kube.add_claim(claim)
    store = CheckpointStore(h.plugin_dir / "checkpoint.json", BOOT)
    entry = ClaimEntry(state=PrepareState.STARTED, name="gpu-claim", namespace=o.NAMESPACE)
    store.save(store.load().with_claim(o.CLAIM_UID, entry))
    assert await h.driver.cleanup_stale() == 0
    assert h.checkpoint()[o.CLAIM_UID]["checkpointState"] == "PrepareStarted"


async def test_boot_id_change_discards_the_checkpoint(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    await h.driver.prepare([REF])
    rebooted = h.new_driver(boot="boot-2")
    await rebooted.load()
    assert not rebooted.index.is_vgpu_claim_prepared(o.CLAIM_UID, o.NAMESPACE)


async def test_corrupt_checkpoint_is_a_clear_error_and_a_safe_start(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    (h.plugin_dir / "checkpoint.json").write_text('{"checksum": 1, "v2": {"preparedCl')
    driver = h.new_driver()
    checkpoint = await driver.load()
    assert checkpoint.claims == {}
    assert any("checkpoint" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    assert list(h.plugin_dir.glob("checkpoint.json.corrupt-*")), "the corrupt file is kept for inspection"
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    assert (await driver.prepare([REF]))[o.CLAIM_UID].error == ""


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (
            lambda c: c["metadata"].update(uid="11111111-2222-4333-8444-555555555555"),
            "deleted and re-created",
        ),
        (lambda c: c["status"].pop("allocation"), "is not allocated"),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="vgpu-7"),
            "is not a GPU of node node-a",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool="node-b"),
            "not this node's pool",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].update(adminAccess=True),
            "adminAccess",
        ),
    ],
)
async def test_bad_claims_get_a_per_claim_error_and_leave_nothing(h: Harness, mutate, fragment: str) -> None:
    claim, pod = single_container_claim()
    mutate(claim)
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    good_uid = "22222222-3333-4444-8555-666666666666"
    good, _ = single_container_claim(name="good", uid=good_uid)
    h.kube.add_claim(good)
    out = await h.driver.prepare([REF, ClaimRef(o.NAMESPACE, good_uid, "good")])
    assert fragment in out[o.CLAIM_UID].error
    assert out[o.CLAIM_UID].devices == ()
    assert out[good_uid].error == "", "one bad claim must not fail the others"
    assert not h.claim_dir().exists()
    assert not spec_path(h.cdi_root, o.DRIVER, o.CLAIM_UID).exists()
    assert o.CLAIM_UID not in h.checkpoint()


async def test_missing_claim_is_a_per_claim_error(h: Harness) -> None:
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == f"claim {o.NAMESPACE}/gpu-claim not found"


async def test_results_of_another_driver_are_ignored(h: Harness) -> None:
    pod = o.pod("train", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
    claim = o.claim(
        requests=[o.exactly("r1"), o.exactly("nic", "net")],
        results=[o.result("r1"), o.result("nic", "eth0", driver=o.OTHER_DRIVER)],
        reserved_for=o.reserved(pod),
    )
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    out = await h.driver.prepare([REF])
    assert [d.device for d in out[o.CLAIM_UID].devices] == ["vgpu-0"]
    assert len(h.spec()["devices"]) == 1


async def test_two_claims_on_one_gpu_with_different_share_ids(h: Harness) -> None:
    uids = ("aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002")
    names = set()
    for i, uid in enumerate(uids):
        pod = o.pod(
            f"p{i}",
            f"cccccccc-0000-4000-8000-00000000000{i}",
            containers=[o.container("main", o.ref("gpu"))],
            claims={"gpu": f"c{i}"},
        )
        claim = o.claim(
            requests=[o.exactly("r1")],
            results=[o.result("r1", share_id=f"share-{i}")],
            reserved_for=o.reserved(pod),
            name=f"c{i}",
            uid=uid,
        )
        h.kube.add_claim(claim)
        h.kube.add_pod(pod)
        out = await h.driver.prepare([ClaimRef(o.NAMESPACE, uid, f"c{i}")])
        (device,) = out[uid].devices
        assert device.device == "vgpu-0"
        names.add(h.spec(uid)["devices"][0]["name"])
    assert len(names) == 2
    assert Path(h.layout.claim_dir(uids[0])) != Path(h.layout.claim_dir(uids[1]))
    assert all(Path(h.layout.claim_dir(u)).is_dir() for u in uids)


async def test_the_same_share_prepared_for_another_claim_is_refused(h: Harness) -> None:
    uids = ("aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002")
    for i, uid in enumerate(uids):
        h.kube.add_claim(
            o.claim(
                requests=[o.exactly("r1")], results=[o.result("r1", share_id="same")], name=f"c{i}", uid=uid
            )
        )
    assert (await h.driver.prepare([ClaimRef(o.NAMESPACE, uids[0], "c0")]))[uids[0]].error == ""
    second = await h.driver.prepare([ClaimRef(o.NAMESPACE, uids[1], "c1")])
    assert "already prepared for claim default/c0" in second[uids[1]].error


async def test_eager_refuses_a_claim_reserved_for_two_pods(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu", f"r{i}"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ]
    claim = o.claim(
        requests=[o.exactly("r0"), o.exactly("r1")],
        results=[o.result("r0"), o.result("r1", "vgpu-1")],
        reserved_for=o.reserved(*pods),
    )
    h.kube.add_claim(claim)
    for pod in pods:
        h.kube.add_pod(pod)
    caplog.set_level("WARNING", logger="vgpud.dra")
    out = await h.driver.prepare([REF])
    assert "pod" in out[o.CLAIM_UID].error
    assert not h.claim_dir().exists()
    (line,) = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert line["message"] == out[o.CLAIM_UID].error
    assert (line["claim"], line["namespace"]) == (o.CLAIM_UID, o.NAMESPACE)


async def test_lazy_mode_marks_the_claim_uid_and_creates_no_partitions(tmp_path: Path) -> None:
    h = Harness(tmp_path, lazy=True)
    claim, _ = single_container_claim()
    h.kube.add_claim(claim)
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    spec = h.spec()
    assert env_of(spec["containerEdits"])["MANAGER_VGPU_CLAIM_UID"] == o.CLAIM_UID
    assert "mounts" not in spec["devices"][0]["containerEdits"]
    assert list(h.claim_dir().iterdir()) == []


async def test_client_mode_annotates_the_claim_and_unprepare_strips_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, client_mode=True)
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    env = env_of(h.spec()["devices"][0]["containerEdits"])
    register_uuid = env["MANAGER_CLIENT_REGISTER_UUID"]
    stored = await h.kube.get_resource_claim(o.NAMESPACE, "gpu-claim")
    key = f"{o.DRIVER}/{register_uuid}"
    assert stored["metadata"]["annotations"][key].startswith("pod-")
    assert env_of(h.spec()["containerEdits"])["MANAGER_COMPATIBILITY_MODE"] == "236"  # 100 | 200, bitwise
    assert await h.driver.unprepare([REF]) == {o.CLAIM_UID: ""}
    stored = await h.kube.get_resource_claim(o.NAMESPACE, "gpu-claim")
    assert key not in (stored["metadata"].get("annotations") or {})


async def test_a_held_node_lock_is_a_per_claim_busy_error(h: Harness) -> None:
    from vgpud.dra.nodelock import node_lock

    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    async with node_lock(h.plugin_dir / "pu.lock"):
        with trio.fail_after(5):
            out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error.startswith("node busy")


async def test_every_prepare_is_recorded(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    await h.driver.prepare([REF])
    await h.driver.prepare([ClaimRef(o.NAMESPACE, "99999999-0000-4000-8000-000000000000", "nope")])
    calls = h.recorder.recent(component="dra")
    assert [(c.call, c.claim_uid, str(c.outcome)) for c in calls] == [
        ("Prepare", o.CLAIM_UID, "ok"),
        ("Prepare", "99999999-0000-4000-8000-000000000000", "error"),
    ]
    assert calls[1].detail == "claim default/nope not found"


async def test_an_unusable_checkpoint_is_a_per_claim_error_not_a_crash(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    (h.plugin_dir / "checkpoint.json").mkdir()  # something that is not a file where the state goes
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error.startswith("checkpoint: ")
    assert not h.claim_dir().exists()
    errors = await h.driver.unprepare([REF])
    assert errors[o.CLAIM_UID].startswith("checkpoint: ")


async def test_a_claim_reference_without_a_name_is_refused_before_any_api_call(h: Harness) -> None:
    out = await h.driver.prepare([ClaimRef("", o.CLAIM_UID, "")])
    assert "lacks a namespace, name or UID" in out[o.CLAIM_UID].error
    assert h.kube.calls.get("get_resource_claim", 0) == 0


def two_claims(h: Harness) -> tuple[ClaimRef, ClaimRef]:
    """Two single-container claims of two pods, on two GPUs, in the fake API."""
    first, pod = single_container_claim()
    h.kube.add_claim(first)
    h.kube.add_pod(pod)
    uid2 = "6c1f8d2b-4e3a-4d9f-8b82-1e7f2c3d4e5f"
    pod2 = o.pod(
        "infer", o.POD2_UID, containers=[o.container("main", o.ref("gpu"))], claims={"gpu": "second"}
    )
    h.kube.add_claim(
        o.claim(
            requests=[o.exactly("r1")],
            results=[o.result("r1", "vgpu-1")],
            reserved_for=o.reserved(pod2),
            name="second",
            uid=uid2,
        )
    )
    h.kube.add_pod(pod2)
    return REF, ClaimRef(o.NAMESPACE, uid2, "second")


async def test_a_failed_rollback_is_a_per_claim_error_naming_the_claim(h: Harness) -> None:
    """Bug 6: the CDI root is a file where a directory belongs: writing the spec fails, and so does the
    rollback's removal of it. Each claim gets its own error (claim and cause), nothing escapes, and the
    PrepareStarted entries stay for the next Prepare or the cleanup to roll back."""
    refs = two_claims(h)
    h.cdi_root.write_text("not a directory")
    out = await h.driver.prepare(refs)
    assert set(out) == {r.uid for r in refs}
    for ref in refs:
        error = out[ref.uid].error
        assert error.startswith(f"claim {ref.namespace}/{ref.name}: "), error
        assert "rollback failed" in error and "Not a directory" in error, error
        assert out[ref.uid].devices == ()
        assert h.checkpoint()[ref.uid]["checkpointState"] == "PrepareStarted"
        assert not h.driver.index.is_vgpu_claim_prepared(ref.uid, ref.namespace)
    # the root repaired: the next Prepare rolls back and succeeds
    h.cdi_root.unlink()
    again = await h.driver.prepare(refs)
    assert {uid: x.error for uid, x in again.items()} == {r.uid: "" for r in refs}


async def test_an_unprepare_whose_removal_fails_is_a_per_claim_error(h: Harness) -> None:
    refs = two_claims(h)
    out = await h.driver.prepare(refs)
    assert all(not x.error for x in out.values())
    h.cdi_root.rename(h.root / "cdi-away")
    h.cdi_root.write_text("not a directory")
    errors = await h.driver.unprepare(refs)
    for ref in refs:
        assert errors[ref.uid].startswith(f"claim {ref.namespace}/{ref.name}: rollback failed"), errors
        assert h.checkpoint()[ref.uid]["checkpointState"] == "PrepareCompleted"  # the kubelet retries
    h.cdi_root.unlink()
    assert await h.driver.unprepare(refs) == {r.uid: "" for r in refs}
    assert h.checkpoint() == {}


async def test_an_unprepare_of_a_claim_uid_that_names_no_directory_fails_only_that_claim(h: Harness) -> None:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    await h.driver.prepare([REF])
    bad = ClaimRef(o.NAMESPACE, "../escape", "bad")
    errors = await h.driver.unprepare([bad, REF])
    assert errors[REF.uid] == ""
    assert errors[bad.uid].startswith("claim default/bad: ") and "claim UID" in errors[bad.uid], errors
    assert not h.claim_dir().exists() and h.checkpoint() == {}


async def test_a_large_batch_is_written_by_several_threads_and_one_failure_stays_its_own(h: Harness) -> None:
    """More claims than one write chunk: every claim gets its six directories, pids.config and spec;
    the one whose spec cannot be written fails alone (its rollback cannot remove the directory in
    the spec's place either, so its PrepareStarted entry stays for the cleanup)."""
    uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(2 * WRITE_CHUNK + 3)]
    for i, uid in enumerate(uids):
        h.kube.add_claim(
            o.claim(
                requests=[o.exactly("r1")],
                results=[o.result("r1", f"vgpu-{i % 2}", share_id=f"s{i}")],
                name=f"c{i}",
                uid=uid,
            )
        )
    broken = uids[WRITE_CHUNK + 1]
    spec_path(h.cdi_root, o.DRIVER, broken).mkdir(parents=True)  # a directory where its spec goes
    out = await h.driver.prepare([ClaimRef(o.NAMESPACE, uid, f"c{i}") for i, uid in enumerate(uids)])
    assert "not a regular file" in out[broken].error
    assert h.checkpoint()[broken]["checkpointState"] == "PrepareStarted"
    for uid in uids:
        if uid == broken:
            continue
        assert out[uid].error == "" and h.checkpoint()[uid]["checkpointState"] == "PrepareCompleted"
        partition = h.claim_dir(uid) / "r1"
        assert sorted(p.name for p in partition.iterdir()) == ["config", "sm_node", "vgpu_lock", "vmem_node"]
        assert (partition / "config" / "pids.config").read_bytes() == b""
        assert h.spec(uid)["devices"]

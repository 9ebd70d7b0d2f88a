"""The node's container store: one record per instance, found by ID, by (pod UID, container name) and
by injection state, with the indexes kept in step through every write."""

from __future__ import annotations

from pathlib import PurePosixPath

from vgpud.containers.linux import ContainerLinux
from vgpud.containers.record import Injection, NodeContainer
from vgpud.containers.store import ContainerStore

CLAIM = "11111111-2222-3333-4444-555555555555"
DIR_A, DIR_B = PurePosixPath("/claims/a"), PurePosixPath("/claims/b")


def record(cid: str, pod: str = "p", name: str = "main", **fields: object) -> NodeContainer:
    return NodeContainer(cid, pod, name, "ns", f"pod-{pod}", **fields)  # type: ignore[arg-type]


def injected(cid: str, pod: str = "p", name: str = "main", directory: PurePosixPath = DIR_A) -> NodeContainer:
    return record(cid, pod, name, claim_uid=CLAIM, injection=Injection.INJECTED, directory=directory)


def test_a_bulk_replace_keeps_the_later_of_a_repeated_id_and_the_index_in_step() -> None:
    store = ContainerStore()
    store.set(injected("old", name="c", directory=PurePosixPath("/x")))
    first, second, third = injected("1"), injected("2", pod="q", directory=DIR_B), injected("3")
    store.replace([first, second, second._replace(container_id="1"), third])
    assert store.synced and len(store) == 3 and store.by_id("old") is None
    assert store.by_id("1") == second._replace(container_id="1")
    assert store.instances("p", "main") == ["3"] and store.instances("q", "main") == ["2", "1"]
    assert store.injected("q", "main") == second._replace(container_id="1")
    assert store.instances("p", "c") == [] and store.count(Injection.INJECTED) == 3


def test_injected_skips_newer_instances_vgpud_did_not_inject() -> None:
    store = ContainerStore()
    store.set(injected("a"))
    store.set(record("b", claim_uid=CLAIM, injection=Injection.MISSING, directory=DIR_A, missing=("env X",)))
    store.set(record("c", claim_uid=CLAIM, injection=Injection.REFUSED))
    assert store.newest("p", "main").container_id == "c"
    assert store.injected("p", "main").container_id == "a"
    assert store.users(DIR_A) == ["a"]
    assert [r.container_id for r in store.select()] == ["a", "b", "c"]
    assert [r.container_id for r in store.select(Injection.MISSING)] == ["b"]
    assert store.count() == 3 and store.count(Injection.REFUSED) == 1


def test_a_container_without_a_claim_is_kept_but_never_selected() -> None:
    store = ContainerStore()
    store.set(record("plain", running=True, pid=7))
    assert store.by_id("plain").pid == 7 and store.running_ids() == ["plain"]
    assert store.select() == [] and store.count() == 0 and store.injected("p", "main") is None


def test_refresh_takes_the_runtimes_facts_and_keeps_the_vgpu_fields() -> None:
    store = ContainerStore()
    store.set(injected("a"))
    store.set(injected("b"))
    rules = ContainerLinux.of("/kubepods/p/a", ())
    store.refresh(record("a", running=True, pid=42, linux=rules))
    now = store.by_id("a")
    assert now.running and now.pid == 42 and now.linux == rules
    assert now.injection is Injection.INJECTED and now.directory == DIR_A and now.claim_uid == CLAIM
    # a lifecycle event does not make an older instance the newest
    assert store.newest("p", "main").container_id == "b"
    store.refresh(record("unknown", running=True))
    assert store.by_id("unknown").injection is Injection.NO_CLAIM


def test_a_record_that_loses_its_claim_leaves_the_claimed_index() -> None:
    store = ContainerStore()
    store.set(record("a", claim_uid=CLAIM, injection=Injection.REFUSED))
    store.set(record("a"))
    assert store.count() == 0 and store.by_id("a") is not None


def test_pop_and_pop_pod_keep_every_index_in_step() -> None:
    store = ContainerStore()
    for cid, pod, name in (("1", "p", "main"), ("2", "p", "side"), ("3", "q", "main")):
        store.set(injected(cid, pod, name))
    assert store.pop("nope") is None
    assert [r.container_id for r in store.pop_pod("p")] == ["1", "2"]
    assert store.newest("p", "main") is None and store.count() == 1 and len(store) == 1
    assert store.pop("3") is not None and store.select() == [] and len(store) == 0
    assert store.newest("q", "main") is None


def test_a_record_whose_pod_changes_is_reindexed() -> None:
    store = ContainerStore()
    store.set(record("a"))
    store.set(record("a", pod="q"))
    assert store.newest("p", "main") is None and store.newest("q", "main").container_id == "a"

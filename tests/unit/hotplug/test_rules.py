"""The hot-plug decisions: every refusal's status and what its message names, idempotency."""

from __future__ import annotations

from dataclasses import replace

import pytest
from grpclib.const import Status

from tests.unit.hotplug.world import CLAIM, CLAIMS, KEY, OTHER_SLAVE, RUNNING, SLAVE, TARGET
from vgpud.containers.record import Injection
from vgpud.hotplug.rules import (
    MAX_ATTACHMENTS,
    MAX_FIELD,
    AttachKey,
    AttachPlan,
    AttachState,
    Decision,
    Refusal,
    Repair,
    SlaveClaim,
    parse_key,
    plan_attach,
    plan_detach,
    plan_reconcile,
)


def check(info: pytest.ExceptionInfo[Refusal], status: Status, *names: str) -> None:
    assert info.value.status is status, info.value
    for name in names:
        assert name in info.value.message, (name, info.value.message)


def test_a_valid_key() -> None:
    assert parse_key(TARGET, "app", SLAVE) == KEY
    assert parse_key("0" * 32, "app", SLAVE).target_pod_uid == "0" * 32  # a static pod's UID


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        (("", "app", SLAVE), ("target_pod_uid is empty",)),
        ((TARGET, "", SLAVE), ("container_name is empty",)),
        ((TARGET, "app", ""), ("slave_pod_uid is empty",)),
        (("x" * (MAX_FIELD + 1), "app", SLAVE), ("target_pod_uid", f"at most {MAX_FIELD}")),
        ((TARGET, "a" * 1000, SLAVE), ("container_name", "1000 characters")),
        (("not-a-uid", "app", SLAVE), ("target_pod_uid", "not a pod UID")),
        ((TARGET, "app", SLAVE.upper()), ("slave_pod_uid", "not a pod UID")),
        ((TARGET, "app", SLAVE + "\n"), ("slave_pod_uid", "not a pod UID")),
        ((TARGET, "App_1", SLAVE), ("container_name", "not a DNS label")),
        ((TARGET, "../x", SLAVE), ("container_name", "not a DNS label")),
        ((TARGET, "app", TARGET), ("same pod", TARGET)),
    ],
)
def test_bad_input_is_invalid_argument(fields: tuple[str, str, str], names: tuple[str, ...]) -> None:
    with pytest.raises(Refusal) as info:
        parse_key(*fields)
    check(info, Status.INVALID_ARGUMENT, *names)


def attach(**changes: object) -> AttachPlan:
    args: dict[str, object] = {
        "target": RUNNING,
        "synced": True,
        "slave_claims": CLAIMS,
        "attachments": {},
        "now": 100.0,
    }
    args.update(changes)
    return plan_attach(KEY, **args)  # type: ignore[arg-type]


def test_a_new_attachment() -> None:
    plan = attach()
    assert plan.decision is Decision.ATTACH and plan.previous is None
    a = plan.attachment
    assert (a.key, a.container_id, a.target_pod_namespace, a.target_pod_name) == (
        KEY,
        "c" * 64,
        "team",
        "trainer",
    )
    assert a.claims == CLAIMS and a.attached_at == 100.0


def test_attaching_twice_is_one_attachment() -> None:
    first = attach().attachment
    again = attach(attachments={KEY: first}, now=200.0)
    assert again.decision is Decision.ALREADY
    assert again.attachment is first  # the existing record, its time included


def test_a_half_done_attachment_is_made_again() -> None:
    for state in (AttachState.ATTACHING, AttachState.DETACHING):
        first = replace(attach().attachment, state=state)
        assert attach(attachments={KEY: first}).decision is Decision.REATTACH


def test_a_restarted_container_is_attached_again() -> None:
    first = attach().attachment
    restarted = RUNNING._replace(container_id="d" * 64)
    plan = attach(target=restarted, attachments={KEY: first})
    assert plan.decision is Decision.REATTACH
    assert plan.previous is first and plan.attachment.container_id == "d" * 64


def test_changed_claims_are_attached_again() -> None:
    first = attach().attachment
    more = (*CLAIMS, SlaveClaim("team", "second", "cccccccc-0000-0000-0000-000000000002", ("vgpu-1",)))
    assert attach(slave_claims=more, attachments={KEY: first}).decision is Decision.REATTACH


def test_unknown_target_before_and_after_the_first_synchronize() -> None:
    with pytest.raises(Refusal) as info:
        attach(target=None, synced=False)
    check(info, Status.UNAVAILABLE, "container app of pod " + TARGET, "retry")
    with pytest.raises(Refusal) as info:
        attach(target=None)
    check(info, Status.NOT_FOUND, "container app of pod " + TARGET, "NRI")


def test_a_target_that_is_not_running() -> None:
    with pytest.raises(Refusal) as info:
        attach(target=RUNNING._replace(running=False, pid=0))
    check(info, Status.FAILED_PRECONDITION, TARGET, "team/trainer", "c" * 64, "not running")


@pytest.mark.parametrize(
    "not_injected",
    [
        {"injection": Injection.NO_CLAIM, "claim_uid": "", "directory": None},
        {"injection": Injection.REFUSED, "directory": None},
        {"injection": Injection.MISSING, "missing": ("mount /etc/vgpu-manager/config",)},
    ],
    ids=["no-claim", "refused", "missing"],
)
def test_a_target_that_is_not_a_vgpu_container(not_injected: dict[str, object]) -> None:
    with pytest.raises(Refusal) as info:
        attach(target=RUNNING._replace(**not_injected))
    check(info, Status.FAILED_PRECONDITION, "is not a vGPU container", "team/trainer")


def test_a_slave_without_a_prepared_claim() -> None:
    with pytest.raises(Refusal) as info:
        attach(slave_claims=())
    check(info, Status.FAILED_PRECONDITION, f"slave pod {SLAVE}", "no vGPU claim prepared on this node")


def test_a_claim_the_target_pod_holds_itself() -> None:
    shared = (replace(CLAIMS[0], reserved_for=frozenset({SLAVE, TARGET})),)
    with pytest.raises(Refusal) as info:
        attach(slave_claims=shared)
    check(info, Status.FAILED_PRECONDITION, f"claim team/slave-gpu ({CLAIM})", TARGET, "hold the devices")


def test_a_slave_attached_elsewhere_must_be_detached_first() -> None:
    elsewhere = replace(attach().attachment, key=AttachKey(TARGET, "sidecar", SLAVE))
    with pytest.raises(Refusal) as info:
        attach(attachments={elsewhere.key: elsewhere})
    check(info, Status.FAILED_PRECONDITION, "container sidecar of pod " + TARGET, "detach it first")
    # another slave pod may attach to the same container
    other = replace(elsewhere, key=AttachKey(TARGET, "app", OTHER_SLAVE))
    assert attach(attachments={other.key: other}).decision is Decision.ATTACH


def test_the_table_is_bounded() -> None:
    template = attach().attachment
    full = {}
    for n in range(MAX_ATTACHMENTS):
        key = AttachKey(TARGET, f"c{n}", f"{n:032x}")
        full[key] = replace(template, key=key)
    with pytest.raises(Refusal) as info:
        attach(attachments=full)
    check(info, Status.RESOURCE_EXHAUSTED, str(MAX_ATTACHMENTS))


def test_detach() -> None:
    a = attach().attachment
    assert plan_detach(KEY, {KEY: a}) is a
    with pytest.raises(Refusal) as info:
        plan_detach(KEY, {})
    check(info, Status.NOT_FOUND, f"slave pod {SLAVE} is not attached to container app of pod {TARGET}")


def test_reconcile_plan() -> None:
    done = attach().attachment
    other = AttachKey(TARGET, "other", OTHER_SLAVE)
    table = {
        KEY: done,
        other: replace(done, key=other, container_id="d" * 64, state=AttachState.ATTACHING),
    }
    everything = {"running": lambda cid: True, "prepared": lambda uid: True}
    assert plan_reconcile({KEY: done}, **everything) == []
    assert [(a.key, r) for a, r, _ in plan_reconcile(table, **everything)] == [(other, Repair.GRANT)]
    gone = plan_reconcile(table, running=lambda cid: cid != "c" * 64, prepared=lambda uid: True)
    assert [(a.key, r) for a, r, _ in gone] == [(KEY, Repair.FORGET), (other, Repair.GRANT)]
    unprepared = plan_reconcile(table, running=lambda cid: True, prepared=lambda uid: uid != CLAIM)
    assert [(a.key, r, why) for a, r, why in unprepared] == [
        (KEY, Repair.REVOKE, f"claim team/slave-gpu ({CLAIM}) of slave pod {SLAVE} is no longer prepared"),
        (
            other,
            Repair.REVOKE,
            f"claim team/slave-gpu ({CLAIM}) of slave pod {OTHER_SLAVE} is no longer prepared",
        ),
    ]
    detaching = {KEY: replace(done, state=AttachState.DETACHING)}
    assert [r for _, r, _ in plan_reconcile(detaching, **everything)] == [Repair.REVOKE]
    # a gone instance wins over everything: its cgroup (and the grant in it) is gone
    assert [
        r for _, r, _ in plan_reconcile(detaching, running=lambda cid: False, prepared=lambda u: False)
    ] == [Repair.FORGET]

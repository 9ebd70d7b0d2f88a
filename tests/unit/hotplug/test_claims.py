"""The slave pod's claims, read from the real claim index (built from a checkpoint, as at start)."""

from __future__ import annotations

from tests.unit.hotplug.world import SLAVE, TARGET
from vgpud.dra.checkpoint import Checkpoint, ClaimEntry, PreparedDevice, PrepareState
from vgpud.dra.claimindex import ClaimIndex
from vgpud.hotplug.claims import slave_claims
from vgpud.hotplug.rules import SlaveClaim
from vgpud.partition.assigner import Mode

A = "cccccccc-0000-0000-0000-00000000000a"
B = "cccccccc-0000-0000-0000-00000000000b"
NOT_VGPU = "cccccccc-0000-0000-0000-00000000000c"
STARTED = "cccccccc-0000-0000-0000-00000000000d"


def entry(
    name: str, pods: tuple[str, ...], *, vgpu: bool = True, state: PrepareState = PrepareState.COMPLETED
) -> ClaimEntry:
    return ClaimEntry(
        state=state,
        name=name,
        namespace="team",
        prepared_devices=(PreparedDevice(("gpu",), "node-1", f"{name}-dev", ()),),
        vgpu=vgpu,
        status={"reservedFor": [{"resource": "pods", "name": f"p-{p[:4]}", "uid": p} for p in pods]},
        mode="lazy",
    )


def index() -> ClaimIndex:
    idx = ClaimIndex(Mode.LAZY)
    claims = {
        A: entry("a", (SLAVE,)),
        B: entry("b", (TARGET,)),
        NOT_VGPU: entry("plain", (SLAVE,), vgpu=False),
        STARTED: entry("half", (SLAVE,), state=PrepareState.STARTED),
    }
    idx.update(Checkpoint("boot", claims))
    return idx


def test_only_prepared_vgpu_claims_reserved_for_the_pod() -> None:
    assert slave_claims(index(), SLAVE) == [SlaveClaim("team", "a", A, ("a-dev",), frozenset({SLAVE}))]
    assert [c.uid for c in slave_claims(index(), TARGET)] == [B]
    assert slave_claims(index(), "00000000-0000-0000-0000-000000000000") == []


def test_the_claim_watch_overrides_what_prepare_saw() -> None:
    idx = index()
    idx.set_reserved(B, {TARGET, SLAVE})  # the slave pod joined claim b after Prepare
    found = slave_claims(idx, SLAVE)
    assert [c.uid for c in found] == [A, B]
    assert found[1].reserved_for == {TARGET, SLAVE}
    idx.set_reserved(A, ())  # claim a was deleted
    assert [c.uid for c in slave_claims(idx, SLAVE)] == [B]
    idx.forget(B)  # unprepared
    assert slave_claims(idx, SLAVE) == []

"""Bug 2: a claim served in another partition mode than it was prepared in is visible in the metrics,
the debug state and a health detail (which never makes the node NOT_SERVING)."""

from __future__ import annotations

from pathlib import Path

from tests import objects as o
from tests.draharness import REF, Harness, single_container_claim
from tests.unit.observe.node import make_node
from tests.unit.observe.test_metrics import families, family, value
from vgpud import metrics_names as names
from vgpud.componenthealth import HealthRegistry, HealthState
from vgpud.node.build import watch_claim_modes
from vgpud.node.names import CLAIM_MODES


async def prepare_lazily(root: Path) -> None:
    lazy = Harness(root, lazy=True)
    claim, pod = single_container_claim()
    lazy.kube.add_claim(claim)
    lazy.kube.add_pod(pod)
    assert (await lazy.driver.prepare([REF]))[o.CLAIM_UID].error == ""


async def test_a_lazy_claim_under_eager_mode_is_in_metrics_state_and_health(short_tmp: Path) -> None:
    await prepare_lazily(short_tmp)
    node = make_node(
        short_tmp, lazy=False, nri_fallback="connection refused"
    )  # restarted: the NRI socket was slow
    driver = node.harness.driver
    await driver.load()

    found = families(node)
    mismatches = found[family(names.CLAIM_MODE_MISMATCHES)]
    assert value(mismatches, "vgpud_claim_mode_mismatches", prepared_mode="lazy") == 1
    assert value(mismatches, "vgpud_claim_mode_mismatches", prepared_mode="eager") == 0

    state = await node.state.snapshot()
    (mismatch,) = state["claim_modes"]["mismatches"]
    assert state["claim_modes"]["current"] == "eager"
    assert (mismatch["claim_uid"], mismatch["prepared"], mismatch["current"]) == (
        o.CLAIM_UID,
        "lazy",
        "eager",
    )
    assert "no per-container directory" in mismatch["consequence"]

    health = HealthRegistry()
    health.register("dra-plugin")
    health.set("dra-plugin", HealthState.HEALTHY)
    watch_claim_modes(health, driver)
    detail = health.get(CLAIM_MODES)
    assert detail.state is HealthState.FAILING and o.CLAIM_UID in detail.reason
    assert health.all_healthy(), "a mode mismatch is a detail, not NOT_SERVING"
    # the claim unprepared: the detail clears
    assert await driver.unprepare([REF]) == {o.CLAIM_UID: ""}
    assert health.get(CLAIM_MODES).state is HealthState.HEALTHY
    assert (
        value(
            families(node)[family(names.CLAIM_MODE_MISMATCHES)],
            "vgpud_claim_mode_mismatches",
            prepared_mode="lazy",
        )
        == 0
    )


async def test_no_mismatch_in_a_node_that_kept_its_mode(short_tmp: Path) -> None:
    node = make_node(short_tmp, lazy=True)
    found = families(node)
    for prepared in ("lazy", "eager"):
        assert (
            value(
                found[family(names.CLAIM_MODE_MISMATCHES)],
                "vgpud_claim_mode_mismatches",
                prepared_mode=prepared,
            )
            == 0
        )
    assert (
        value(
            found[family(names.NRI_REJECTED_CONTAINERS)],
            "vgpud_nri_rejected_containers_total",
            reason="not-reserved",
        )
        == 0
    )
    assert value(found[family(names.NRI_OTHER_MODE_CONTAINERS)], "vgpud_nri_other_mode_containers_total") == 0

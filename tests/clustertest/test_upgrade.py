"""A rolling upgrade from a vgpud that does not publish `nriMode` (issue 35, item 3), on two NRI nodes:
both start as that release (tests/e2e/previous_vgpud.py), then node-0's vgpud is replaced by today's,
then node-1's, one node at a time as the DaemonSet's rolling update does, while claims are created.

Three kinds of claim are created before the roll and again halfway through it: `plain` (no selector),
`optional` (the NRI selector in its optional form, `.?nriMode.orValue(false)`, which the webhook's
relaxations accept) and `strict` (the plain form, `.nriMode == true`).

- Before the roll no device has the attribute: `plain` runs; `optional` and `strict` wait with a
  FailedScheduling event (for `strict`, the scheduler's CEL error names the missing key).
- node-0 rolled: `optional` is allocated there and runs; `strict` still waits while node-1's devices
  lack the attribute (the CEL error aborts the whole allocation; README, "Upgrading from a vgpud
  without `nriMode`").
- Both rolled: every claim is allocated and every pod runs; none failed at any point, and the pods
  that ran before the roll keep their containers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import workload as w
from tests.e2e.cluster import LocalCluster, NodeSpec, started
from tests.e2e.node import DRIVER, LocalNode, node_available
from tests.support import require
from vgpud.relaxations import NRI_MODE_ATTRIBUTE, nri_selector, nri_selector_optional

PREVIOUS = "tests.e2e.previous_vgpud"
NODES = ("node-0", "node-1")
SELECTORS = {"plain": None, "optional": nri_selector_optional(DRIVER), "strict": nri_selector(DRIVER)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require(node_available(), "the local node's runtime", "run make node-deps (make cluster-test does)")
    with started([NodeSpec(name, vgpud_module=PREVIOUS) for name in NODES]) as local:
        yield local


def claim_request(selector: str | None) -> dict[str, Any]:
    request = w.vgpu_request("gpu", "1Gi", "10")
    if selector is not None:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return request


def create(node: LocalNode, ns: str, stage: str) -> list[str]:
    """A claim and its pod of each kind; their names."""
    names = []
    for kind, selector in SELECTORS.items():
        name = f"{kind}-{stage}"
        w.create_claim(node, ns, name, [claim_request(selector)])
        w.create_pod(node, ns, name, [w.container("main", [("gpu", None)])], {"gpu": name})
        names.append(name)
    return names


def published(node: LocalNode, host: str) -> set[bool | None]:
    """The `nriMode` values on `host`'s devices (None: a device without it)."""
    slices = node.get("/apis/resource.k8s.io/v1/resourceslices")["items"]
    return {
        device["attributes"].get(NRI_MODE_ATTRIBUTE, {}).get("bool")
        for item in slices
        if item["spec"].get("nodeName") == host
        for device in item["spec"].get("devices", [])
    }


def roll(cluster: LocalCluster, host: str) -> None:
    """Replace `host`'s vgpud by today's and wait until its slice says nriMode."""
    node = cluster.nodes[host]
    node.vgpud_module = "vgpud"
    node.restart_vgpud()
    w.wait_for(lambda: published(node, host) == {True}, what=f"{host}'s devices publishing nriMode")


def waiting(node: LocalNode, ns: str, name: str) -> str:
    """The pod's FailedScheduling message once it has one, the pod unscheduled and not failed."""

    def reason() -> str:
        pod = w.get_pod(node, ns, name)
        assert pod["status"].get("phase") != "Failed", pod["status"]
        if pod["spec"].get("nodeName"):
            raise AssertionError(f"{name} scheduled on {pod['spec']['nodeName']}")
        messages = [e["message"] for e in w.pod_events(node, ns, name) if e["reason"] == "FailedScheduling"]
        return messages[-1] if messages else ""

    return w.wait_for(reason, timeout=60, what=f"pod {name}: a FailedScheduling event")


def test_a_rolling_upgrade_from_a_vgpud_without_nri_mode(cluster: LocalCluster) -> None:
    node = cluster.nodes["node-0"]
    ns = w.namespace(node, "upgrade")
    assert published(node, "node-0") == published(node, "node-1") == {None}
    before = create(node, ns, "before")
    ran_before = w.wait_running(node, ns, "plain-before")
    reasons = {name: waiting(node, ns, name) for name in ("optional-before", "strict-before")}
    assert NRI_MODE_ATTRIBUTE in reasons["strict-before"], reasons

    roll(cluster, "node-0")
    during = create(node, ns, "during")
    for name in ("optional-before", "optional-during"):
        assert w.wait_running(node, ns, name)["spec"]["nodeName"] == "node-0", name
    w.wait_running(node, ns, "plain-during")
    reasons |= {
        f"{name} (node-0 rolled)": waiting(node, ns, name) for name in ("strict-before", "strict-during")
    }

    roll(cluster, "node-1")
    pods = {name: w.wait_running(node, ns, name) for name in before + during}
    assert w.container_id(pods["plain-before"], "main") == w.container_id(ran_before, "main")
    for name, pod in pods.items():
        allocation = w.get_claim(node, ns, name)["status"]["allocation"]
        assert [r["pool"] for r in allocation["devices"]["results"]] == [pod["spec"]["nodeName"]], name
    print("\nrolling upgrade from a vgpud without nriMode, why pods waited:", flush=True)
    for name, message in reasons.items():
        print(f"  {name}: {message}", flush=True)

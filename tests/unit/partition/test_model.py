"""Claim and pod views from API dicts: what is kept, what is dropped, and what is refused."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests import objects as o
from vgpud.partition.model import (
    AllocatedDevice,
    ClaimView,
    ContainerKind,
    ContainerRef,
    ModelError,
    PodView,
    ReservedPod,
    claim_consumers,
    container_requests,
)

U1 = o.POD1_UID


def _claim() -> dict[str, Any]:
    return o.claim(
        requests=[o.exactly("gpu"), o.first_available("alt", "big", "small"), o.exactly("nic", "dranet")],
        results=[
            o.result("gpu", "vgpu-0", share_id="a1b2"),
            o.result("alt/small", "vgpu-1", cores=None),
            o.result("nic", "eth1", driver=o.OTHER_DRIVER),
        ],
        reserved_for=[
            {"resource": "pods", "name": "trainer", "uid": U1},
            {"apiGroup": "example.io", "resource": "jobs", "name": "j", "uid": "j-uid"},
        ],
        annotations={"nvidia.com/vgpu-compute-policy": "balance"},
    )


def test_claim_keeps_our_devices_and_folds_subrequests() -> None:
    claim = ClaimView.from_dict(_claim(), o.DRIVER)
    assert (claim.uid, claim.name, claim.namespace, claim.allocated) == (
        o.CLAIM_UID,
        "gpu-claim",
        "default",
        True,
    )
    assert claim.devices == (
        AllocatedDevice("gpu", None, "node-a", "vgpu-0", "a1b2", {"cores": "40", "memory": "4Gi"}),
        AllocatedDevice("alt", "small", "node-a", "vgpu-1", "alt-small-vgpu-1-share", {"memory": "4Gi"}),
    )
    assert claim.devices[1].result_request == "alt/small"
    assert claim.requests == ("alt", "gpu")
    assert claim.reserved_for == (ReservedPod("trainer", U1),)
    assert claim.annotations == {"nvidia.com/vgpu-compute-policy": "balance"}


def test_unallocated_claim_has_no_devices() -> None:
    raw = _claim()
    del raw["status"]["allocation"]
    claim = ClaimView.from_dict(raw, o.DRIVER)
    assert not claim.allocated and claim.devices == () and claim.requests == ()


def _pod() -> dict[str, Any]:
    return o.pod(
        "trainer",
        U1,
        claims={"gpu": "gpu-claim"},
        templates={"scratch": "trainer-scratch-4k9q"},
        init=[
            o.container("prep", o.ref("gpu", "gpu")),
            o.container("agent", o.ref("scratch"), restart="Always"),
        ],
        containers=[o.container("main", o.ref("gpu")), o.container("idle")],
    )


def test_pod_containers_kinds_and_claim_names() -> None:
    pod = PodView.from_dict(_pod())
    assert [(c.ref.kind, c.ref.name, c.ref.sidecar) for c in pod.containers] == [
        (ContainerKind.INIT, "prep", False),
        (ContainerKind.INIT, "agent", True),
        (ContainerKind.APP, "main", False),
        (ContainerKind.APP, "idle", False),
    ]
    assert pod.claim_names == {"gpu": "gpu-claim", "scratch": "trainer-scratch-4k9q"}
    assert pod.containers[1].ref.node == f"{U1}/init/agent"


def test_container_requests() -> None:
    claim = ClaimView.from_dict(_claim(), o.DRIVER)
    pod = PodView.from_dict(_pod())
    assert container_requests(claim, pod) == {
        ContainerRef(U1, ContainerKind.INIT, "prep"): ("gpu",),
        ContainerRef(U1, ContainerKind.APP, "main"): ("alt", "gpu"),  # no request: every vGPU request
    }
    # a reference to another driver's request adds nothing; one to a subrequest folds into its request
    raw = _pod()
    raw["spec"]["containers"][1]["resources"] = {"claims": [o.ref("gpu", "nic"), o.ref("gpu", "alt/big")]}
    assert container_requests(claim, PodView.from_dict(raw))[ContainerRef(U1, ContainerKind.APP, "idle")] == (
        "alt",
    )


def test_generated_claim_names_come_from_the_pod_status() -> None:
    generated = o.claim(name="trainer-gpu-7xk2q", requests=[o.exactly("gpu")], results=[o.result("gpu")])
    claim = ClaimView.from_dict(generated, o.DRIVER)
    not_yet = PodView.from_dict(
        o.pod("trainer", U1, templates={"gpu": None}, containers=[o.container("main", o.ref("gpu"))])
    )
    assert not_yet.claim_names == {"gpu": None} and container_requests(claim, not_yet) == {}
    done = PodView.from_dict(
        o.pod(
            "trainer",
            U1,
            templates={"gpu": "trainer-gpu-7xk2q"},
            containers=[o.container("main", o.ref("gpu"))],
        )
    )
    assert container_requests(claim, done) == {ContainerRef(U1, ContainerKind.APP, "main"): ("gpu",)}


def test_only_reserved_pods_of_the_claims_namespace_consume() -> None:
    claim = ClaimView.from_dict(_claim(), o.DRIVER)
    reserved = PodView.from_dict(_pod())
    impostor = PodView.from_dict(
        o.pod(
            "trainer", "9d9d9d9d-0000-4000-8000-000000000000", containers=[o.container("main", o.ref("gpu"))]
        )
    )
    elsewhere = PodView.from_dict(
        o.pod("trainer", U1, namespace="other", containers=[o.container("main", o.ref("gpu"))])
    )
    assert set(claim_consumers(claim, [impostor, elsewhere])) == set()
    assert [r.name for r in claim_consumers(claim, [impostor, reserved, elsewhere])] == ["main", "prep"]


Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = (int(p) if p.isdigit() else p for p in path.split("."))
        for part in parents:
            obj = obj[part]
        if value is _DELETE:
            del obj[last]
        else:
            obj[last] = value

    return mutate


_DELETE = object()
R0 = "status.allocation.devices.results.0"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set("metadata.uid", _DELETE), r"ResourceClaim default/gpu-claim: metadata\.uid: missing"),
        (_set("metadata.uid", "a/b"), "not a safe path component"),
        (_set("metadata", []), "metadata: expected an object, got list"),
        (_set(f"{R0}.request", "gone"), r"results\[0\]\.request: 'gone' names no request"),
        (_set(f"{R0}.request", "gpu/sub"), "request 'gpu' has no firstAvailable"),
        (_set("status.allocation.devices.results.1.request", "alt"), "names no firstAvailable subrequest"),
        (_set(f"{R0}.pool", _DELETE), r"results\[0\]\.pool: missing"),
        (_set(f"{R0}.consumedCapacity", {"cores": ["40"]}), "expected a quantity string"),
        (_set(f"{R0}.adminAccess", "yes"), "adminAccess: expected a boolean"),
        (_set("status.reservedFor.0.uid", _DELETE), r"reservedFor\[0\]\.uid: missing"),
        (_set("spec.devices.requests.0.name", "GPU_0"), "not a DNS label"),
        (_set("metadata.annotations", {"a": 1}), "values must be strings"),
    ],
)
def test_malformed_claims_are_refused_with_the_field(mutate: Mutation, message: str) -> None:
    raw = copy.deepcopy(_claim())
    mutate(raw)
    with pytest.raises(ModelError, match=message):
        ClaimView.from_dict(raw, o.DRIVER)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set("spec", _DELETE), "Pod default/trainer: spec: missing"),
        (_set("spec.resourceClaims.0.resourceClaimTemplateName", "t"), "exactly one of resourceClaimName"),
        (_set("spec.resourceClaims.0.resourceClaimName", _DELETE), "exactly one of resourceClaimName"),
        (_set("spec.containers.0.resources.claims.0.name", "nope"), "'nope' is not in spec.resourceClaims"),
        (_set("spec.containers.1.name", "prep"), "container name 'prep' is used twice"),
        (_set("spec.containers.0.name", "../etc"), "not a DNS label"),
        (_set("spec.initContainers", {"name": "x"}), "initContainers: expected a list"),
        (_set("spec.containers.0", "main"), r"containers\[0\]: expected an object, got str"),
    ],
)
def test_malformed_pods_are_refused_with_the_field(mutate: Mutation, message: str) -> None:
    raw = copy.deepcopy(_pod())
    mutate(raw)
    with pytest.raises(ModelError, match=message):
        PodView.from_dict(raw)


def test_not_an_object() -> None:
    with pytest.raises(ModelError, match="expected an object, got str"):
        PodView.from_dict("pod")
    with pytest.raises(ValueError):  # ModelError is a ValueError for callers that do not import it
        ClaimView.from_dict(None, o.DRIVER)

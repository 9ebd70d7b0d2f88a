"""What the kubelet and vgpud each hold for a claim on the local node, to compare across a kubelet
restart: the kubelet's DRA checkpoint (`<root-dir>/dra_manager_state`: the claims it prepared and the
CDI device IDs the driver returned), vgpud's recorded Prepare calls, and vgpud's files for the claim
(directory tree, CDI spec, checkpoint entry)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import DRIVER, LocalNode
from vgpud.observe.client import Endpoint, get_json

#: the kubelet's DRA manager keeps its claim cache in this file under its root dir
KUBELET_DRA_STATE = "dra_manager_state"


def kubelet_claims(node: LocalNode) -> dict[str, dict[str, Any]]:
    """Claim UID -> the kubelet's checkpointed ClaimInfoState ({} before its first checkpoint)."""
    try:
        outer = json.loads((node.kubelet_dir / KUBELET_DRA_STATE).read_text())
    except FileNotFoundError:
        return {}
    states = json.loads(outer["Data"])["ClaimInfoStateList"] or []
    return {state["ClaimUID"]: state for state in states}


def kubelet_cdi_ids(node: LocalNode, claim_uid: str) -> list[str]:
    """The CDI device IDs the kubelet holds for vgpud's devices of the claim (what it injects)."""
    devices = kubelet_claims(node)[claim_uid]["DriverState"][DRIVER]["Devices"] or []
    return sorted(i for device in devices for i in device["CDIDeviceIDs"] or [])


def prepare_calls(node: LocalNode, claim_uid: str) -> list[dict[str, Any]]:
    """vgpud's recorded Prepare calls for the claim (one per claim of each NodePrepareResources)."""
    query = f"/debug/calls?n=1000&hook=Prepare&claim={claim_uid}"
    return get_json(Endpoint(unix_path=node.debug_socket), query)["calls"]


@dataclass(frozen=True)
class ClaimFiles:
    """vgpud's files for one claim on the node."""

    #: partition (eager) or container (NRI) directories under the claim's directory
    subdirs: tuple[str, ...]
    #: every CDI spec file that names the claim
    specs: tuple[str, ...]
    #: the content of the claim's CDI spec ("" when absent)
    spec: str
    #: the claim's checkpoint entry state ("" when absent)
    checkpoint_state: str
    #: how many times the claim UID is a key in vgpud's checkpoint (any version)
    checkpoint_keys: int


def claim_files(node: LocalNode, claim_uid: str) -> ClaimFiles:
    spec = node.cdi_spec(claim_uid)
    entry = w.checkpoint_claims(node).get(claim_uid, {})
    try:
        data = json.loads(node.checkpoint.read_text())
    except FileNotFoundError:
        data = {}
    versions = [version for version in data.values() if isinstance(version, dict)]
    keys = sum(claim_uid in version.get("preparedClaims", {}) for version in versions)
    return ClaimFiles(
        subdirs=tuple(w.claim_subdirs(node, claim_uid)),
        specs=tuple(sorted(p.name for p in node.cdi_root.glob(f"*{claim_uid}*"))),
        spec=spec.read_text() if spec.exists() else "",
        checkpoint_state=entry.get("checkpointState", ""),
        checkpoint_keys=keys,
    )


def cleaned_up(node: LocalNode, claim_uid: str) -> bool:
    """Nothing of the claim is left: no directory, CDI spec, vgpud checkpoint or kubelet cache entry."""
    files = claim_files(node, claim_uid)
    gone = not node.claim_dir(claim_uid).exists() and not files.specs and not files.checkpoint_keys
    return gone and claim_uid not in kubelet_claims(node)

"""Reads a `Snapshot` (invariants.py) and vgpud's resource use off a running LocalNode."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.e2e.node import DRIVER, LocalNode
from tests.soak.invariants import PIDS_TARGET, Container, Snapshot
from vgpud.dra.cdi import spec_path
from vgpud.observe.client import Endpoint, get_json

#: the CDI spec file name around the claim UID (k8s.<driver>-claim_<uid>.json)
_SPEC_PREFIX, _SPEC_SUFFIX = spec_path(Path("/"), DRIVER, "UID").name.split("UID")


def collect(node: LocalNode, namespace: str) -> Snapshot:
    """The node as it is now; `namespace` holds the soak's pods (the running-container check)."""
    snap = Snapshot(mode="", health=_health(node))
    pods = node.get("/api/v1/pods")["items"]
    claims = node.get("/apis/resource.k8s.io/v1/resourceclaims")["items"]
    snap.pod_uids = {p["metadata"]["uid"] for p in pods}
    snap.needed_claims, by_name = _needed_claims(pods, claims)
    snap.running = [c for p in pods if p["metadata"]["namespace"] == namespace for c in _running(p, by_name)]
    claims_dir = node.manager_dir / "claims"
    snap.claim_dirs = _claim_dirs(claims_dir)
    snap.cdi_specs = {
        p.name[len(_SPEC_PREFIX) : -len(_SPEC_SUFFIX)]
        for p in node.cdi_root.glob(f"{_SPEC_PREFIX}*{_SPEC_SUFFIX}")
    }
    snap.checkpoint = _checkpoint(node.checkpoint)
    try:
        state = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")
    except (OSError, RuntimeError, ValueError) as err:  # the verdict reports it
        snap.state_error = f"{type(err).__name__}: {err}"
        return snap
    snap.mode = state["mode"]
    if state.get("nri"):
        snap.nri_cache = {
            _relative(d, claims_dir): set(row["container_ids"])
            for d, row in state["nri"]["cache"]["directories"].items()
        }
        snap.not_injected = set(state["nri"]["not_injected"])
    for part in (state.get("partitions") or {}).values():
        snap.partitions.setdefault(_relative(part["directory"], claims_dir), set()).update(part["containers"])
    return snap


def _health(node: LocalNode) -> int | None:
    import grpc

    try:
        return node.vgpud_health()
    except grpc.RpcError:
        return None


def _needed_claims(
    pods: list[dict[str, Any]], claims: list[dict[str, Any]]
) -> tuple[set[str], dict[tuple[str, str], str]]:
    """Claims reserved for a pod or named by a pod that exists; and (namespace, name) -> claim UID."""
    by_name = {(c["metadata"]["namespace"], c["metadata"]["name"]): c["metadata"]["uid"] for c in claims}
    needed = {c["metadata"]["uid"] for c in claims if c.get("status", {}).get("reservedFor")}
    for pod in pods:
        ns = pod["metadata"]["namespace"]
        for ref in pod["spec"].get("resourceClaims", []):
            name = ref.get("resourceClaimName")
            if name and (ns, name) in by_name:
                needed.add(by_name[ns, name])
        for status in pod.get("status", {}).get("resourceClaimStatuses", []):
            if status.get("resourceClaimName") and (ns, status["resourceClaimName"]) in by_name:
                needed.add(by_name[ns, status["resourceClaimName"]])
    return needed, by_name


def _running(pod: dict[str, Any], by_name: dict[tuple[str, str], str]) -> list[Container]:
    """The pod's running containers that reference a claim, with that claim's UID."""
    meta = pod["metadata"]
    if meta.get("deletionTimestamp"):
        return []  # being stopped: StopPodSandbox may already have removed its directories
    claim_of = {
        ref["name"]: by_name.get((meta["namespace"], ref.get("resourceClaimName", "")), "")
        for ref in pod["spec"].get("resourceClaims", [])
    }
    refs = {
        c["name"]: [r["name"] for r in c.get("resources", {}).get("claims", [])]
        for c in pod["spec"]["containers"]
    }
    out = []
    for status in pod.get("status", {}).get("containerStatuses", []):
        names = refs.get(status["name"], [])
        if not names or "running" not in status.get("state", {}) or not status.get("containerID"):
            continue
        out.append(
            Container(
                namespace=meta["namespace"],
                pod=meta["name"],
                pod_uid=meta["uid"],
                name=status["name"],
                container_id=status["containerID"].split("://", 1)[1],
                claim_uid=claim_of.get(names[0], ""),
            )
        )
    return out


def _claim_dirs(claims_dir: Path) -> dict[str, set[str]]:
    """Claim UID -> the directories under it that hold the registration target."""
    out: dict[str, set[str]] = {}
    if not claims_dir.is_dir():
        return out
    for claim in claims_dir.iterdir():
        out[claim.name] = {
            str(p.relative_to(claim)).removesuffix(f"/{PIDS_TARGET}") for p in claim.rglob("pids.config")
        }
    return out


def _checkpoint(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    claims = data.get("v2", {}).get("preparedClaims", {})
    return {uid: entry.get("checkpointState", "") for uid, entry in claims.items()}


def _relative(directory: str, claims_dir: Path) -> str:
    return os.path.relpath(directory, claims_dir)


def resources(pid: int) -> tuple[int, int]:
    """(open file descriptors, RSS in KiB) of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return fds, int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")

"""The chart's objects against the real API server of `tests.kubeapi`: REST paths found by discovery
(no table of kinds to keep up to date), a namespace created for real, and the optional objects' CRDs
installed from hack/fetch-chart-crds.sh's cache."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from tests.kubeapi import ApiServer, api_request, cache_dir
from tests.support import require

CRDS_HINT = "run hack/fetch-chart-crds.sh (`make test` does it)"
ESTABLISH_TIMEOUT_S = 60.0


def crds_dir() -> Path | None:
    """Where hack/fetch-chart-crds.sh put the CRDs (CHART_CRDS_DIR in <cache>/chart-crds.env)."""
    try:
        text = (cache_dir() / "chart-crds.env").read_text()
    except OSError:
        return None
    pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    path = Path(pairs.get("CHART_CRDS_DIR", "/nonexistent"))
    return path if (path / ".complete").is_file() else None


def install_crds(server: ApiServer, groups: tuple[str, ...]) -> None:
    """Create the CRDs of `groups` (once per API server) and wait until each is Established."""
    directory = crds_dir()
    require(directory is not None, "the chart's optional CRDs", CRDS_HINT)
    assert directory is not None
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["group"] not in groups:
            continue
        try:
            api_request(server, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except urllib.error.HTTPError as err:
            if err.code != 409:  # another test installed it on this session's server
                raise AssertionError(f"creating CRD {path.name}: {err.read().decode()}") from err
        wait_established(server, crd["metadata"]["name"])


def wait_established(server: ApiServer, name: str) -> None:
    deadline = time.monotonic() + ESTABLISH_TIMEOUT_S
    conditions: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        crd = api_request(server, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.1)
    raise AssertionError(f"CRD {name} not Established in {ESTABLISH_TIMEOUT_S:g}s: {conditions}")


def _resources(server: ApiServer, group_version: str) -> dict[str, tuple[str, bool]]:
    """kind -> (plural, namespaced) of one group version, as the server's discovery lists them."""
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    listed = api_request(server, "GET", prefix)
    return {r["kind"]: (r["name"], r["namespaced"]) for r in listed["resources"] if "/" not in r["name"]}


def collection_path(server: ApiServer, manifest: dict[str, Any]) -> str:
    """The REST collection a manifest is created in, from the server's discovery."""
    group_version, kind = manifest["apiVersion"], manifest["kind"]
    resources = _resources(server, group_version)
    assert kind in resources, f"{group_version} {kind} is not served: {sorted(resources)}"
    plural, namespaced = resources[kind]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    if namespaced:
        return f"{prefix}/namespaces/{manifest['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


def create(server: ApiServer, manifest: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
    """POST one manifest, strict field validation (an unknown field is an error, not a warning);
    the server's answer, or an AssertionError with its message."""
    query = "fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
    what = f"{manifest['kind']} {manifest['metadata']['name']}"
    try:
        return api_request(server, "POST", f"{collection_path(server, manifest)}?{query}", manifest)
    except urllib.error.HTTPError as err:
        answer = err.read().decode(errors="replace")
        with contextlib.suppress(ValueError):  # a Status object's message, when the body is one
            answer = json.loads(answer).get("message", answer)
        raise AssertionError(f"{what} refused ({err.code}): {answer}") from err


def create_namespace(server: ApiServer, name: str) -> None:
    create(server, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, dry_run=False)

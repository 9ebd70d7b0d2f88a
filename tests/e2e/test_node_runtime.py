"""Each track runs on the runtime it names, and vgpud sees that runtime as docs/containerd2.md says:
containerd 1.7 or 2.x with its own shim; NRI on (the NRI version, the timeouts, the lifecycle RPCs the
runtime uses, 2.x's built-in validator) or explicitly off (no NRI socket although 2.x enables NRI by
default; vgpud eager)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tests.e2e import workload as w
from tests.e2e.conftest import WITH_CD2
from tests.e2e.leftovers import pids_naming
from tests.e2e.node import CONTAINERD_2, LocalNode
from vgpud.observe.client import Endpoint, get_json

SHIM = "containerd-shim-runc-v2"


def server_version(node: LocalNode) -> str:
    """The version containerd's own API reports (`ctr version`, the Server part)."""
    out = node.ctr("version").stdout
    match = re.search(r"^Server:\n\s+Version:\s+(\S+)", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def shim_binaries(node: LocalNode) -> set[str]:
    """The executables of this node's runc shims."""
    found = set()
    for pid in pids_naming(node.containerd_socket):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if Path(exe).name == SHIM:
            found.add(exe)
    return found


def nri_state(node: LocalNode) -> dict[str, Any]:
    return get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")


@WITH_CD2
def test_the_track_runs_on_its_runtime(node: LocalNode) -> None:
    version = server_version(node)
    log = node.log("containerd").read_text(errors="replace")
    # the config says what it means: no key ignored, nothing migrated from an older version
    assert "Ignoring unknown key" not in log and "Configuration migrated" not in log
    if node.containerd == CONTAINERD_2:
        assert version == node.env["CONTAINERD2_VERSION"], version
        want_shim = node.env["SHIM_BIN"]
    else:
        assert version.startswith("1.7."), version
        want_shim = str(Path(node.env["CONTAINERD_BIN"]).with_name(SHIM))

    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    w.wait_running(node, ns, "p")
    assert shim_binaries(node) == {want_shim}
    if node.containerd == CONTAINERD_2:  # its shim sockets under the node's dir, not /run/containerd/s
        assert any(entry.is_socket() for entry in (node.workdir / "s").iterdir())
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")

    state = nri_state(node)
    if not node.nri:
        assert not (node.nri_root / "nri.sock").exists()  # 2.x: only `disable = true` keeps it away
        assert state["mode"] == "eager" and state["nri"] is None and state["nri_fallback"] is None
        return
    session, requests = state["nri"]["session"], state["nri"]["stats"]["requests"]
    assert state["mode"] == "lazy"
    if node.containerd == CONTAINERD_2:
        assert session["runtime"] == f"containerd {version}"
        assert session["nri_version"].startswith("v0.12."), session
        assert (session["registration_timeout_ms"], session["request_timeout_ms"]) == (5000, 2000)
        # NRI v0.12 calls the dedicated lifecycle RPCs; StateChange only for a plugin without them
        assert requests.get("RemoveContainer", 0) >= 1 and requests.get("StopPodSandbox", 0) >= 1, requests
        assert "StateChange" not in requests, requests
        # the built-in validator ran beside vgpud, refusing hooks, seccomp, namespace and sysctl
        # adjustments, and let vgpud's injection through (the pod above ran with it)
        assert "validator plugins" in log and "default validator is disabled" not in log
    else:
        assert session["runtime"].startswith("containerd 1.7."), session
        assert session["nri_version"] == ""  # NRI v0.6.1 sends no version and no timeouts
        assert (session["registration_timeout_ms"], session["request_timeout_ms"]) == (0, 0)
        assert requests.get("StateChange", 0) >= 1, requests
        assert "RemoveContainer" not in requests and "StopPodSandbox" not in requests, requests

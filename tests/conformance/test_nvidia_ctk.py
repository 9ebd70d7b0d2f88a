"""vgpud's GPU edits against NVIDIA's own: `nvidia-ctk cdi generate` (the container toolkit, built from
its Go module) over the same fake driver root, a node laid out like a real GPU node.

The toolkit's spec and `vgpud driver --json` must name the same device nodes (each GPU's own, and the
control nodes), the same mounts (libraries, binaries, firmware, IPC sockets, the void mount), the same
env and the same nvidia-cdi-hook hooks, but for the differences below, each argued in
docs/driver-root.md. Both read the GPUs through the root's libnvidia-ml.so.1 (the fake, with no test
env: it finds its fake kernel as a driver finds its module), so both see the same driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakedriver import INSTALL, FakeKernel, build_driver_root, fake_driver_available
from tests.kubeapi import cache_dir
from tests.support import REPO, require
from vgpud.gpu.mock import shipped_profiles

PROFILE = shipped_profiles()["a100-40gb-x2"]
#: hooks of the toolkit's spec that vgpud does not emit (docs/driver-root.md): the EGL application
#: profile (graphics), and the driver-side memory limit per device (vgpud's limits are the library's)
NOT_EMITTED_HOOKS = {"update-application-profile", "apply-cuda-memory-limits"}
TIMEOUT_S = 60


def ctk_env() -> dict[str, str]:
    try:
        text = (cache_dir() / "nvidia-ctk.env").read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@pytest.fixture
def node_root(tmp_path: Path) -> Any:
    """A fake GPU node's driver root with nvidia-cdi-hook in usr/bin, its fake kernel running."""
    env = ctk_env()
    require(
        bool(env) and Path(env.get("NVIDIA_CTK_BIN", "/nonexistent")).is_file(),
        "nvidia-ctk and nvidia-cdi-hook",
        "run hack/install-nvidia-ctk.sh (make node-deps, which the test command runs)",
    )
    require(os.geteuid() == 0, "root (mknod of the fake driver's device nodes)", "run the tests as root")
    require(fake_driver_available(), "the fake driver", INSTALL)
    (tmp_path / "root").mkdir()
    layout = build_driver_root(tmp_path / "root", PROFILE, cdi_hook=Path(env["NVIDIA_CDI_HOOK_BIN"]))
    with FakeKernel.start(PROFILE, tmp_path / "state", layout.kernel_socket):
        yield layout, Path(env["NVIDIA_CTK_BIN"])


def clean_env() -> dict[str, str]:
    """No test setting of the fakes: they find the fake kernel from the root they were loaded from."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}


def toolkit_spec(ctk: Path, root: Path, *extra: str) -> dict[str, Any]:
    argv = [str(ctk), "cdi", "generate", "--mode=nvml", "--format=json", "--no-all-device"]
    argv += [f"--driver-root={root}", f"--dev-root={root}", "--feature-flags=disable-nvsandboxutils"]
    argv += ["--device-name-strategy=uuid", f"--nvidia-cdi-hook-path={root}/usr/bin/nvidia-cdi-hook", *extra]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=clean_env(), timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def vgpud_edits(root: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "vgpud", "driver", "--json", "--driver-root", str(root), *extra]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def mounts(edits: dict[str, Any]) -> set[tuple[str, str, tuple[str, ...]]]:
    """(hostPath, containerPath, options): vgpud also writes `type: bind`, which the options imply."""
    return {(m["hostPath"], m["containerPath"], tuple(m.get("options", ()))) for m in edits.get("mounts", ())}


def hooks(edits: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in edits.get("hooks", ()) if h["args"][1] not in NOT_EMITTED_HOOKS]


def test_vgpud_hands_over_what_nvidia_ctk_does(node_root: Any) -> None:
    layout, ctk = node_root
    theirs = toolkit_spec(ctk, layout.root)
    ours = vgpud_edits(layout.root)
    common, ours_common = theirs["containerEdits"], ours["containerEdits"]

    assert sorted(ours_common["env"]) == sorted(common["env"])
    assert ours_common["deviceNodes"] == common["deviceNodes"]
    assert mounts(ours_common) == mounts(common)
    assert hooks(ours_common) == hooks(common)
    assert not ours_common.get("additionalGids") and not common.get("additionalGids")
    # what vgpud leaves out is only what it argues for, and the toolkit does emit it here
    left_out = {h["args"][1] for h in common.get("hooks", ()) if h["args"][1] in NOT_EMITTED_HOOKS}
    assert left_out == {"update-application-profile"}

    by_uuid = {d["name"]: d["containerEdits"] for d in theirs["devices"]}
    assert sorted(by_uuid) == sorted(d["uuid"] for d in ours["devices"])
    for device in ours["devices"]:
        their_device = by_uuid[device["uuid"]]
        assert device["containerEdits"]["deviceNodes"] == their_device["deviceNodes"], device["uuid"]
        assert {h["args"][1] for h in their_device.get("hooks", ())} <= NOT_EMITTED_HOOKS
        assert "hooks" not in device["containerEdits"] and "mounts" not in device["containerEdits"]
    # each GPU's node is its own: 195:<its minor>
    for device in ours["devices"]:
        (node,) = device["containerEdits"]["deviceNodes"]
        assert (node["path"], node["major"], node.get("minor", 0)) == (
            f"/dev/nvidia{device['minor']}",
            195,
            device["minor"],
        )


def test_without_the_hook_the_links_become_mounts_of_their_files(node_root: Any) -> None:
    layout, ctk = node_root
    theirs = toolkit_spec(ctk, layout.root, "--disable-hook=all")
    ours = vgpud_edits(layout.root, "--nvidia-cdi-hook-path", "off")
    assert "hooks" not in theirs["containerEdits"] and "hooks" not in ours["containerEdits"]
    extra = mounts(ours["containerEdits"]) - mounts(theirs["containerEdits"])
    assert mounts(theirs["containerEdits"]) <= mounts(ours["containerEdits"])
    # exactly the links the toolkit's create-symlinks makes, each a mount of the file it leads to
    with_hook = toolkit_spec(ctk, layout.root)["containerEdits"]["hooks"]
    (symlinks,) = [h for h in with_hook if h["args"][1] == "create-symlinks"]
    links = {arg.split("::")[1] for arg in symlinks["args"][2:] if "::" in arg}
    assert {container for _, container, _ in extra} == links
    lib = layout.root / "usr/lib/x86_64-linux-gnu"
    for host, container, options in extra:
        assert Path(host).resolve() == (layout.root / container.lstrip("/")).resolve(), container
        assert Path(host).parent == lib and "ro" in options

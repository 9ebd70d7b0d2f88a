"""vgpud's NRI plugin against containerd's own runtime side of NRI, at the newest NRI and at v0.6.1.

The Go harness in tests/conformance/nri/ (README.md there) embeds github.com/containerd/nri/pkg/adaptation,
the code containerd runs, and drives a plugin process through registration, Configure, a Synchronize
over 4 MiB, CreateContainer injection, RemoveContainer / pod sandbox cleanup, an error that fails
creation, a plugin slower than the request timeout (dropped, reconnects), replies over 4096 bytes,
the plugin's own UpdateContainers of device rules (what the runtime's updateFn gets, its errors back)
and the plugin's map of every container through PostStartContainer / StopContainer / RemoveContainer.

Each NRI version runs twice: against vgpud's plugin (plugin_under_test.py) and against the Go stand-in
built on NRI's own stub (goplugin/), which shows that the harness and the runtime behave as the tests
say; a failure only in the vgpud run is vgpud's. The harness is built (and cached) by this module;
Go modules come through the Go module proxy on a cold cache. `pytest -s` streams the output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conformance.nri import gobuild
from tests.support import require

#: per harness run; a cold build is separate (see `built`)
RUN_TIMEOUT = 600


@pytest.fixture(scope="module")
def go() -> None:
    require(
        gobuild.go_usable(),
        f"Go >= {'.'.join(map(str, gobuild.MIN_GO))} on PATH",
        "install Go (https://go.dev/dl/); the NRI harness is built with it, modules come from the Go "
        "module proxy",
    )


@pytest.fixture(scope="module")
def goplugin(go: None) -> Path:
    return gobuild.build("goplugin", "v0.12", log=sys.stderr)


@pytest.mark.parametrize("plugin", ["vgpud", "go-stub"])
@pytest.mark.parametrize("variant", list(gobuild.VARIANTS))
def test_nri_runtime_conformance(variant: str, plugin: str, go: None, goplugin: Path) -> None:
    harness = gobuild.build("harness", variant, log=sys.stderr)
    if plugin == "vgpud":
        require(
            gobuild.PLUGIN_UNDER_TEST.exists(),
            str(gobuild.PLUGIN_UNDER_TEST.relative_to(gobuild.REPO)),
            "it is part of the repository: restore it",
        )
        cmd = gobuild.plugin_under_test_cmd()
    else:
        cmd = [str(goplugin)]
    result = gobuild.run(
        harness,
        ["-test.v", "-test.timeout", f"{RUN_TIMEOUT - 30}s"],
        plugin_cmd=cmd,
        timeout=RUN_TIMEOUT,
        echo_stdout=sys.stdout,
        echo_stderr=sys.stdout,
    )
    if result.returncode != 0:
        summary = "\n".join(result.verdict_lines())
        who = "vgpud's NRI plugin" if plugin == "vgpud" else "the Go stub plugin (is the harness wrong?)"
        timed_out = " (timed out)" if result.timed_out else ""
        failed = ", ".join(result.failed_tests()) or "-"
        pytest.fail(
            f"NRI {variant} conformance of {who}: exit {result.returncode}{timed_out}, failed: {failed}\n"
            f"{summary}\n(the runtime's [nri] and the plugin's [plugin] lines are in the captured output)",
            pytrace=False,
        )

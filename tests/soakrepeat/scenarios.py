"""The named chaos scenarios of the e2e: kills, stops and restarts of vgpud, the kubelet, containerd, a
container and another NRI plugin, each on the tracks its test runs on, each one pytest node ID.

One place for the list: the runner repeats these, and tests/soakrepeat/test_scenarios.py collects the
e2e suite and fails when an ID here no longer names a test (a rename cannot leave the list stale).
Within each group the cheaper tracks (containerd 1.7) come first; the chart track is last.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """A chaos scenario: its name in the table and the one test (node ID, track included) that runs it."""

    name: str
    test: str


def _on(name: str, test: str, tracks: tuple[str, ...]) -> tuple[Scenario, ...]:
    """The scenario on each track: `{track}` in `test` is the node fixture's parameter."""
    return tuple(Scenario(f"{name} [{track}]", test.format(track=track)) for track in tracks)


E2E = "tests/e2e"
DEFAULT = ("nri", "eager")
BOTH_RUNTIMES = ("nri", "eager", "nri-cd2", "eager-cd2")
NRI_BOTH_RUNTIMES = ("nri", "nri-cd2")

SCENARIOS: tuple[Scenario, ...] = (
    # vgpud killed, stopped or restarted
    *_on(
        "vgpud SIGKILL before Prepare: Prepare retried",
        f"{E2E}/test_node_partitions.py::test_kill_vgpud_during_prepare[{{track}}]",
        DEFAULT,
    ),
    *_on(
        "vgpud SIGKILL mid-Prepare",
        f"{E2E}/test_node_partitions.py::test_kill_vgpud_racing_prepare[{{track}}]",
        DEFAULT,
    ),
    *_on(
        "vgpud SIGKILL while ten pods start",
        f"{E2E}/test_node_containers.py::test_vgpud_killed_while_ten_pods_start[{{track}}]",
        ("nri",),
    ),
    *_on(
        "vgpud SIGSTOP past the NRI deadline: plugin dropped mid-CreateContainer",
        f"{E2E}/test_node_containers.py::"
        "test_vgpud_stopped_past_the_deadline_leaves_a_reported_container[{track}]",
        NRI_BOTH_RUNTIMES,
    ),
    *_on(
        "vgpud SIGTERM restart while pods run",
        f"{E2E}/test_node_restarts.py::test_restart_vgpud_while_pods_run[{{track}}]",
        BOTH_RUNTIMES,
    ),
    *_on(
        "vgpud restart: no plugin error in containerd's log",
        f"{E2E}/test_node_containers.py::test_vgpud_start_leaves_no_plugin_error_in_containerd_log[{{track}}]",
        NRI_BOTH_RUNTIMES,
    ),
    *_on(
        "vgpud restart into the other mode",
        f"{E2E}/test_node_admission.py::test_a_restart_into_the_other_mode_is_reported[{{track}}]",
        DEFAULT,
    ),
    # containerd
    *_on(
        "containerd restart",
        f"{E2E}/test_node_restarts.py::test_restart_containerd[{{track}}]",
        BOTH_RUNTIMES,
    ),
    # the kubelet
    *_on(
        "kubelet restart with running pods",
        f"{E2E}/test_node_kubelet_restart.py::test_kubelet_restart_while_pods_run[{{track}}]",
        BOTH_RUNTIMES,
    ),
    *_on(
        "kubelet SIGKILL once the claim is prepared",
        f"{E2E}/test_node_kubelet_restart.py::test_kubelet_killed_while_pod_is_created[{{track}}-prepared]",
        DEFAULT,
    ),
    *_on(
        "kubelet SIGKILL with the sandbox up",
        f"{E2E}/test_node_kubelet_restart.py::test_kubelet_killed_while_pod_is_created[{{track}}-sandbox]",
        DEFAULT,
    ),
    # containers
    *_on(
        "container SIGKILL: restarted by the kubelet",
        f"{E2E}/test_node_containers.py::"
        "test_a_restarted_container_starts_without_the_earlier_ledger_and_bucket[{track}]",
        ("nri",),
    ),
    *_on(
        "sidecar SIGKILL twice",
        f"{E2E}/test_node_init_sidecar.py::test_a_restarted_sidecar_keeps_its_directory[{{track}}]",
        DEFAULT,
    ),
    # another NRI plugin beside vgpud
    *_on(
        "ulimit-adjuster restart beside vgpud",
        f"{E2E}/test_node_coexistence.py::"
        "test_three_plugins_adjust_in_index_order_and_a_sample_restart_leaves_vgpud_undisturbed[{track}]",
        NRI_BOTH_RUNTIMES,
    ),
    *_on(
        "vgpud restart beside ulimit-adjuster",
        f"{E2E}/test_node_coexistence.py::test_vgpud_restart_leaves_the_sample_connected[{{track}}]",
        NRI_BOTH_RUNTIMES,
    ),
    # the chart: the DaemonSet's pod replaced
    *_on(
        "vgpud DaemonSet upgraded while a vGPU pod runs",
        f"{E2E}/test_chart_track.py::test_upgrade_to_a_new_tag_while_a_vgpu_pod_runs[{{track}}]",
        ("chart",),
    ),
)


def select(patterns: list[str]) -> tuple[Scenario, ...]:
    """The scenarios whose name contains any of `patterns` (all when none), in list order; a pattern
    that matches no name is an error (ValueError), so a typo cannot run nothing and pass."""
    unmatched = [p for p in patterns if not any(p in s.name for s in SCENARIOS)]
    if unmatched:
        raise ValueError(f"no scenario name contains {', '.join(map(repr, unmatched))}")
    return tuple(s for s in SCENARIOS if not patterns or any(p in s.name for p in patterns))

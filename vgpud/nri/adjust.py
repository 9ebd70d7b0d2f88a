"""What vgpud gives a vGPU container at creation: the NRI adjustment and its directories."""

from __future__ import annotations

from pathlib import Path

import trio

from vgpud._pb.nri.pkg.api.v1alpha1 import ContainerAdjustment, KeyValue, Mount
from vgpud.partition.assigner import InjectionPlan
from vgpud.partition.layout import Mount as LayoutMount
from vgpud.partition.libstate import clear_library_state
from vgpud.partition.pidsfile import LOCK_BUDGET, PidsFileLockTimeout, reset_pids_file


def _nri_mount(mount: LayoutMount) -> Mount:
    return Mount(
        destination=mount.container_path, type="bind", source=mount.host_path, options=list(mount.options)
    )


def adjustment(plan: InjectionPlan) -> ContainerAdjustment:
    """The NRI adjustment of an injection plan: its bind mounts and env."""
    return ContainerAdjustment(
        mounts=[_nri_mount(m) for m in plan.mounts],
        env=[KeyValue(key=key, value=value) for key, value in plan.env.items()],
    )


def make_directories(plan: InjectionPlan, *, lock_budget: float = LOCK_BUDGET) -> None:
    """Blocking: the container's directories, no ledger or shared bucket of an earlier instance of
    the container (its processes are gone; sm_node.lock stays), and an empty pids.config (in place,
    never replaced). Idempotent. `lock_budget` 0: one try for the pids.config lock, and
    `PidsFileLockTimeout` when another holder has it (nothing sleeps)."""
    for directory in plan.paths.directories:
        Path(directory).mkdir(parents=True, exist_ok=True, mode=0o755)
    clear_library_state(plan.paths)
    reset_pids_file(Path(plan.paths.config), lock_budget=lock_budget)


async def make_directories_soon(plan: InjectionPlan) -> None:
    """`make_directories` for the runtime's synchronous path: a few metadata syscalls on the node's
    disk, done on the Trio thread because handing them to a worker thread and back costs more than
    they do (CreateContainer spent about as long in the hop as in mkdir). Only a wait for the
    pids.config lock, which a reader or the registry may hold, goes to a worker thread."""
    try:
        make_directories(plan, lock_budget=0)
    except PidsFileLockTimeout:
        await trio.to_thread.run_sync(make_directories, plan)

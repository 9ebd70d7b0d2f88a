"""Did the runtime give a container what vgpud intended? (pure)

A runtime that drops the plugin (a missed deadline) or runs without it (vgpud down) creates the
container without the adjustment, and CreateContainer's reply is no proof of the opposite: only the
container the runtime reports back (Synchronize: its mounts and env) is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vgpud.nri.envs import env_value
from vgpud.partition.assigner import InjectionPlan


def missing_injection(
    plan: InjectionPlan, mounts: Iterable[tuple[str, str]], env: Sequence[str]
) -> tuple[str, ...]:
    """What of `plan` the container lacks: `mount <destination>` for a bind mount that is absent or
    has another source, `env <KEY>` for an identity variable with another value; () when complete.
    `mounts`: the container's (destination, source) pairs."""
    have = set(mounts)
    gaps = [f"mount {m.container_path}" for m in plan.mounts if (m.container_path, m.host_path) not in have]
    gaps += [f"env {key}" for key, value in plan.env.items() if env_value(env, key) != value]
    return tuple(gaps)

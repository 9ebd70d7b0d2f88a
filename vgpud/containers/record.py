"""One container instance of the node, as the runtime last reported it and as vgpud treated it.

Keyed by container ID: a restarted container is a new instance (a new ID) of the same (pod UID,
container name). Immutable NamedTuples: a Synchronize builds one per container of the node, thousands.
"""

from __future__ import annotations

from enum import Enum
from pathlib import PurePosixPath
from typing import NamedTuple

from vgpud.containers.linux import NO_LINUX, ContainerLinux
from vgpud.containers.values import ContainerKey, DeviceRule


class Injection(Enum):
    """What vgpud did for the container at creation (or found at the last Synchronize)."""

    #: no vGPU claim UID in its env: not a vGPU container
    NO_CLAIM = "no-claim"
    #: a claim UID in its env, nothing injected: not valid here (not prepared, not reserved for the
    #: pod, prepared in eager mode) or its creation is still being decided
    REFUSED = "refused"
    #: vgpud gave it its directory, mounts and identity env
    INJECTED = "injected"
    #: valid here, but it runs without (all of) the injection: created while vgpud was away, or
    #: after the runtime dropped the plugin for a missed deadline (`NodeContainer.missing` says what)
    MISSING = "missing"


#: the states of a container that carries a vGPU claim UID (what the runtime runs with one)
CLAIMED = frozenset({Injection.REFUSED, Injection.INJECTED, Injection.MISSING})


class NodeContainer(NamedTuple):
    """One container instance (the fields after `linux` apply to vGPU containers only)."""

    container_id: str
    pod_uid: str
    #: the container's name in its pod
    name: str
    pod_namespace: str
    pod_name: str
    #: it has a live process (started, not stopped; a paused one counts)
    running: bool = False
    #: its process ID in the runtime's PID namespace (0 while none runs, or when the runtime did not say)
    pid: int = 0
    #: its cgroups path and device rules, as the runtime created it (`cgroups_path`, `device_rules`)
    linux: ContainerLinux = NO_LINUX
    #: the vGPU claim UID of its env ("" when none)
    claim_uid: str = ""
    injection: Injection = Injection.NO_CLAIM
    #: its directory (`claims/<claim>/<pod>_<ctr>`, shared by its instances): INJECTED and MISSING only
    directory: PurePosixPath | None = None
    #: MISSING: what of the intended injection the runtime's container lacks ("mount <dest>", "env <KEY>")
    missing: tuple[str, ...] = ()

    @property
    def key(self) -> ContainerKey:
        return self.pod_uid, self.name

    @property
    def cgroups_path(self) -> str:
        """NRI Container.linux.cgroups_path, as given ("" when the runtime gave none)."""
        return self.linux.facts()[0]

    @property
    def device_rules(self) -> tuple[DeviceRule, ...]:
        """NRI Container.linux.resources.devices: the container's own rules, as the runtime created it."""
        return self.linux.facts()[1]

    @property
    def vgpu(self) -> bool:
        """A vGPU container of this node (vgpud made its directory): only there does a control library
        enforce limits."""
        return self.injection is Injection.INJECTED

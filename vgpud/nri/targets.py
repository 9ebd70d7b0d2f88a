"""Every container the runtime reported through NRI, vGPU or not: what a hot-plug needs of its target.

The hot-plug (issue 18) grants a slave pod's vGPU to any running container of the node, so this map
holds them all, keyed by container ID and indexed by (pod UID, container name) like the NRI cache:
its process (pid, for the mount namespace), its cgroup (`cgroups_path`, as the runtime gives it) and
its own device cgroup rules (what the runtime created it with: the rules a grant adds to, and a revoke
goes back to). A Synchronize replaces everything; the lifecycle hooks keep it current in between
(`vgpud.nri.hooks`). Immutable values, NamedTuples: a Synchronize builds thousands.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from vgpud.hotplug.devrules import DeviceRule
from vgpud.hotplug.rules import KnownContainer
from vgpud.nri.cache import ContainerMap


class TargetContainer(NamedTuple):
    """One container instance as the runtime last reported it."""

    container_id: str
    pod_uid: str
    #: the container's name in its pod
    container: str
    pod_namespace: str
    pod_name: str
    #: it has a live process (started, not stopped; a paused one counts)
    running: bool
    #: its process ID in the runtime's PID namespace (0 while none runs, or when the runtime did not say)
    pid: int
    #: NRI Container.linux.cgroups_path, as given ("" when the runtime gave none)
    cgroups_path: str
    #: NRI Container.linux.resources.devices: the container's own rules, as the runtime created it
    device_rules: tuple[DeviceRule, ...]

    def known(self) -> KnownContainer:
        return KnownContainer(
            self.container_id, self.pod_uid, self.container, self.pod_namespace, self.pod_name, self.running
        )


class TargetContainers(ContainerMap[TargetContainer]):
    """Every container instance the runtime runs or keeps; a `vgpud.hotplug.service.TargetLookup`."""

    def __init__(self) -> None:
        super().__init__()
        #: true once the first complete Synchronize arrived, and from then on (as `NriCache.synced`)
        self.synced = False

    def replace(self, entries: Iterable[tuple[str, TargetContainer]]) -> None:
        """A Synchronize's view replaces everything; the map is synced from now on."""
        super().replace(entries)
        self.synced = True

    def container(self, pod_uid: str, name: str) -> KnownContainer | None:
        """The newest instance of (pod UID, container name), None when the runtime reported none."""
        target = self.get(pod_uid, name)
        return target.known() if target is not None else None

    def by_id(self, container_id: str) -> TargetContainer | None:
        return self.instance(container_id)

    def running_ids(self) -> list[str]:
        """The IDs of the instances with a live process, in no particular order."""
        return [cid for cid, target in self._entries.items() if target.running]

"""`ConfigLimits`: the slave claim's device limits in the target's vgpu.config (the `vgpu.config` step).

The target is a vGPU container: vgpud made its directory at CreateContainer and its library reads
`config/vgpu.config` at each process start, adopting the entries vgpud marks `hotplug` for devices its
env does not name (csrc/libvgpu/src/vgpu_config_file.c). The slave's limits come from the CDI spec
vgpud wrote for the slave claim at Prepare (the library's own env names and parsing,
`vgpuconfig.slave_limits`). Processes started after Attach enforce them; processes already running
keep what they read at their start (docs/hotplug.md). A detach removes the entries by the GPUs' UUIDs,
known from the inventory, so it works after the slave claim's spec is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path, PurePosixPath

import trio

from vgpud.hotplug.access import STEP_LIMITS, Target, attachment_minors
from vgpud.hotplug.configfile import ConfigState, change_target_config, read_claim_spec
from vgpud.hotplug.rules import Attachment
from vgpud.hotplug.service import ApplyError
from vgpud.hotplug.vgpuconfig import ConfigError, extend_config, shrink_config, slave_limits
from vgpud.partition.layout import CONFIG_DIR

CONFIG_FILE = "vgpu.config"


class ConfigLimits:
    def __init__(
        self,
        *,
        directory: Callable[[str], PurePosixPath | None],
        cdi_root: Path,
        driver: str,
        uuid_of_minor: Mapping[int, str],
    ) -> None:
        """`directory(container_id)`: the vGPU container's directory (None: not a vGPU container)."""
        self.directory = directory
        self.cdi_root = cdi_root
        self.driver = driver
        self.uuid_of_minor = uuid_of_minor

    def _path(self, attachment: Attachment) -> Path:
        directory = self.directory(attachment.container_id)
        if directory is None:
            raise ApplyError(
                STEP_LIMITS,
                f"container instance {attachment.container_id} is not a vGPU container of this node",
            )
        return Path(directory) / CONFIG_DIR / CONFIG_FILE

    def _read_specs(self, attachment: Attachment) -> list[dict]:
        return [read_claim_spec(self.cdi_root, self.driver, claim.uid) for claim in attachment.claims]

    async def extend(self, attachment: Attachment, target: Target) -> None:
        path = self._path(attachment)
        try:
            specs = await trio.to_thread.run_sync(self._read_specs, attachment)
            added = slave_limits(specs)
            outcome = await change_target_config(path, partial(extend_config, added=added), create=True)
        except ConfigError as err:
            raise ApplyError(STEP_LIMITS, str(err)) from None
        if outcome.state is ConfigState.NO_CONFIG:
            raise ApplyError(STEP_LIMITS, outcome.detail)

    async def shrink(self, attachment: Attachment, target: Target) -> None:
        path = self._path(attachment)
        uuids = [self.uuid_of_minor[m] for m in attachment_minors(attachment) if m in self.uuid_of_minor]
        try:
            await change_target_config(path, partial(shrink_config, uuids=uuids))
        except ConfigError as err:
            raise ApplyError(STEP_LIMITS, str(err)) from None

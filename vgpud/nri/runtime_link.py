"""The plugin's own calls to the runtime: an unsolicited NRI UpdateContainers of a container's device
cgroup rules (issue 18's hot-plug).

One `RuntimeLink` lives as long as vgpud; the NRI session (`vgpud.nri.conn.NriSession`) attaches
itself once its Synchronize is complete and detaches when it ends, so a call while the plugin is
away fails at once instead of waiting for a reconnect. Calls run in the caller's task and never
inside an NRI hook: the runtime holds its NRI lock while a hook runs and would wait on itself until
the request timeout (docs/decisions.md, issue 18). A failed call is the caller's error
(`RuntimeUpdateError`), never the session's.

What the runtime does with the rules is its business: containerd 1.7 and 2.x accept device rules in
an unsolicited update and drop them (docs/decisions.md, issue 18); `ignore_failure` stays false so
that whatever the runtime does report as failed reaches the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ContainerUpdate,
    LinuxContainerUpdate,
    LinuxDeviceCgroup,
    LinuxResources,
    OptionalInt64,
    UpdateContainersRequest,
    UpdateContainersResponse,
)
from vgpud.containers.values import DeviceRule
from vgpud.wire import MalformedMessage, parse_strict

DEVICE_TYPES = frozenset("abc")
ACCESS_LETTERS = frozenset("rwm")


class CallFailed(Exception):
    """A call to the runtime got an error status (the message says the runtime's text), no answer in
    time, or lost its connection."""


class RuntimeCaller(Protocol):
    async def call_runtime(self, method: str, payload: bytes, seconds: float) -> bytes:
        """The reply payload of one Runtime call; CallFailed when there is none."""
        ...


class RuntimeUpdateError(Exception):
    """An UpdateContainers that did not succeed: not connected, refused, timed out, or reported failed."""


class RuntimeLink:
    def __init__(self) -> None:
        self._caller: RuntimeCaller | None = None

    @property
    def connected(self) -> bool:
        return self._caller is not None

    def attach(self, caller: RuntimeCaller) -> None:
        """A synchronized session carries the calls from now on."""
        self._caller = caller

    def detach(self, caller: RuntimeCaller) -> None:
        """That session ended (a later one may have attached already: it stays)."""
        if self._caller is caller:
            self._caller = None

    async def update_devices(self, container_id: str, rules: Sequence[DeviceRule], timeout: float) -> None:  # noqa: ASYNC109
        """Ask the runtime to set the container's device cgroup rules to `rules`. ValueError for bad
        arguments (nothing sent); RuntimeUpdateError when the runtime does not confirm it."""
        request = update_request(container_id, rules, timeout)
        caller = self._caller
        if caller is None:
            raise RuntimeUpdateError(
                f"cannot update container {container_id}: vgpud's NRI plugin is not connected to the runtime"
            )
        try:
            payload = await caller.call_runtime("UpdateContainers", bytes(request), timeout)
        except CallFailed as err:
            raise RuntimeUpdateError(f"updating container {container_id}: {err}") from None
        try:
            response = parse_strict(payload, UpdateContainersResponse)
        except MalformedMessage as err:
            raise RuntimeUpdateError(f"updating container {container_id}: malformed reply: {err}") from None
        if response.failed:
            failed = ", ".join(update.container_id or "(no id)" for update in response.failed)
            raise RuntimeUpdateError(
                f"updating container {container_id}: the runtime reports {failed} failed"
            )


def update_request(container_id: str, rules: Sequence[DeviceRule], timeout: float) -> UpdateContainersRequest:
    """The UpdateContainers request of one container's device rules; ValueError when an argument is not
    one a runtime could apply."""
    if not container_id:
        raise ValueError("no container ID")
    if not timeout > 0:
        raise ValueError(f"the timeout must be a positive number of seconds, not {timeout}")
    if not rules:
        raise ValueError(f"no device rules for container {container_id}: such an update would change nothing")
    for rule in rules:
        _check(rule)
    devices = [
        LinuxDeviceCgroup(
            allow=rule.allow,
            type=rule.type,
            major=None if rule.major is None else OptionalInt64(value=rule.major),
            minor=None if rule.minor is None else OptionalInt64(value=rule.minor),
            access=rule.access,
        )
        for rule in rules
    ]
    update = ContainerUpdate(
        container_id=container_id,
        linux=LinuxContainerUpdate(resources=LinuxResources(devices=devices)),
        ignore_failure=False,
    )
    return UpdateContainersRequest(update=[update])


def _check(rule: DeviceRule) -> None:
    if rule.type not in DEVICE_TYPES or len(rule.type) != 1:
        raise ValueError(f"device rule {rule}: the type must be a, b or c")
    for name, number in (("major", rule.major), ("minor", rule.minor)):
        if number is not None and number < 0:
            raise ValueError(f"device rule {rule}: a negative {name}")
    if not rule.access or not set(rule.access) <= ACCESS_LETTERS or len(set(rule.access)) != len(rule.access):
        raise ValueError(f"device rule {rule}: the access must be some of r, w, m, each once")

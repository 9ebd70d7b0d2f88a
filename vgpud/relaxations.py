"""The webhook relaxations that are safe only on NRI nodes, and how a claim says it needs such a node.

Seed §5.4: with NRI every container gets its own directory, so two rules can be lifted there: a
container may use several vGPU claims, and a vGPU claim's requests may be used by several pods (each
request still by one). On an eager (DRA-only) node neither is safe. One fact ties the three places
that act on it: the node publishes `NRI_MODE_ATTRIBUTE` on each device of its ResourceSlice
(`vgpud.dra.slices`), a claim selects it (`nri_selector`, `nri_selector_optional` while some nodes
run a vgpud that does not publish it, or a DeviceClass built on either), the webhook admits a relaxed
shape only for claims that do, and an eager node's Prepare refuses such a use (counted under the
relaxation's name).
"""

from __future__ import annotations

from enum import StrEnum

#: bool attribute of each device in vgpud's ResourceSlice, in the driver's domain: true when the node
#: runs NRI (lazy) mode
NRI_MODE_ATTRIBUTE = "nriMode"


class Relaxation(StrEnum):
    """A rule the webhook lifts only for claims that select NRI nodes (each has its own switch)."""

    #: a container uses more than one vGPU claim
    MULTIPLE_CLAIMS_PER_CONTAINER = "multiple-vgpu-claims-per-container"
    #: a vGPU claim's requests are used by more than one pod (each request by one pod)
    CLAIM_ACROSS_PODS = "vgpu-claim-across-pods"


def nri_selector(driver: str) -> str:
    """The CEL selector that keeps a request on NRI nodes (the form the webhook documents)."""
    return f"device.attributes['{driver}'].{NRI_MODE_ATTRIBUTE} == true"


def nri_selector_optional(driver: str) -> str:
    """The same test in CEL's optional syntax, for a rolling upgrade from a vgpud that did not publish
    `NRI_MODE_ATTRIBUTE`: false on a device without the attribute, where `nri_selector` is a CEL
    runtime error ("no such key") that aborts the allocation."""
    return f"device.attributes['{driver}'].?{NRI_MODE_ATTRIBUTE}.orValue(false)"

"""The names one `vgpud run` gives things, each written once (the checkpoint's and the node lock's file
names belong to `vgpud.dra.checkpoint` and `vgpud.dra.nodelock`).

Component names are the supervisor's keys: the health service, the debug state, the logs and the
metrics' labels carry them, so changing one is a change of behaviour.
"""

from __future__ import annotations

from vgpud import __version__

#: the control library is installed as `libvgpu-control.so.<version>` so an upgrade never swaps a live file
LIBRARY_VERSION = __version__

# the supervised components, in the order they start
#: the writer of the Kubernetes Events (first: what the parts record while starting goes out at once)
EVENTS = "events"
DRA_PLUGIN = "dra-plugin"
RESOURCE_SLICES = "resource-slices"
DRA_CLEANUP = "dra-cleanup"
DEVICE_HEALTH = "device-health"
CLAIM_CACHE = "claim-cache"
POD_CACHE = "pod-cache"
NRI_PLUGIN = "nri-plugin"
REGISTRY = "registry"
HOTPLUG = "hotplug"
#: the gRPC health service on --healthcheck-port
HEALTH = "health"
METRICS = "metrics"
DEBUG_HTTP = "debug-http"
DRIFT = "drift"
USAGE = "usage"

#: the health entry (no component) that reports prepared claims served in another partition mode
CLAIM_MODES = "claim-modes"

"""The node's GPUs behind one interface: NVML (nvidia-ml-py) on GPU nodes, YAML profiles elsewhere."""

from .inventory import Backend, GpuInventory, open_inventory
from .model import GpuInfo, GpuInventoryError

__all__ = ["Backend", "GpuInfo", "GpuInventory", "GpuInventoryError", "open_inventory"]

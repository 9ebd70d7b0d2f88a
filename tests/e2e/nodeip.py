"""The local node's IP: an address of its own on the loopback device.

A real node has an IP that the API server and the kubelet reach, and that host-network pods (the vgpud
DaemonSet, the webhook in the chart track) take as their pod IP. The kubelet refuses 127.0.0.0/8 as a
node IP and an EndpointSlice refuses loopback and link-local addresses, so each node takes one
address from 198.18.0.0/15 (reserved for benchmarking, routed nowhere) and adds it to `lo`: reachable
from everything on this host, from nothing outside it, like 127.0.0.1. The address is written into the
node's work dir so that the node's stop, or the reaping of a dead node, takes it off again.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

#: the file in a node's work dir that names its address
NODE_IP_FILE = "node-ip"
#: where node addresses come from (RFC 2544's benchmarking range)
NODE_IP_RANGE = ipaddress.ip_network("198.18.0.0/16")
DEVICE = "lo"


def host_addresses() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def claim_node_ip(workdir: Path) -> str:
    """Add an unused address of NODE_IP_RANGE to `lo`, record it in `workdir`, return it."""
    taken = host_addresses()
    hosts = list(NODE_IP_RANGE.hosts())
    start = os.getpid() % len(hosts)  # spread concurrent nodes; the loop finds a free one anyway
    for offset in range(len(hosts)):
        address = str(hosts[(start + offset) % len(hosts)])
        if address in taken:
            continue
        added = subprocess.run(
            ["ip", "addr", "add", f"{address}/32", "dev", DEVICE], capture_output=True, text=True, check=False
        )
        if added.returncode == 0:
            (workdir / NODE_IP_FILE).write_text(address + "\n")
            return address
        if "File exists" not in added.stderr:
            raise RuntimeError(f"cannot add {address} to {DEVICE}: {added.stderr.strip()}")
    raise RuntimeError(f"no free address left in {NODE_IP_RANGE}")


def release_node_ip(workdir: Path) -> str | None:
    """Take the address recorded in `workdir` off `lo`; the address, or None when there was none."""
    try:
        address = (workdir / NODE_IP_FILE).read_text().strip()
        ipaddress.ip_address(address)
    except (OSError, ValueError):
        return None
    subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", DEVICE], capture_output=True, check=False)
    (workdir / NODE_IP_FILE).unlink(missing_ok=True)
    return address

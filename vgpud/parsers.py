"""Value parsers for settings: each takes the raw string of a flag or environment variable and returns
the value, or raises ValueError with a reason (the option machinery adds which setting it was).

Pure functions, shared by `vgpud run` (vgpud.config) and `vgpud webhook` (vgpud.webhook.config), so a
path, a port or a boolean means the same in both.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable
from pathlib import Path

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
#: '', -1 or off: an address or socket that is not served
OFF_WORDS = frozenset({"", "-1", "off"})
#: `--debug-socket off`: no debug unix socket
SOCKET_OFF = "off"

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NRI_IDX = re.compile(r"[0-9]{2}")


def absolute_path(raw: str) -> Path:
    if not raw.startswith("/"):
        raise ValueError(f"{raw!r} is not an absolute path")
    return Path(os.path.normpath(raw))


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A decimal integer in low..high."""

    def parse(raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError(f"{raw!r} is not an integer") from None
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}..{high}")
        return value

    return parse


def number_in(low: float, high: float) -> Callable[[str], float]:
    """A decimal number, a fraction allowed (seconds: 2.5), in low..high; nan and infinity are refused,
    as neither is a duration."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{raw!r} is not a number")
        if not low <= value <= high:
            raise ValueError(f"{value:g} is outside {low:g}..{high:g}")
        return value

    return parse


def choice(*choices: str) -> Callable[[str], str]:
    """One of `choices`, case-insensitive."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(choices)}")
        return value

    return parse


def boolean(raw: str) -> bool:
    """true/1/yes/on or false/0/no/off, case-insensitive."""
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{raw!r} is not true or false")


def dns_subdomain(raw: str) -> str:
    if len(raw) > 253 or not _DNS_SUBDOMAIN.fullmatch(raw):
        raise ValueError(f"{raw!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')")
    return raw


def dns_subdomain_list(raw: str) -> tuple[str, ...]:
    """A comma-separated list of DNS subdomains, possibly empty, duplicates dropped, order kept."""
    names = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    for name in names:
        dns_subdomain(name)
    return names


def dns_subdomains(raw: str) -> tuple[str, ...]:
    """A non-empty `dns_subdomain_list`."""
    names = dns_subdomain_list(raw)
    if not names:
        raise ValueError("the list is empty")
    return names


def hosts(raw: str) -> tuple[str, ...]:
    """A comma-separated list of IP addresses and DNS names, possibly empty."""
    found = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    for host in found:
        try:
            ip_address(host)
        except ValueError:
            dns_subdomain(host.lower())
    return found


def nri_idx(raw: str) -> str:
    if not _NRI_IDX.fullmatch(raw):
        raise ValueError(f"{raw!r} is not exactly two digits (the NRI plugin index, e.g. 00)")
    return raw


def ip_address(raw: str) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an IP address") from None
    return raw


def parse_host_port(raw: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` with an IP address as the host -> (host, port)."""
    host, sep, port = raw.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not (port.isascii() and port.isdigit()) or not host:
        raise ValueError(f"{raw!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"{raw!r}: port {port} is outside 0..65535")
    return ip_address(host), int(port)


def listen_address(raw: str) -> tuple[str, int] | None:
    """HOST:PORT, or '', -1, off: not served."""
    return None if raw.strip().lower() in OFF_WORDS else parse_host_port(raw)


def loopback_address(raw: str) -> tuple[str, int] | None:
    """As `listen_address`, and only a loopback IP: the debug routes have no authentication."""
    address = listen_address(raw)
    if address is not None and not ipaddress.ip_address(address[0]).is_loopback:
        raise ValueError(f"{raw!r}: the debug address must be a loopback address (127.0.0.1, ::1)")
    return address


def socket_path_or_off(raw: str) -> Path | str:
    """An absolute path, or SOCKET_OFF for '', -1, off."""
    return SOCKET_OFF if raw.strip().lower() in OFF_WORDS else absolute_path(raw)

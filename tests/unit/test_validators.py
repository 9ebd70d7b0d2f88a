"""Every validator whose value becomes a path, a name or an identity matches the whole value: a
trailing newline, a NUL, a '/', '..', a Unicode look-alike or an over-long value is refused, however
the rest of the value looks (issue 21: `re.match` with `^...$` matched before a final newline)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vgpud.containers.values import is_pod_uid
from vgpud.dra.cdi import cdi_vendor
from vgpud.dra.claimedits import device_minor
from vgpud.gpu.healthrules import parse_xid_list
from vgpud.parsers import dns_subdomain, nri_idx, parse_host_port
from vgpud.partition.assigner import is_register_uuid
from vgpud.partition.layout import check_dns_label, check_partition_key, check_token
from vgpud.registry.cgroup import container_id_of_status, membership_of_path

UID = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
CONTAINER_ID = "0123456789abcdef" * 4
#: a character that looks like an ASCII one, for each that the valid values contain
LOOK_ALIKES = {
    **dict(zip("aceop", "\u0430\u0441\u0435\u043e\u0440", strict=True)),  # Cyrillic
    **{str(d): chr(0x0660 + d) for d in range(10)},  # Arabic-Indic digits: str.isdigit() says yes
    "-": "\u2010",  # hyphen
    ".": "\u2024",  # one dot leader
}


def _accepts(check: Callable[[str], object]) -> Callable[[str], bool]:
    """A validator that raises ValueError (LayoutError is one) as a yes/no."""

    def accepts(value: str) -> bool:
        try:
            check(value)
        except ValueError:
            return False
        return True

    return accepts


def _container_of(value: str) -> str | None:
    membership = membership_of_path(f"/kubepods/burstable/pod{UID}/{value}")
    return membership.container_id if membership else None


#: path parsers read one component of a cgroup path: a '/' only starts the next one
PATH_VARIANTS = frozenset({"leading /", "trailing /", "/.. appended"})
#: settings read from flags and the environment: surrounding white space is dropped on purpose
STRIPPED = frozenset({"trailing newline", "trailing CR LF"})

#: name -> (accepts(value), a value it accepts, variants that do not apply)
VALIDATORS: dict[str, tuple[Callable[[str], bool], str, frozenset[str]]] = {
    "check_token": (_accepts(lambda v: check_token(v, "UID")), UID, frozenset()),
    "check_dns_label": (_accepts(lambda v: check_dns_label(v, "container name")), "app-0", frozenset()),
    "check_partition_key": (_accepts(check_partition_key), "pod-0a1b-app/main", frozenset()),
    "is_pod_uid": (is_pod_uid, UID, frozenset()),
    "is_register_uuid": (is_register_uuid, UID, frozenset()),
    "cgroup container": (
        lambda v: _container_of(v) is not None,
        f"cri-containerd-{CONTAINER_ID}.scope",
        PATH_VARIANTS,
    ),
    "cgroup pod": (lambda v: membership_of_path(f"/kubepods/{v}") is not None, f"pod{UID}", PATH_VARIANTS),
    "container_id_of_status": (
        lambda v: container_id_of_status(v) is not None,
        f"containerd://{CONTAINER_ID}",
        frozenset(),
    ),
    "dns_subdomain": (_accepts(dns_subdomain), "vgpud.kube-system.svc", frozenset()),
    "nri_idx": (_accepts(nri_idx), "10", frozenset()),
    "parse_host_port": (_accepts(parse_host_port), "127.0.0.1:8080", STRIPPED),
    "cdi_vendor": (_accepts(cdi_vendor), "manager.nvidia.com", frozenset()),
    "device_minor": (lambda v: device_minor(v) is not None, "vgpu-10", frozenset()),
    "parse_xid_list": (_accepts(parse_xid_list), "13,31", STRIPPED),
}


def _look_alike(value: str) -> str:
    index = next(i for i, ch in enumerate(value) if ch in LOOK_ALIKES)
    return value[:index] + LOOK_ALIKES[value[index]] + value[index + 1 :]


VARIANTS: dict[str, Callable[[str], str]] = {
    "trailing newline": lambda v: v + "\n",
    "trailing CR LF": lambda v: v + "\r\n",
    "NUL inside": lambda v: v[:2] + "\x00" + v[2:],
    "trailing NUL": lambda v: v + "\x00",
    "leading /": lambda v: "/" + v,
    "trailing /": lambda v: v + "/",
    "..": lambda v: "..",
    "/.. appended": lambda v: v + "/..",
    "unicode look-alike": _look_alike,
    "over-long": lambda v: v + "a" * 300,
    "over-long digits": lambda v: v + "1" * 5000,
    "empty": lambda v: "",
}


@pytest.mark.parametrize("name", VALIDATORS)
def test_the_valid_value_is_accepted(name: str) -> None:
    accepts, valid, _ = VALIDATORS[name]
    assert accepts(valid)


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        (name, variant)
        for name, (_, _, skip) in VALIDATORS.items()
        for variant in VARIANTS
        if variant not in skip
    ],
)
def test_a_changed_value_is_refused(name: str, variant: str) -> None:
    accepts, valid, _ = VALIDATORS[name]
    value = VARIANTS[variant](valid)
    assert not accepts(value), f"{name} accepted {value[:80]!r}"


def test_a_token_of_the_longest_length_is_accepted_and_one_more_is_not() -> None:
    assert check_token("a" * 128, "key") == "a" * 128
    assert not _accepts(lambda v: check_token(v, "key"))("a" * 129)

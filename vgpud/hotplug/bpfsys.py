"""The bpf(2) calls a cgroup device program needs, through ctypes (no library beyond libc).

One job: load a BPF_PROG_TYPE_CGROUP_DEVICE program, list the device programs on a cgroup,
open one by id, attach one to a cgroup (BPF_F_ALLOW_MULTI, as runc attaches them) and detach
one. Each function returns plain ints (fds the caller closes, ids); a failed call raises OSError
with the errno and the call's name. Structures are the `union bpf_attr` members of
include/uapi/linux/bpf.h; the kernel takes a shorter attr than its own and zero-fills the rest.
"""

from __future__ import annotations

import ctypes
import errno
import os

#: bpf(2) commands
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_PROG_QUERY = 16
#: enum bpf_prog_type
BPF_PROG_TYPE_CGROUP_DEVICE = 15
#: enum bpf_attach_type
BPF_CGROUP_DEVICE = 6
#: attach flag: several programs on one cgroup, all run, all must allow
BPF_F_ALLOW_MULTI = 2
#: the kernel's limit of programs per cgroup and attach type (BPF_CGROUP_MAX_PROGS)
MAX_PROGS = 64
#: the name the loaded programs carry (bpftool prog shows it)
PROG_NAME = b"vgpud_devices"

_SYSCALL_NUMBERS = {"x86_64": 321, "aarch64": 280}
_VERIFIER_LOG_SIZE = 1 << 16
_libc = ctypes.CDLL(None, use_errno=True)


class _ProgLoad(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
    ]


class _Attach(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
    ]


class _GetFdById(ctypes.Structure):
    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _Query(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("query_flags", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("prog_ids", ctypes.c_uint64),
        ("prog_cnt", ctypes.c_uint32),
    ]


def _bpf(command: int, attr: ctypes.Structure, call: str) -> int:
    number = _SYSCALL_NUMBERS.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"bpf {call}: no bpf(2) syscall number known for {os.uname().machine}")
    result = _libc.syscall(
        ctypes.c_long(number), ctypes.c_int(command), ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"bpf {call}: {os.strerror(code)}")
    return int(result)


def prog_load(instructions: bytes, license_name: str) -> int:
    """Load a cgroup device program; its fd. A refused program's error carries the verifier's log."""
    if not instructions or len(instructions) % 8:
        raise ValueError(f"instructions must be a non-empty multiple of 8 bytes, not {len(instructions)}")
    insns = ctypes.create_string_buffer(instructions, len(instructions))
    license_buf = ctypes.create_string_buffer(license_name.encode())
    attr = _ProgLoad(
        prog_type=BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=len(instructions) // 8,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license_buf),
        prog_name=PROG_NAME,
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr, "PROG_LOAD")
    except OSError as first:
        if first.errno not in (errno.EACCES, errno.EINVAL):  # the verifier's refusals
            raise
        log = ctypes.create_string_buffer(_VERIFIER_LOG_SIZE)
        attr.log_level, attr.log_size, attr.log_buf = 1, _VERIFIER_LOG_SIZE, ctypes.addressof(log)
        try:
            return _bpf(BPF_PROG_LOAD, attr, "PROG_LOAD")
        except OSError as again:
            text = log.value.decode(errors="replace").strip()
            raise OSError(again.errno, f"{again.strerror}; verifier log: {text}") from first


def prog_query(cgroup_fd: int) -> list[int]:
    """Ids of the device programs attached to the cgroup open at `cgroup_fd` (not its parents')."""
    count = MAX_PROGS
    while True:
        ids = (ctypes.c_uint32 * count)()
        attr = _Query(
            target_fd=cgroup_fd, attach_type=BPF_CGROUP_DEVICE, prog_ids=ctypes.addressof(ids), prog_cnt=count
        )
        try:
            _bpf(BPF_PROG_QUERY, attr, "PROG_QUERY")
        except OSError as error:
            if error.errno == errno.ENOSPC and attr.prog_cnt > count:  # prog_cnt is now the real count
                count = attr.prog_cnt
                continue
            raise
        return list(ids[: attr.prog_cnt])


def prog_get_fd_by_id(prog_id: int) -> int:
    """An fd of the loaded program with this id."""
    return _bpf(BPF_PROG_GET_FD_BY_ID, _GetFdById(prog_id=prog_id), f"PROG_GET_FD_BY_ID({prog_id})")


def prog_attach(cgroup_fd: int, prog_fd: int) -> None:
    """Attach the program as one more device program of the cgroup (BPF_F_ALLOW_MULTI)."""
    attr = _Attach(
        target_fd=cgroup_fd,
        attach_bpf_fd=prog_fd,
        attach_type=BPF_CGROUP_DEVICE,
        attach_flags=BPF_F_ALLOW_MULTI,
    )
    _bpf(BPF_PROG_ATTACH, attr, "PROG_ATTACH")


def prog_detach(cgroup_fd: int, prog_fd: int) -> None:
    """Detach this one program from the cgroup's device programs."""
    _bpf(
        BPF_PROG_DETACH,
        _Attach(target_fd=cgroup_fd, attach_bpf_fd=prog_fd, attach_type=BPF_CGROUP_DEVICE),
        "PROG_DETACH",
    )

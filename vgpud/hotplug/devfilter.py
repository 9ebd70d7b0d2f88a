"""A cgroup v2 device program from device cgroup rules (pure, no I/O).

On cgroup v2 a container's device access is a BPF_PROG_TYPE_CGROUP_DEVICE program on its cgroup.
The kernel calls it with `struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}`:
the low 16 bits of `access_type` are the device type (block 1, char 2), the high 16 bits the
access asked for (mknod 1, read 2, write 4; an open for read and write asks for both at once),
and a return of 0 refuses the access with EPERM.

The rules are the OCI `LinuxDeviceCgroup` list, read as runc reads it: in order, the last rule
that matches decides, nothing matched is denied, type `a` matches both types, a missing major or
minor matches any. Each access bit asked for is decided on its own by the last rule that matches
the device and names that bit, and the access is allowed when every bit asked for is. That is
cgroup v1's devices list too, with two differences from runc's emulation of it: an `a` rule counts
only the access letters it names (runc takes any `a` rule as `rwm`), and a deny after a wildcard
allow does narrow it (runc refuses such a list as a hole cgroup v1 cannot punch).

`verdict` is the same decision in Python, the reference the compiled program is tested against.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from vgpud.containers.values import DeviceRule

#: the license string the program is loaded with (no helper is called, so any string loads)
LICENSE = "Apache"

#: access bits of bpf_cgroup_dev_ctx.access_type >> 16 (BPF_DEVCG_ACC_*)
ACCESS_BITS = {"m": 1, "r": 2, "w": 4}
#: device types of bpf_cgroup_dev_ctx.access_type & 0xffff (BPF_DEVCG_DEV_*)
DEVICE_TYPES = {"b": 1, "c": 2}
_U32_MAX = 0xFFFF_FFFF

# eBPF opcodes of the few instructions this module emits
OP_LDXW = 0x61  # dst = *(u32 *)(src + off)
OP_AND32_IMM = 0x54  # dst = (u32)dst & imm
OP_RSH32_IMM = 0x74  # dst = (u32)dst >> imm
OP_MOV32_REG = 0xBC  # dst = (u32)src
OP_MOV32_IMM = 0xB4  # dst = (u32)imm
OP_JNE32_IMM = 0x56  # if (u32)dst != (u32)imm: pc += off
OP_JA = 0x05  # pc += off
OP_EXIT = 0x95  # return r0

# registers: r1 the ctx, r2 type, r3 access, r4 major, r5 minor, r0 scratch and result
_CTX, _TYPE, _ACCESS, _MAJOR, _MINOR, _R0 = 1, 2, 3, 4, 5, 0


def check_rule(rule: DeviceRule) -> None:
    """Raise ValueError naming the rule when the kernel could not be given it."""
    if rule.type not in ("a", "b", "c"):
        raise ValueError(f"device rule {rule!r}: type must be a, b or c")
    if not rule.access or set(rule.access) - set(ACCESS_BITS):
        raise ValueError(f"device rule {rule!r}: access must be letters of r, w, m")
    for name, number in (("major", rule.major), ("minor", rule.minor)):
        if number is None:
            continue
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= _U32_MAX:
            raise ValueError(f"device rule {rule!r}: {name} must be None or 0..{_U32_MAX}")


def _matches_device(rule: DeviceRule, dev_type: str, major: int, minor: int) -> bool:
    return (
        rule.type in ("a", dev_type)
        and (rule.major is None or rule.major == major)
        and (rule.minor is None or rule.minor == minor)
    )


def verdict(rules: Sequence[DeviceRule], dev_type: str, major: int, minor: int, access: str) -> bool:
    """Whether `rules` allow `access` (letters of r, w, m) to the `dev_type` ("b"/"c") device."""
    for rule in rules:
        check_rule(rule)
    for letter in set(access):
        deciding = [r for r in rules if letter in r.access and _matches_device(r, dev_type, major, minor)]
        if not deciding or not deciding[-1].allow:
            return False
    return True


class _Asm:
    """Instructions with symbolic jump targets, resolved to offsets by `assemble`."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, int, int | str, int]] = []
        self.labels: dict[str, int] = {}

    def emit(self, op: int, dst: int = 0, src: int = 0, off: int | str = 0, imm: int = 0) -> None:
        self.code.append((op, dst, src, off, imm))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for pc, (op, dst, src, off, imm) in enumerate(self.code):
            offset = self.labels[off] - pc - 1 if isinstance(off, str) else off
            signed_imm = imm - (1 << 32) if imm > 0x7FFF_FFFF else imm
            out += struct.pack("<BBhi", op, (src << 4) | dst, offset, signed_imm)
        return bytes(out)


def _emit_rule(asm: _Asm, rule: DeviceRule, allowed: str, next_rule: str) -> bool:
    """The test of one rule for one access bit; True when the rule matches every device (so no
    rule before it can be reached for this bit)."""
    tests = []
    if rule.type != "a":
        tests.append((_TYPE, DEVICE_TYPES[rule.type]))
    if rule.major is not None:
        tests.append((_MAJOR, rule.major))
    if rule.minor is not None:
        tests.append((_MINOR, rule.minor))
    for register, value in tests:
        asm.emit(OP_JNE32_IMM, register, off=next_rule, imm=value)
    if rule.allow:
        asm.emit(OP_JA, off=allowed)
    else:
        asm.emit(OP_MOV32_IMM, _R0, imm=0)
        asm.emit(OP_EXIT)
    return not tests


def compile_filter(rules: Sequence[DeviceRule]) -> bytes:
    """The program (8-byte eBPF instructions) that decides as `verdict(rules, ...)` does.

    Per access bit asked for, the rules that name the bit are tested from the last to the first;
    the first match denies (return 0) or moves on to the next bit; no match denies. Tests after a
    rule that matches every device are left out: the verifier refuses unreachable instructions."""
    for rule in rules:
        check_rule(rule)
    asm = _Asm()
    asm.emit(OP_LDXW, _TYPE, _CTX, 0)
    asm.emit(OP_AND32_IMM, _TYPE, imm=0xFFFF)
    asm.emit(OP_LDXW, _ACCESS, _CTX, 0)
    asm.emit(OP_RSH32_IMM, _ACCESS, imm=16)
    asm.emit(OP_LDXW, _MAJOR, _CTX, 4)
    asm.emit(OP_LDXW, _MINOR, _CTX, 8)
    for letter, bit in ACCESS_BITS.items():
        allowed = f"{letter}-allowed"
        asm.emit(OP_MOV32_REG, _R0, _ACCESS)
        asm.emit(OP_AND32_IMM, _R0, imm=bit)
        asm.emit(OP_JNE32_IMM, _R0, off=allowed, imm=bit)
        covered = False
        candidates = [r for r in reversed(rules) if letter in r.access]
        for index, rule in enumerate(candidates):
            next_rule = f"{letter}-rule-{index + 1}"
            covered = _emit_rule(asm, rule, allowed, next_rule)
            asm.label(next_rule)
            if covered:
                break
        if not covered:
            asm.emit(OP_MOV32_IMM, _R0, imm=0)
            asm.emit(OP_EXIT)
        asm.label(allowed)
    asm.emit(OP_MOV32_IMM, _R0, imm=1)
    asm.emit(OP_EXIT)
    return asm.assemble()

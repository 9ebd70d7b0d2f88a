"""A small eBPF interpreter for the tests: it runs a compiled device program on one access.

It knows only the instructions vgpud.hotplug.devfilter emits, and fails on anything else: an
unknown opcode, a jump outside the program, a register read before it is written, a load that is
not one of the context's three u32 fields, or a program that does not end. So a wrong jump
offset or encoding gives a wrong answer or an error, never the right answer by luck.
"""

from __future__ import annotations

import struct

from vgpud.hotplug import devfilter

_MASK32 = 0xFFFF_FFFF
_CTX = object()


class BadProgram(Exception):
    """The program did something the kernel's verifier or this interpreter refuses."""


def run(program: bytes, access_type: int, major: int, minor: int, max_steps: int = 100_000) -> int:
    """r0 at EXIT, with r1 pointing at bpf_cgroup_dev_ctx{access_type, major, minor}."""
    if not program or len(program) % 8:
        raise BadProgram(f"length {len(program)} is not a multiple of 8")
    insns = [struct.unpack_from("<BBhi", program, at) for at in range(0, len(program), 8)]
    ctx = {0: access_type, 4: major, 8: minor}
    regs: list[object] = [None] * 11
    regs[1] = _CTX

    def value(reg: int) -> int:
        got = regs[reg]
        if not isinstance(got, int):
            raise BadProgram(f"r{reg} read before it holds a number")
        return got

    pc = 0
    for _ in range(max_steps):
        if not 0 <= pc < len(insns):
            raise BadProgram(f"pc {pc} outside the program of {len(insns)}")
        op, regbyte, off, imm = insns[pc]
        dst, src = regbyte & 0xF, regbyte >> 4
        pc += 1
        if op == devfilter.OP_LDXW:
            if regs[src] is not _CTX or off not in ctx:
                raise BadProgram(f"load from r{src}+{off}")
            regs[dst] = ctx[off] & _MASK32
        elif op == devfilter.OP_AND32_IMM:
            regs[dst] = value(dst) & imm & _MASK32
        elif op == devfilter.OP_RSH32_IMM:
            regs[dst] = (value(dst) & _MASK32) >> imm
        elif op == devfilter.OP_MOV32_REG:
            regs[dst] = value(src) & _MASK32
        elif op == devfilter.OP_MOV32_IMM:
            regs[dst] = imm & _MASK32
        elif op == devfilter.OP_JNE32_IMM:
            if value(dst) & _MASK32 != imm & _MASK32:
                pc += off
        elif op == devfilter.OP_JA:
            pc += off
        elif op == devfilter.OP_EXIT:
            return value(0)
        else:
            raise BadProgram(f"opcode {op:#x} at {pc - 1}")
    raise BadProgram(f"no EXIT within {max_steps} steps")


def access_type(dev_type: str, access: str) -> int:
    """bpf_cgroup_dev_ctx.access_type for a device type and access letters."""
    bits = 0
    for letter in access:
        bits |= devfilter.ACCESS_BITS[letter]
    return bits << 16 | devfilter.DEVICE_TYPES[dev_type]

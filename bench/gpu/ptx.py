"""The PTX the acceptance script JIT-loads with cuModuleLoadData: `spin` busy-waits `cycles` SM
clock cycles (clock64), so a grid of 4 blocks per SM keeps every SM busy for a known time; `nop`
returns at once (launch overhead). PTX ISA 7.0 for sm_70 JIT-compiles on every later GPU."""

SPIN_AND_NOP = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(.param .u64 cycles)
{
    .reg .pred p;
    .reg .u64 start, stamp, spent, limit;
    ld.param.u64 limit, [cycles];
    mov.u64 start, %clock64;
WAIT:
    mov.u64 stamp, %clock64;
    sub.u64 spent, stamp, start;
    setp.lt.u64 p, spent, limit;
    @p bra WAIT;
    ret;
}

.visible .entry nop()
{
    ret;
}
\x00"""

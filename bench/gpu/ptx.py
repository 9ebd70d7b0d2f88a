"""The PTX the acceptance script JIT-loads with cuModuleLoadData: `spin` busy-waits `cycles` SM
clock cycles (clock64), so a grid of 4 blocks per SM keeps every SM busy for a known time; `nop`
returns at once (launch overhead). PTX ISA 7.0 for sm_70 JIT-compiles on every later GPU."""

SPIN_AND_NOP = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(
    .param .u64 spin_param_0
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [spin_param_0];
    mov.u64 %rd2, %clock64;
$L_wait:
    mov.u64 %rd3, %clock64;
    sub.s64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra $L_wait;
    ret;
}

.visible .entry nop()
{
    ret;
}
\x00"""

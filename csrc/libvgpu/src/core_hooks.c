/* The launch hooks of the core limit: each charges its grid's block count to the bucket of the
 * current context's device (waiting while it is empty), then calls the driver. A launch on a
 * capturing stream runs nothing (it becomes a node of the graph, charged when the graph is launched)
 * and is not charged. Graph launches are in core_graph.c. */
#include "capture.h"
#include "core_abi.h"
#include "core_limit.h"
#include "vgpu_state.h"

static unsigned long long blocks3(unsigned int x, unsigned int y, unsigned int z)
{
    return (unsigned long long)x * y * z;
}

/* Charges `blocks` for a launch on stream `s` (of a _ptsz entry point when `ptsz`), unless the
 * stream is capturing. */
static void charge_launch(CUstream s, int ptsz, unsigned long long blocks)
{
    if (!vgpu_launch_is_captured(s, ptsz))
        vgpu_core_charge_current(blocks);
}

#define LAUNCH_HOOK(name, ptsz)                                                                                \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                              unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,  \
                              void **extra)                                                                    \
    {                                                                                                          \
        HOOK_REAL_CU(name);                                                                                    \
        charge_launch(s, ptsz, blocks3(gx, gy, gz));                                                           \
        return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);                                       \
    }
LAUNCH_HOOK(cuLaunchKernel, 0)
LAUNCH_HOOK(cuLaunchKernel_ptsz, 1)

#define LAUNCH_EX_HOOK(name, ptsz)                                                               \
    VGPU_EXPORT CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) \
    {                                                                                            \
        HOOK_REAL_CU(name);                                                                      \
        if (config != NULL)                                                                      \
            charge_launch(config->hStream, ptsz, blocks3(config->gridDimX, config->gridDimY, config->gridDimZ)); \
        return real(config, f, params, extra);                                                   \
    }
LAUNCH_EX_HOOK(cuLaunchKernelEx, 0)
LAUNCH_EX_HOOK(cuLaunchKernelEx_ptsz, 1)

#define COOPERATIVE_HOOK(name, ptsz)                                                                           \
    VGPU_EXPORT CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
                              unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params)  \
    {                                                                                                          \
        HOOK_REAL_CU(name);                                                                                    \
        charge_launch(s, ptsz, blocks3(gx, gy, gz));                                                           \
        return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);                                              \
    }
COOPERATIVE_HOOK(cuLaunchCooperativeKernel, 0)
COOPERATIVE_HOOK(cuLaunchCooperativeKernel_ptsz, 1)

/* cuLaunch runs a 1 x 1 grid; cuLaunchGrid(Async) a w x h one (legacy API, block shape set before). */
VGPU_EXPORT CUresult cuLaunch(CUfunction f)
{
    HOOK_REAL_CU(cuLaunch);
    vgpu_core_charge_current(1);
    return real(f);
}

static unsigned long long blocks2(int w, int h)
{
    return w > 0 && h > 0 ? (unsigned long long)w * (unsigned long long)h : 0;
}

VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h)
{
    HOOK_REAL_CU(cuLaunchGrid);
    vgpu_core_charge_current(blocks2(w, h));
    return real(f, w, h);
}

VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s)
{
    HOOK_REAL_CU(cuLaunchGridAsync);
    charge_launch(s, 0, blocks2(w, h));
    return real(f, w, h, s);
}

/* Each entry runs on its stream's context's device: charged there (the context pushed to ask). */
VGPU_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n,
                                                          unsigned int flags)
{
    HOOK_REAL_CU(cuLaunchCooperativeKernelMultiDevice);
    if (list != NULL && vgpu_core_any_limit()) {
        static void *ctx_slot, *push_slot, *pop_slot;
        cu_stream_get_ctx_fn get_ctx = vgpu_real_cached(&ctx_slot, VGPU_LIB_CUDA, "cuStreamGetCtx");
        cu_ctx_push_fn push = vgpu_real_cached(&push_slot, VGPU_LIB_CUDA, "cuCtxPushCurrent_v2");
        cu_ctx_pop_fn pop = vgpu_real_cached(&pop_slot, VGPU_LIB_CUDA, "cuCtxPopCurrent_v2");
        for (unsigned int i = 0; i < n; i++) {
            unsigned long long blocks = blocks3(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ);
            CUcontext ctx, popped;
            if (get_ctx && push && pop && get_ctx(list[i].hStream, &ctx) == CUDA_SUCCESS &&
                push(ctx) == CUDA_SUCCESS) {
                int host = vgpu_host_of_current();
                pop(&popped);
                vgpu_core_charge(host, blocks);
            } else {
                vgpu_core_charge_current(blocks);
            }
        }
    }
    return real(list, n, flags);
}

/* The container's devices only. When the library is configured (its env or vgpu.config names a
 * device, vgpu_state.h), a device whose UUID is none of the configured ones is refused at every
 * door that names a device:
 *   - CUDA device lookups (cuDeviceGet, cuDeviceGetByPCIBusId): CUDA_ERROR_INVALID_DEVICE, *device
 *     untouched;
 *   - context creation on it, by a device from anywhere (a raw ordinal included): cuCtxCreate (every
 *     ABI variant), cuDevicePrimaryCtxRetain, cuGreenCtxCreate: CUDA_ERROR_INVALID_DEVICE, nothing
 *     created (the driver is not called);
 *   - NVML handle lookups (by index, UUID, PCI bus id, serial): NVML_ERROR_NOT_FOUND, *device
 *     untouched; NVML's handle lists (topology, units) lose its handles.
 * Counts (cuDeviceGetCount, nvmlDeviceGetCount) are the driver's: ordinal / index i stays the same
 * GPU in CUDA and NVML. Allocations on such a device are refused in hooks_mem.c. Each refused device
 * is logged once per process. An inert library (no device configured) passes everything. */
#include "cuda_abi.h"
#include "nvml_abi.h"
#include "vgpu_state.h"

/* Whether CUDA device `dev` may be used: CUDA_SUCCESS; CUDA_ERROR_INVALID_DEVICE (logged) for a
 * device not the container's; or the driver's own error when it cannot read the device's UUID (an
 * invalid ordinal, a driver not initialised: the call would fail the same way). */
static CUresult gate_cudev(CUdevice dev)
{
    CUresult why;
    int host = vgpu_judge_cudev(dev, &why);
    if (VGPU_IS_FOREIGN(host)) {
        vgpu_log_refused_cudev(host);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    return why;
}

/* A device lookup: the driver answers into a local, which reaches the caller only when it passes. */
#define DEVICE_LOOKUP(name, key_t)                                                             \
    VGPU_EXPORT CUresult name(CUdevice *device, key_t key)                                     \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        CUdevice d;                                                                            \
        CUresult r = real(device != NULL ? &d : NULL, key);                                    \
        if (r != CUDA_SUCCESS || device == NULL)                                               \
            return r;                                                                          \
        if ((r = gate_cudev(d)) == CUDA_SUCCESS)                                               \
            *device = d;                                                                       \
        return r;                                                                              \
    }
DEVICE_LOOKUP(cuDeviceGet, int)
DEVICE_LOOKUP(cuDeviceGetByPCIBusId, const char *)

/* Context creation: the device is judged before the driver is called. */
VGPU_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    HOOK_REAL_CU(cuCtxCreate);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, flags, dev);
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    HOOK_REAL_CU(cuCtxCreate_v2);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, flags, dev);
}

/* CUDA 11.4: with execution affinity parameters. */
VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                    CUdevice dev)
{
    HOOK_REAL_CU(cuCtxCreate_v3);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, params, n, flags, dev);
}

/* CUDA 12.5: with CUctxCreateParams (affinity, CIG); CUDA 13's cuCtxCreate. */
VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    HOOK_REAL_CU(cuCtxCreate_v4);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, params, flags, dev);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    HOOK_REAL_CU(cuDevicePrimaryCtxRetain);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, dev);
}

/* CUDA 12.4: a green context on `dev` (its resources come from cuDeviceGetDevResource(dev)). */
VGPU_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *pctx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags)
{
    HOOK_REAL_CU(cuGreenCtxCreate);
    CUresult r = gate_cudev(dev);
    return r != CUDA_SUCCESS ? r : real(pctx, desc, dev, flags);
}

/* --- NVML ------------------------------------------------------------------------------------- */

/* Whether NVML handle `h` may be used: NVML_SUCCESS; NVML_ERROR_NOT_FOUND (logged) for a device not
 * the container's; or NVML's own error when it cannot read the handle's UUID. */
static nvmlReturn_t gate_nvml(nvmlDevice_t h)
{
    nvmlReturn_t why;
    int host = vgpu_judge_nvml(h, &why);
    if (VGPU_IS_FOREIGN(host)) {
        vgpu_log_refused_nvml(h);
        return NVML_ERROR_NOT_FOUND;
    }
    return why;
}

#define HANDLE_LOOKUP(name, key_t)                                                             \
    VGPU_EXPORT nvmlReturn_t name(key_t key, nvmlDevice_t *device)                             \
    {                                                                                          \
        HOOK_REAL_NVML(name);                                                                  \
        nvmlDevice_t h = NULL;                                                                 \
        nvmlReturn_t r = real(key, device != NULL ? &h : NULL);                                \
        if (r != NVML_SUCCESS || device == NULL)                                               \
            return r;                                                                          \
        if ((r = gate_nvml(h)) == NVML_SUCCESS)                                                \
            *device = h;                                                                       \
        return r;                                                                              \
    }
HANDLE_LOOKUP(nvmlDeviceGetHandleByIndex, unsigned int)
HANDLE_LOOKUP(nvmlDeviceGetHandleByIndex_v2, unsigned int)
HANDLE_LOOKUP(nvmlDeviceGetHandleByUUID, const char *)
HANDLE_LOOKUP(nvmlDeviceGetHandleByUUIDV, const nvmlUUID_t *)
HANDLE_LOOKUP(nvmlDeviceGetHandleByPciBusId, const char *)
HANDLE_LOOKUP(nvmlDeviceGetHandleByPciBusId_v2, const char *)
HANDLE_LOOKUP(nvmlDeviceGetHandleBySerial, const char *)

/* A handle list NVML filled (`asked` > 0: the caller's capacity; 0 asked only for the size): only
 * the container's devices stay, in order, and *count says how many. */
static void keep_ours(unsigned int asked, unsigned int *count, nvmlDevice_t *list)
{
    if (asked == 0 || count == NULL || list == NULL)
        return;
    unsigned int kept = 0;
    for (unsigned int i = 0; i < *count && i < asked; i++)
        if (gate_nvml(list[i]) == NVML_SUCCESS)
            list[kept++] = list[i];
    *count = kept;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t dev, int level, unsigned int *count,
                                                          nvmlDevice_t *list)
{
    HOOK_REAL_NVML(nvmlDeviceGetTopologyNearestGpus);
    unsigned int asked = count != NULL ? *count : 0;
    nvmlReturn_t r = real(dev, level, count, list);
    if (r == NVML_SUCCESS)
        keep_ours(asked, count, list);
    return r;
}

VGPU_EXPORT nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpu, unsigned int *count, nvmlDevice_t *list)
{
    HOOK_REAL_NVML(nvmlSystemGetTopologyGpuSet);
    unsigned int asked = count != NULL ? *count : 0;
    nvmlReturn_t r = real(cpu, count, list);
    if (r == NVML_SUCCESS)
        keep_ours(asked, count, list);
    return r;
}

VGPU_EXPORT nvmlReturn_t nvmlUnitGetDevices(nvmlUnit_t unit, unsigned int *count, nvmlDevice_t *list)
{
    HOOK_REAL_NVML(nvmlUnitGetDevices);
    unsigned int asked = count != NULL ? *count : 0;
    nvmlReturn_t r = real(unit, count, list);
    if (r == NVML_SUCCESS)
        keep_ours(asked, count, list);
    return r;
}

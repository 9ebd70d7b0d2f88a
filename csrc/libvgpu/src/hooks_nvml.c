/* NVML hooks: init triggers, the limited memory view, and the mode calls a limited container
 * must not change; each answers NVML_ERROR_NOT_FOUND for the handle of a device that is not the
 * container's (hooks_dev.c refuses such handles; these cover one obtained another way). Everything
 * else passes through. */
#include "memlimit.h"
#include "nvml_abi.h"
#include "vgpu_state.h"

VGPU_EXPORT nvmlReturn_t nvmlInit(void)
{
    vgpu_init();
    __typeof__(&nvmlInit) real = REAL_NVML(nvmlInit);
    return real == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : real();
}

VGPU_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    vgpu_init();
    __typeof__(&nvmlInit_v2) real = REAL_NVML(nvmlInit_v2);
    return real == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : real();
}

VGPU_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    vgpu_init();
    __typeof__(&nvmlInitWithFlags) real = REAL_NVML(nvmlInitWithFlags);
    return real == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : real(flags);
}

/* Host index of `dev` when it is limited, else -1. */
static int limited_host(nvmlDevice_t dev)
{
    int host = vgpu_host_of_nvml(dev);
    return host >= 0 && vgpu_cfg()->dev[host].mem_limit > 0 ? host : -1;
}

/* Whether `dev` is a device the container was not given (logged once per device). */
static int refused(nvmlDevice_t dev)
{
    if (!VGPU_IS_FOREIGN(vgpu_host_of_nvml(dev)))
        return 0;
    vgpu_log_refused_nvml(dev);
    return 1;
}

/* total = the limit (never above physical unless oversold), used = min(usage, total). */
static int nvml_view(int host, unsigned long long physical, unsigned long long *total, unsigned long long *used)
{
    const struct vgpu_device_cfg *d = &vgpu_cfg()->dev[host];
    unsigned long long u, vmem, f;
    /* the total first: a caller falls back to the device's usage under it when ours is unknown */
    vgpu_limited_view(d->mem_limit, d->mem_ratio > 1.0 || d->mem_oversold, physical, 0, total, &f);
    if (vgpu_usage(host, &u, &vmem) < 0)
        return -1;
    *used = u + vmem < *total ? u + vmem : *total;
    return 0;
}

/* The container's (total, used) of `dev` from the driver's: 0 when the device is not limited. */
static int limited_memory(nvmlDevice_t dev, unsigned long long physical, unsigned long long device_used,
                          unsigned long long *total, unsigned long long *used)
{
    int host = limited_host(dev);
    if (host < 0)
        return 0;
    if (nvml_view(host, physical, total, used) < 0)
        *used = device_used < *total ? device_used : *total; /* unknown usage: device usage, capped */
    return 1;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *mem)
{
    HOOK_REAL_NVML(nvmlDeviceGetMemoryInfo);
    if (refused(dev))
        return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    unsigned long long total, used;
    if (r != NVML_SUCCESS || mem == NULL || !limited_memory(dev, mem->total, mem->used, &total, &used))
        return r;
    mem->total = total;
    mem->used = used;
    mem->free = total - used;
    return r;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem)
{
    HOOK_REAL_NVML(nvmlDeviceGetMemoryInfo_v2);
    if (refused(dev))
        return NVML_ERROR_NOT_FOUND;
    nvmlReturn_t r = real(dev, mem);
    unsigned long long total, used;
    if (r != NVML_SUCCESS || mem == NULL || !limited_memory(dev, mem->total, mem->used, &total, &used))
        return r;
    mem->total = total;
    mem->used = used;
    mem->reserved = mem->reserved < total - used ? mem->reserved : total - used;
    mem->free = total - used - mem->reserved;
    return r;
}

/* A limited container must not switch the shared device's compute mode. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t dev, int mode)
{
    vgpu_init();
    __typeof__(&nvmlDeviceSetComputeMode) real = REAL_NVML(nvmlDeviceSetComputeMode);
    if (refused(dev))
        return NVML_ERROR_NOT_FOUND;
    if (limited_host(dev) >= 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return real == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : real(dev, mode);
}

/* Reported disabled on a limited device: persistence is the host's setting, not the container's. */
VGPU_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode)
{
    vgpu_init();
    __typeof__(&nvmlDeviceGetPersistenceMode) real = REAL_NVML(nvmlDeviceGetPersistenceMode);
    if (refused(dev))
        return NVML_ERROR_NOT_FOUND;
    if (mode != NULL && limited_host(dev) >= 0) {
        *mode = NVML_FEATURE_DISABLED;
        return NVML_SUCCESS;
    }
    return real == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : real(dev, mode);
}

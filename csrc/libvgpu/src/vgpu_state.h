/* The library's per-process state: lazy init, configuration, and the UUID device mapping. */
#ifndef VGPU_STATE_H
#define VGPU_STATE_H

#include "cuda_abi.h"
#include "env.h"
#include "nvml_abi.h"
#include "real.h"

/* Initialise on the first hooked entry (never at load): the configuration, fork handlers, and
 * the loader (registration in client mode). Cheap after the first call; a forked child runs the
 * per-process part again. */
VGPU_HIDDEN void vgpu_init(void);

/* A hook's prologue: vgpu_init(), then `real` bound to the original of `name`; the hook returns
 * CUDA_ERROR_NOT_FOUND (NVML_ERROR_FUNCTION_NOT_FOUND) when the driver (NVML) lacks it. */
#define HOOK_REAL_CU(name)                                                                     \
    vgpu_init();                                                                               \
    __typeof__(&name) real = REAL_CU(name);                                                    \
    if (real == NULL)                                                                          \
        return CUDA_ERROR_NOT_FOUND
#define HOOK_REAL_NVML(name)                                                                   \
    vgpu_init();                                                                               \
    __typeof__(&name) real = REAL_NVML(name);                                                  \
    if (real == NULL)                                                                          \
        return NVML_ERROR_FUNCTION_NOT_FOUND

VGPU_HIDDEN const struct vgpu_env_config *vgpu_cfg(void);

/* Host index i of CUDA device `dev` (by cuDeviceGetUuid), or -1 when it is none of ours. */
VGPU_HIDDEN int vgpu_host_of_cudev(CUdevice dev);
/* Host index of the current context's device, or -1. */
VGPU_HIDDEN int vgpu_host_of_current(void);
/* Host index of an NVML handle (by nvmlDeviceGetUUID), or -1. */
VGPU_HIDDEN int vgpu_host_of_nvml(nvmlDevice_t h);
/* The NVML handle of host index i (by UUID), or NULL. Initialises NVML for the library. */
VGPU_HIDDEN nvmlDevice_t vgpu_nvml_of_host(int host);

/* Whether the library's own NVML session is up (initialising it on first use). */
VGPU_HIDDEN int vgpu_nvml_ready(void);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from 16 bytes (pure). */
VGPU_HIDDEN void vgpu_format_uuid(const unsigned char b[16], char out[41]);

/* One diagnostic line on stderr: "vgpu: <text>". */
VGPU_HIDDEN void vgpu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

/* The library's per-process state: lazy init, configuration, and the UUID device mapping. */
#ifndef VGPU_STATE_H
#define VGPU_STATE_H

#include "cuda_abi.h"
#include "env.h"
#include "log_level.h"
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

/* What a device is to the library (the vgpu_host_of_* results). The library is configured when its
 * env (or vgpu.config: hot-plugged devices) names at least one device; otherwise it is inert (not a
 * vGPU container) and every device is VGPU_HOST_NONE, judged by nobody.
 *   >= 0                  host index i: one of the container's devices (its limits apply);
 *   VGPU_HOST_NONE        nothing to judge: the library is inert, there is no current context, or
 *                         the driver cannot tell the device's UUID (the driver then fails the call);
 *   VGPU_IS_FOREIGN(h)    a device the configured library was not given: refused. For CUDA it
 *                         carries the ordinal (VGPU_FOREIGN_CUDEV), so a refusal can name it.
 * Every negative value keeps meaning "no limits of ours" to code that only tests host >= 0. */
#define VGPU_HOST_NONE (-1)
#define VGPU_HOST_FOREIGN (-2)
#define VGPU_IS_FOREIGN(h) ((h) <= VGPU_HOST_FOREIGN)
#define VGPU_FOREIGN_CUDEV(dev) (VGPU_HOST_FOREIGN - (dev))

/* Host index of CUDA device `dev` (by cuDeviceGetUuid), as above. */
VGPU_HIDDEN int vgpu_host_of_cudev(CUdevice dev);
/* The same, and in *why the driver's error when it could not read the UUID of `dev` (the result is
 * then VGPU_HOST_NONE); CUDA_SUCCESS otherwise. */
VGPU_HIDDEN int vgpu_judge_cudev(CUdevice dev, CUresult *why);
/* Host index of the current context's device, as above (VGPU_HOST_NONE without one). */
VGPU_HIDDEN int vgpu_host_of_current(void);
/* Host index of an NVML handle (by nvmlDeviceGetUUID): >= 0, VGPU_HOST_NONE, VGPU_HOST_FOREIGN. */
VGPU_HIDDEN int vgpu_host_of_nvml(nvmlDevice_t h);
/* The same, and in *why NVML's error when it could not read the handle's UUID. */
VGPU_HIDDEN int vgpu_judge_nvml(nvmlDevice_t h, nvmlReturn_t *why);
/* The NVML handle of host index i (by UUID), or NULL. Initialises NVML for the library. */
VGPU_HIDDEN nvmlDevice_t vgpu_nvml_of_host(int host);

/* The one log line of a refused device, once per UUID per process: "vgpu: refused device
 * GPU-...: not one of this container's devices". By CUDA result (VGPU_IS_FOREIGN), or by handle. */
VGPU_HIDDEN void vgpu_log_refused_cudev(int host);
VGPU_HIDDEN void vgpu_log_refused_nvml(nvmlDevice_t h);

/* Whether the library's own NVML session is up (initialising it on first use). */
VGPU_HIDDEN int vgpu_nvml_ready(void);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" from 16 bytes (pure). */
VGPU_HIDDEN void vgpu_format_uuid(const unsigned char b[16], char out[41]);

/* One diagnostic line on stderr, "vgpu: <level>: <text>", when LOGGER_LEVEL lets `level`
 * (log_level.h) through (log.c). */
VGPU_HIDDEN void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether a line of `level` is written (for lines costly to prepare). */
VGPU_HIDDEN int vgpu_log_enabled(int level);
/* The loader's log op (loader.h): its formatted lines, by level. */
VGPU_HIDDEN void vgpu_log_loader_line(void *ctx, int level, const char *line);

#endif

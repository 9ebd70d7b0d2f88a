/* The hook table: every CUDA driver / NVML function this library replaces, by exact exported
 * name. The dlsym hook and cuGetProcAddress routing both answer from it.
 *
 * Adding a hook (see ../README.md "Adding a hook"):
 *   1. define it with the exact public signature and VGPU_EXPORT in a .c file, starting with
 *      HOOK_REAL_CU(name) / HOOK_REAL_NVML(name) (vgpu_state.h) and calling the original as real();
 *   2. list it as VGPU_HOOK(name) in hooks_lib.def (lib's hooks) or core_hooks.def (core's).
 * Every listed name is also put in the real-function index, so cuGetProcAddress maps the driver's
 * pointer for it back to this exact name. */
#ifndef VGPU_HOOKS_H
#define VGPU_HOOKS_H

#include "real.h"

struct vgpu_hook {
    const char *name;
    void *fn;
};

/* The hook for exactly `name`, or NULL. */
VGPU_HIDDEN void *vgpu_hook_by_name(const char *name);

/* All hooks (sorted by name); *count set. */
VGPU_HIDDEN const struct vgpu_hook *vgpu_hooks(size_t *count);

/* Whether `name` is in the families the dlsym hook answers for: cu[A-Z]*, cudbg*, nvml[A-Z]*. */
VGPU_HIDDEN int vgpu_hook_family(const char *name);

/* cuGetProcAddress routing (pure given the index): what to hand the caller for `symbol` when the
 * driver returned `driver_fn`. */
VGPU_HIDDEN void *vgpu_route_proc(const char *symbol, void *driver_fn, int cuda_version, unsigned long long flags);

#endif

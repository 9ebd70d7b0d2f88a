/* The real driver and NVML: the real dlsym, the real libraries, and the real-function table
 * every hook calls its original through. Nothing here initialises at load. */
#ifndef VGPU_REAL_H
#define VGPU_REAL_H

#include <stddef.h>

#define VGPU_HIDDEN __attribute__((visibility("hidden")))
#define VGPU_EXPORT __attribute__((visibility("default")))

enum vgpu_lib { VGPU_LIB_CUDA = 0, VGPU_LIB_NVML = 1 };

/* glibc's dlsym, found with dlvsym so that the library never calls its own dlsym hook. */
VGPU_HIDDEN void *vgpu_real_dlsym(void *handle, const char *symbol);
typedef void *(*vgpu_dlsym_fn)(void *, const char *);
VGPU_HIDDEN vgpu_dlsym_fn vgpu_real_dlsym_fn(void);

/* The real libcuda.so.<ver> / libnvidia-ml.so.1 handle (dlopen'd RTLD_NOW|RTLD_NODELETE on first
 * use), or NULL when it is not there. */
VGPU_HIDDEN void *vgpu_real_lib(enum vgpu_lib lib);

/* The real function `name` of `lib`, or NULL; never a pointer into this library. */
VGPU_HIDDEN void *vgpu_real_fn(enum vgpu_lib lib, const char *name);

/* A cached vgpu_real_fn: *slot holds the pointer once found. */
VGPU_HIDDEN void *vgpu_real_cached(void **slot, enum vgpu_lib lib, const char *name);

/* The original of hook `name` (declared with its exact prototype), typed as the hook:
 *   CUresult r = REAL_CU(cuMemAlloc_v2)(dptr, size);
 * The result is NULL when the driver lacks it; the hook must check (HOOK_REAL_CU in vgpu_state.h). */
#define REAL_CU(name)                                                                          \
    ({                                                                                         \
        static void *vgpu_slot_;                                                               \
        (__typeof__(&name))vgpu_real_cached(&vgpu_slot_, VGPU_LIB_CUDA, #name);                \
    })
#define REAL_NVML(name)                                                                        \
    ({                                                                                         \
        static void *vgpu_slot_;                                                               \
        (__typeof__(&name))vgpu_real_cached(&vgpu_slot_, VGPU_LIB_NVML, #name);                \
    })

/* Whether `addr` lies in this library (dladdr ownership). */
VGPU_HIDDEN int vgpu_is_own_address(const void *addr);

/* Our own path (for the self-dlopen of the dlsym hook), or NULL. */
VGPU_HIDDEN const char *vgpu_self_path(void);

/* The libcuda soname to load, from the NVRM line of the driver version file (pure, for tests):
 * "libcuda.so.<ver>", or "libcuda.so.1" when the text holds no version. */
VGPU_HIDDEN void vgpu_libcuda_soname(const char *nvrm_text, char *out, size_t cap);

#endif

/*
 * fakecuda's library API (CUDA 12.0): context-independent modules (CUlibrary), whose kernels
 * (CUkernel) launch wherever a CUfunction does, as the real driver allows, and the attributes a
 * client reads from a function or kernel before launching it. cuda.core, and so numba-cuda, load and
 * launch every kernel this way (cuLibraryLoadData, cuLibraryGetKernel, cuKernelGetAttribute, then
 * cuLaunchKernelEx with the CUkernel).
 *
 * A library holds one module loaded as cuModuleLoadData loads an image (PTX, cubin, fatbin); a
 * CUkernel is that module's CUfunction, so cuKernelGetFunction gives it back and every launch path
 * (and a graph's kernel node) takes it. Nothing is compiled: the attributes are those of a small
 * kernel (32 registers, no static shared, constant or local memory, 1024 threads per block, built
 * for the device's compute capability).
 */
#include <stdlib.h>

#include "fakecuda.h"

struct CUlib_st {
    uint32_t tag;
    CUmodule module;
};

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
EXPORT CUresult cuModuleUnload(CUmodule hmod);

static CUresult library(CUlibrary lib) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    return lib == NULL || lib->tag != TAG_LIBRARY ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

/* JIT and library options are accepted and ignored: there is nothing to compile. */
EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jitOptions, void **jitOptionsValues,
                                  unsigned int numJitOptions, void *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    if (lib == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUlib_st *l = calloc(1, sizeof *l);
    if (l == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fc_module_load(&l->module, code);
    if (rc != CUDA_SUCCESS) {
        free(l);
        return rc;
    }
    l->tag = TAG_LIBRARY;
    *lib = l;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryUnload(CUlibrary lib) {
    CUresult rc = library(lib);
    if (rc != CUDA_SUCCESS) return rc;
    lib->tag = 0;
    cuModuleUnload(lib->module);
    free(lib);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *kernel, CUlibrary lib, const char *name) {
    CUresult rc = library(lib);
    return rc != CUDA_SUCCESS ? rc : cuModuleGetFunction(kernel, lib->module, name);
}

EXPORT CUresult cuKernelGetFunction(CUfunction *func, CUkernel kernel) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (func == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_valid_function(kernel)) return CUDA_ERROR_INVALID_HANDLE;
    if (fc_current() == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    *func = kernel;
    return CUDA_SUCCESS;
}

/* CUfunction_attribute */
enum {
    FA_MAX_THREADS_PER_BLOCK = 0,
    FA_SHARED_SIZE_BYTES = 1,
    FA_CONST_SIZE_BYTES = 2,
    FA_LOCAL_SIZE_BYTES = 3,
    FA_NUM_REGS = 4,
    FA_PTX_VERSION = 5,
    FA_BINARY_VERSION = 6,
    FA_CACHE_MODE_CA = 7,
    FA_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    FA_PREFERRED_SHARED_MEMORY_CARVEOUT = 9,
    FA_MAX = 16,
};

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev);

EXPORT CUresult cuKernelGetAttribute(int *value, int attrib, CUkernel f, CUdevice dev) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (value == NULL || attrib < 0 || attrib >= FA_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (!fc_valid_function(f)) return CUDA_ERROR_INVALID_HANDLE;
    int major, minor;
    if ((rc = cuDeviceComputeCapability(&major, &minor, dev)) != CUDA_SUCCESS) return rc;
    switch (attrib) {
    case FA_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case FA_NUM_REGS: *value = 32; break;
    case FA_PTX_VERSION: case FA_BINARY_VERSION: *value = major * 10 + minor; break;
    case FA_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = 49152; break;
    case FA_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = -1; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

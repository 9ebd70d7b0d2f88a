/* Entry hooks that trigger initialisation, and cuGetProcAddress (the main door: libcudart fetches
 * every entry point through it). */
#include "cuda_abi.h"
#include "hooks.h"
#include "vgpu_state.h"

VGPU_EXPORT CUresult cuInit(unsigned int flags)
{
    vgpu_init();
    __typeof__(&cuInit) real = REAL_CU(cuInit);
    return real == NULL ? CUDA_ERROR_NOT_FOUND : real(flags);
}

VGPU_EXPORT CUresult cuDriverGetVersion(int *version)
{
    vgpu_init();
    __typeof__(&cuDriverGetVersion) real = REAL_CU(cuDriverGetVersion);
    return real == NULL ? CUDA_ERROR_NOT_FOUND : real(version);
}

/* The driver answers; we replace its pointer by the hook of the exact function it chose. */
VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    HOOK_REAL_CU(cuGetProcAddress);
    CUresult r = real(symbol, pfn, cuda_version, flags);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = vgpu_route_proc(symbol, *pfn, cuda_version, flags);
    return r;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status)
{
    HOOK_REAL_CU(cuGetProcAddress_v2);
    CUresult r = real(symbol, pfn, cuda_version, flags, status);
    if (r == CUDA_SUCCESS && pfn != NULL)
        *pfn = vgpu_route_proc(symbol, *pfn, cuda_version, flags);
    return r;
}

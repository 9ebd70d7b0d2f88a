/*
 * fakecuda copies: host to device, device to host, device to device, and their Async forms, over
 * the bytes fakemem.c keeps behind device allocations (mapped on first copy), so what a client copies
 * in comes back out. Kernels compute nothing, so a copy never sees a kernel's result.
 *
 * A synchronous copy first waits for the kernels before it on its stream (the legacy default stream:
 * all of this process's kernels on the device), as the real driver's does, so copying a result back
 * takes the kernels' simulated time. An Async copy takes effect at once: with kernels that write
 * nothing, order on the stream cannot change the bytes. A copy on a capturing stream would be a memcpy
 * node, which the fake's graphs do not have: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED.
 * The _ptds / _ptsz forms use the per-thread default stream for a NULL stream.
 */
#include <string.h>

#include "fakecuda.h"

enum { TO_DEVICE = 1, FROM_DEVICE = 2 };

/* `bytes` from src to dst; a device side is a CUdeviceptr resolved through fakemem.c. */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t bytes, int sides) {
    void *to = (void *)dst, *from = (void *)src;
    CUresult rc = CUDA_SUCCESS;
    if (bytes == 0) return rc;
    if ((sides & TO_DEVICE) && (rc = fc_mem_bytes(dst, bytes, &to)) != CUDA_SUCCESS) return rc;
    if ((sides & FROM_DEVICE) && (rc = fc_mem_bytes(src, bytes, &from)) != CUDA_SUCCESS) return rc;
    if (to == NULL || from == NULL) return CUDA_ERROR_INVALID_VALUE;
    memmove(to, from, bytes);
    return CUDA_SUCCESS;
}

static CUresult copy_sync(uintptr_t dst, uintptr_t src, size_t bytes, int sides, int ptds) {
    CUresult rc = fc_stream_wait(NULL, ptds);
    return rc != CUDA_SUCCESS ? rc : copy(dst, src, bytes, sides);
}

static CUresult copy_async(uintptr_t dst, uintptr_t src, size_t bytes, int sides, CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (fc_stream_capturing(&s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return copy(dst, src, bytes, sides);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    return copy_sync(dst, (uintptr_t)src, n, TO_DEVICE, 0);
}
EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n) {
    return copy_sync(dst, (uintptr_t)src, n, TO_DEVICE, 1);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    return copy_sync((uintptr_t)dst, src, n, FROM_DEVICE, 0);
}
EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n) {
    return copy_sync((uintptr_t)dst, src, n, FROM_DEVICE, 1);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, src, n, TO_DEVICE | FROM_DEVICE, 0);
}
EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy_sync(dst, src, n, TO_DEVICE | FROM_DEVICE, 1);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
    return copy_async(dst, (uintptr_t)src, n, TO_DEVICE, h, 0);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
    return copy_async(dst, (uintptr_t)src, n, TO_DEVICE, h, 1);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h) {
    return copy_async((uintptr_t)dst, src, n, FROM_DEVICE, h, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream h) {
    return copy_async((uintptr_t)dst, src, n, FROM_DEVICE, h, 1);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    return copy_async(dst, src, n, TO_DEVICE | FROM_DEVICE, h, 0);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    return copy_async(dst, src, n, TO_DEVICE | FROM_DEVICE, h, 1);
}

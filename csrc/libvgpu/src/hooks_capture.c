/* Stream capture hooks (capture.h): cuStreamBeginCapture* count the captures that are active, so
 * that the launch hooks ask the driver about their stream only then; cuStreamEndCapture* end one
 * and retire the ledger charges of the allocations made under it (hooks_mem.c). A capture begun
 * through a door not hooked here (cuStreamBeginCaptureToGraph) is not counted: its launches are
 * charged as without capture, and its end lowers the count no further than 0. */
#include "capture.h"

#include "ledger.h"
#include "vgpu_state.h"

#define STREAM_PER_THREAD ((CUstream)0x2)

int vgpu_active_captures;

CUstream vgpu_capture_stream(CUstream s, int ptsz) { return s == NULL && ptsz ? STREAM_PER_THREAD : s; }

int vgpu_stream_is_capturing(CUstream s, int ptsz)
{
    static void *slot;
    CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *) = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuStreamIsCapturing");
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing != NULL && is_capturing(vgpu_capture_stream(s, ptsz), &status) == CUDA_SUCCESS &&
           status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The newest cuStreamGetCaptureInfo ABI the driver has; every one starts (stream, status, id) and
 * takes NULL for the rest. */
int vgpu_stream_capture(CUstream s, unsigned long long *id)
{
    static void *v3_slot, *v2_slot, *v1_slot;
    CUresult (*v3)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **,
                   const void **, size_t *) = vgpu_real_cached(&v3_slot, VGPU_LIB_CUDA, "cuStreamGetCaptureInfo_v3");
    CUresult (*v2)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, const CUgraphNode **, size_t *) =
        vgpu_real_cached(&v2_slot, VGPU_LIB_CUDA, "cuStreamGetCaptureInfo_v2");
    CUresult (*v1)(CUstream, CUstreamCaptureStatus *, cuuint64_t *) =
        vgpu_real_cached(&v1_slot, VGPU_LIB_CUDA, "cuStreamGetCaptureInfo");
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t got = 0;
    CUresult r = v3   ? v3(s, &status, &got, NULL, NULL, NULL, NULL)
                 : v2 ? v2(s, &status, &got, NULL, NULL, NULL)
                 : v1 ? v1(s, &status, &got)
                      : CUDA_ERROR_NOT_FOUND;
    if (r != CUDA_SUCCESS)
        return -1;
    *id = got;
    return (int)status;
}

static CUresult begun(CUresult r)
{
    if (r == CUDA_SUCCESS)
        __atomic_add_fetch(&vgpu_active_captures, 1, __ATOMIC_RELAXED);
    return r;
}

VGPU_EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
    HOOK_REAL_CU(cuStreamBeginCapture);
    return begun(real(s));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
    HOOK_REAL_CU(cuStreamBeginCapture_ptsz);
    return begun(real(s));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    HOOK_REAL_CU(cuStreamBeginCapture_v2);
    return begun(real(s, mode));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
    HOOK_REAL_CU(cuStreamBeginCapture_v2_ptsz);
    return begun(real(s, mode));
}

/* One fewer active capture (never below 0: see the top). */
static void ended(void)
{
    int n = __atomic_load_n(&vgpu_active_captures, __ATOMIC_RELAXED);
    while (n > 0 && !__atomic_compare_exchange_n(&vgpu_active_captures, &n, n - 1, 0, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED))
        ;
}

/* The capture's id is read before the driver ends it. Once the stream no longer captures (the end
 * succeeded, or failed on an invalidated capture, which ends it too), the capture is over: one fewer
 * active, and its charges retired. */
static CUresult end_capture(CUresult (*real)(CUstream, CUgraph *), CUstream s, CUgraph *graph, int ptsz)
{
    CUstream stream = vgpu_capture_stream(s, ptsz);
    unsigned long long id = 0;
    int was = vgpu_stream_capture(stream, &id);
    CUresult r = real(s, graph);
    if ((was == CU_STREAM_CAPTURE_STATUS_ACTIVE || was == CU_STREAM_CAPTURE_STATUS_INVALIDATED) &&
        !vgpu_stream_is_capturing(stream, 0)) {
        vgpu_ledger_retire_capture(id);
        ended();
    }
    return r;
}

VGPU_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    HOOK_REAL_CU(cuStreamEndCapture);
    return end_capture(real, s, graph, 0);
}

VGPU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *graph)
{
    HOOK_REAL_CU(cuStreamEndCapture_ptsz);
    return end_capture(real, s, graph, 1);
}

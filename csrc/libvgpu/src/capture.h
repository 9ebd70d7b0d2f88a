/* Stream capture as the library sees it (reference §1 "graphs", §2 CAPTURE): a process-wide count
 * of the captures begun through the hooks and not yet ended, and the questions the launch and
 * allocation hooks ask the real driver about a stream. */
#ifndef VGPU_CAPTURE_H
#define VGPU_CAPTURE_H

#include "core_abi.h"
#include "real.h"

/* cuda.h's CUstreamCaptureStatus and CUstreamCaptureMode (the values read or passed on here). */
typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

/* Captures begun (cuStreamBeginCapture*) and not ended (cuStreamEndCapture*) in this process. */
VGPU_HIDDEN extern int vgpu_active_captures;

/* The stream handle a non-_ptsz call means: NULL through a _ptsz entry point is the per-thread
 * default stream. */
VGPU_HIDDEN CUstream vgpu_capture_stream(CUstream s, int ptsz);

/* Whether `s` (of a _ptsz entry point when `ptsz`) is capturing, per the real cuStreamIsCapturing;
 * 0 when the driver cannot say (the caller then acts as without capture). */
VGPU_HIDDEN int vgpu_stream_is_capturing(CUstream s, int ptsz);

/* A launch on `s` that only records a graph node: not charged (the graph launch that runs it is).
 * The driver is asked only while a capture is active, so the unthrottled path costs one load. */
static inline int vgpu_launch_is_captured(CUstream s, int ptsz)
{
    return __atomic_load_n(&vgpu_active_captures, __ATOMIC_RELAXED) > 0 && vgpu_stream_is_capturing(s, ptsz);
}

/* The capture state of `s` (already vgpu_capture_stream'd), per the real cuStreamGetCaptureInfo:
 * its CUstreamCaptureStatus (its id in *id when ACTIVE or INVALIDATED), or -1 when the driver
 * cannot say. */
VGPU_HIDDEN int vgpu_stream_capture(CUstream s, unsigned long long *id);

#endif

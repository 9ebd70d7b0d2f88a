/* Allocation, free and memory-info hooks (reference §1 table, §2). Every allocation on a limited
 * device is decided and performed under the device's lock file, so the next allocator's NVML
 * read sees it; a refusal is CUDA_ERROR_OUT_OF_MEMORY before the driver is called. A device that
 * is not the container's (VGPU_IS_FOREIGN: the library is configured and does not know its UUID)
 * gets no memory at all, and its views are CUDA_ERROR_INVALID_DEVICE. */
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "capture.h"
#include "cuda_abi.h"
#include "hooks_pool.h"
#include "ledger.h"
#include "memlimit.h"
#include "vgpu_state.h"

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);

static int limited(int host) { return host >= 0 && vgpu_cfg()->dev[host].mem_limit > 0; }

/* A device that is not the container's: logged (once per device), to be refused. */
static int refused(int host)
{
    if (!VGPU_IS_FOREIGN(host))
        return 0;
    vgpu_log_refused_cudev(host);
    return 1;
}

static int oversold(int host)
{
    const struct vgpu_device_cfg *d = &vgpu_cfg()->dev[host];
    return d->mem_ratio > 1.0 || d->mem_oversold;
}

/* The admission of `bytes` on `host`: VGPU_PASS (unlimited), or the decision with the lock in *fd.
 * A refusal has released the lock already; a device not the container's is always refused. */
#define VGPU_PASS 2
static int admit(int host, unsigned long long bytes, int *fd)
{
    *fd = -1;
    if (vgpu_devlock_held())
        return VGPU_PASS; /* nested inside an allocation already decided */
    if (refused(host))
        return -1;
    if (!limited(host))
        return VGPU_PASS;
    *fd = vgpu_devlock(host);
    if (*fd < 0)
        return -1;
    int d = vgpu_mem_decide(host, bytes);
    if (d < 0) {
        vgpu_devunlock(*fd);
        *fd = -1;
    }
    return d;
}

/* Return from the hook with `call` made under the admission of `bytes` on `host` (the lock
 * released after it), or CUDA_ERROR_OUT_OF_MEMORY when refused. */
#define RETURN_ADMITTED(host, bytes, call)                                                     \
    do {                                                                                       \
        int fd_;                                                                               \
        if (admit((host), (bytes), &fd_) < 0)                                                  \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                   \
        CUresult r_ = (call);                                                                  \
        vgpu_devunlock(fd_);                                                                   \
        return r_;                                                                             \
    } while (0)


/* Managed memory standing in for device memory past real_memory: charged to the ledger, as every
 * managed allocation on a limited device (cuMemAllocManaged below). */
static CUresult alloc_oversold(CUdeviceptr *dptr, size_t bytes, int host)
{
    __typeof__(&cuMemAllocManaged) managed = REAL_CU(cuMemAllocManaged);
    if (managed == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = managed(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    if (r == CUDA_SUCCESS) {
        vgpu_ledger_add(host, bytes);
        vgpu_ledger_track(*dptr, bytes, host);
    }
    return r;
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    HOOK_REAL_CU(cuMemAlloc_v2);
    int host = vgpu_host_of_current(), fd;
    int d = admit(host, bytesize, &fd);
    if (d < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = d == 1 ? alloc_oversold(dptr, bytesize, host) : real(dptr, bytesize);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && d == 0 && oversold(host))
        r = alloc_oversold(dptr, bytesize, host); /* the driver is out: spill to managed memory */
    vgpu_devunlock(fd);
    return r;
}

VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    HOOK_REAL_CU(cuMemAlloc);
    RETURN_ADMITTED(vgpu_host_of_current(), bytesize, real(dptr, bytesize));
}

/* The driver pads each row to its pitch alignment (at most 512 bytes on current GPUs). */
static unsigned long long pitch_bytes(unsigned long long width, unsigned long long height)
{
    return ((width + 511) & ~511ULL) * (height ? height : 1);
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                        unsigned int elem)
{
    HOOK_REAL_CU(cuMemAllocPitch_v2);
    RETURN_ADMITTED(vgpu_host_of_current(), pitch_bytes(width, height), real(dptr, pitch, width, height, elem));
}

VGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                     unsigned int height, unsigned int elem)
{
    HOOK_REAL_CU(cuMemAllocPitch);
    RETURN_ADMITTED(vgpu_host_of_current(), pitch_bytes(width, height), real(dptr, pitch, width, height, elem));
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    HOOK_REAL_CU(cuMemAllocManaged);
    int host = vgpu_host_of_current(), fd;
    if (admit(host, bytesize, &fd) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytesize, flags);
    /* NVML does not show managed memory as the process's device memory: the ledger carries it
     * (UVA) until it is freed, so the next allocation of any process of the container sees it. */
    if (r == CUDA_SUCCESS && limited(host)) {
        vgpu_ledger_add(host, bytesize);
        vgpu_ledger_track(*dptr, bytesize, host);
    }
    vgpu_devunlock(fd);
    return r;
}

/* The host device of `stream`: its context's device (cuStreamGetCtx, then that context pushed for
 * cuCtxGetDevice), or the current context's for the NULL / legacy (0x1) / per-thread (0x2) handles
 * and when the driver cannot tell. */
static int host_of_stream(CUstream stream)
{
    uintptr_t handle = (uintptr_t)stream;
    if (handle <= 2)
        return vgpu_host_of_current();
    static void *s_get, *s_push, *s_pop;
    CUresult (*get_ctx)(CUstream, CUcontext *) = vgpu_real_cached(&s_get, VGPU_LIB_CUDA, "cuStreamGetCtx");
    CUresult (*push)(CUcontext) = vgpu_real_cached(&s_push, VGPU_LIB_CUDA, "cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) = vgpu_real_cached(&s_pop, VGPU_LIB_CUDA, "cuCtxPopCurrent_v2");
    CUcontext ctx, old;
    if (get_ctx == NULL || push == NULL || pop == NULL || get_ctx(stream, &ctx) != CUDA_SUCCESS ||
        push(ctx) != CUDA_SUCCESS)
        return vgpu_host_of_current();
    int host = vgpu_host_of_current();
    pop(&old);
    return host;
}

/* The host device of a from-pool allocation: the pool's device (its memory), or the stream's for
 * a pool the library never saw. */
static int host_of_pool(CUmemoryPool pool, CUstream stream)
{
    CUdevice dev;
    return vgpu_pool_device(pool, &dev) ? vgpu_host_of_cudev(dev) : host_of_stream(stream);
}

/* A stream-ordered allocation being admitted. NVML shows its memory only once the stream's earlier
 * work has ended, so on a limited device it is charged to the ledger right after the driver call,
 * under the lock: on a capturing stream until the capture ends (CAPTURE: hooks_capture.c retires
 * it, or an earlier cuMemFreeAsync), else until the hook, off the lock, has synchronized the stream
 * (ASYNC_BRIDGE). A stream whose capture state the driver cannot tell is charged nothing: a sync
 * could invalidate a capture it is part of. Past real_memory it is never managed memory. */
struct ordered {
    int fd, host, charge;
    CUstream stream; /* as a non-_ptsz call names it */
    unsigned long long capture;
};

/* Before the driver call: the admission (-1: refused, the lock released), the capture state. */
static int ordered_admit(int host, unsigned long long bytes, CUstream stream, int ptsz, struct ordered *o)
{
    *o = (struct ordered){.fd = -1, .host = host, .charge = -1, .stream = vgpu_capture_stream(stream, ptsz)};
    int d = admit(host, bytes, &o->fd);
    if (d < 0)
        return -1;
    if (d != VGPU_PASS)
        o->charge = vgpu_stream_capture(o->stream, &o->capture);
    return 0;
}

/* After it: the charge, the lock released, then the bridge. */
static CUresult ordered_done(struct ordered *o, CUresult r, const CUdeviceptr *dptr, unsigned long long bytes)
{
    int capturing = o->charge == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    int bridge = o->charge == CU_STREAM_CAPTURE_STATUS_NONE && o->fd >= 0;
    int charged = r == CUDA_SUCCESS && (capturing || bridge) && vgpu_ledger_add(o->host, bytes) == 0;
    if (charged && capturing)
        vgpu_ledger_track_capture(*dptr, bytes, o->host, o->capture);
    vgpu_devunlock(o->fd);
    if (charged && bridge) {
        static void *slot;
        CUresult (*sync)(CUstream) = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuStreamSynchronize");
        if (sync != NULL)
            sync(o->stream);
        vgpu_ledger_sub(o->host, bytes);
    }
    return r;
}

#define ASYNC_ALLOC(name, ptsz)                                                                \
    VGPU_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream stream)             \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        struct ordered o;                                                                      \
        if (ordered_admit(host_of_stream(stream), bytesize, stream, ptsz, &o) < 0)             \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                   \
        return ordered_done(&o, real(dptr, bytesize, stream), dptr, bytesize);                 \
    }
ASYNC_ALLOC(cuMemAllocAsync, 0)
ASYNC_ALLOC(cuMemAllocAsync_ptsz, 1)

#define POOL_ALLOC(name, ptsz)                                                                 \
    VGPU_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        struct ordered o;                                                                      \
        if (ordered_admit(host_of_pool(pool, stream), bytesize, stream, ptsz, &o) < 0)        \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                   \
        return ordered_done(&o, real(dptr, bytesize, pool, stream), dptr, bytesize);           \
    }
POOL_ALLOC(cuMemAllocFromPoolAsync, 0)
POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, 1)

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    HOOK_REAL_CU(cuMemCreate);
    /* Only device memory counts, on the device the properties name (host locations carry no
     * device id). */
    int host = prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                   ? vgpu_host_of_cudev(prop->location.id)
                   : VGPU_HOST_NONE;
    RETURN_ADMITTED(host, size, real(handle, size, prop, flags));
}

/* --- frees: retire ledger charges ------------------------------------------------------------- */

static void retire(CUdeviceptr dptr)
{
    int host;
    unsigned long long bytes;
    if (vgpu_ledger_untrack(dptr, &host, &bytes))
        vgpu_ledger_sub(host, bytes);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    HOOK_REAL_CU(cuMemFree_v2);
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS)
        retire(dptr);
    return r;
}

VGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    vgpu_init();
    __typeof__(&cuMemFree) real = REAL_CU(cuMemFree);
    return real == NULL ? CUDA_ERROR_NOT_FOUND : real(dptr);
}

#define ASYNC_FREE(name)                                                                       \
    VGPU_EXPORT CUresult name(CUdeviceptr dptr, CUstream stream)                               \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        CUresult r = real(dptr, stream);                                                       \
        if (r == CUDA_SUCCESS)                                                                 \
            retire(dptr);                                                                      \
        return r;                                                                              \
    }
ASYNC_FREE(cuMemFreeAsync)
ASYNC_FREE(cuMemFreeAsync_ptsz)

/* --- arrays: pre-check with the size the descriptor implies ---------------------------------- */

static unsigned long long format_bytes(int format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats; the rarer packed/block formats are no larger per channel */
    }
}

static unsigned long long array_bytes(unsigned long long w, unsigned long long h, unsigned long long d,
                                      unsigned int channels, int format)
{
    return (w ? w : 1) * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * format_bytes(format);
}

/* An array hook: `depth` is the descriptor's depth expression (1 for the 2D descriptors). */
#define ARRAY_CREATE(name, desc_t, depth)                                                      \
    VGPU_EXPORT CUresult name(CUarray *arr, const desc_t *desc)                                \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        if (desc == NULL)                                                                      \
            return real(arr, desc);                                                            \
        RETURN_ADMITTED(vgpu_host_of_current(),                                                \
                        array_bytes(desc->Width, desc->Height, depth, desc->NumChannels, desc->Format), \
                        real(arr, desc));                                                      \
    }
ARRAY_CREATE(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1)
ARRAY_CREATE(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1, 1)
ARRAY_CREATE(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, desc->Depth)
ARRAY_CREATE(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1, desc->Depth)

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int levels)
{
    HOOK_REAL_CU(cuMipmappedArrayCreate);
    if (desc == NULL)
        return real(arr, desc, levels);
    /* Every level halves each dimension: the chain is at most 4/3 of level 0 for 2D (8/7 3D). */
    unsigned long long base = array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels, desc->Format);
    unsigned long long bytes = levels > 1 ? base + base / 3 : base;
    RETURN_ADMITTED(vgpu_host_of_current(), bytes, real(arr, desc, levels));
}

/* --- pinned host memory: post-check ---------------------------------------------------------- */

/* After the driver pinned host memory: is the container now over its limit on the current
 * device (pinned pages cost device-visible resources the driver accounts to the context)? */
static int over_after(int host)
{
    unsigned long long used, vmem;
    return vgpu_usage(host, &used, &vmem) == 0 && used + vmem > vgpu_cfg()->dev[host].total_memory;
}

VGPU_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    HOOK_REAL_CU(cuMemHostAlloc);
    int host = vgpu_host_of_current();
    if (vgpu_devlock_held())
        return real(pp, bytesize, flags);
    if (refused(host))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!limited(host))
        return real(pp, bytesize, flags);
    int fd = vgpu_devlock(host);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(pp, bytesize, flags);
    if (r == CUDA_SUCCESS && over_after(host)) {
        static void *slot;
        CUresult (*free_host)(void *) = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuMemFreeHost");
        if (free_host != NULL)
            free_host(*pp);
        *pp = NULL;
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_devunlock(fd);
    return r;
}

static CUresult host_register(CUresult (*real)(void *, size_t, unsigned int), void *p, size_t bytesize,
                              unsigned int flags)
{
    int host = vgpu_host_of_current();
    if (vgpu_devlock_held())
        return real(p, bytesize, flags);
    if (refused(host))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!limited(host))
        return real(p, bytesize, flags);
    int fd = vgpu_devlock(host);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(p, bytesize, flags);
    if (r == CUDA_SUCCESS && over_after(host)) {
        static void *slot;
        CUresult (*unregister)(void *) = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuMemHostUnregister");
        if (unregister != NULL)
            unregister(p);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    vgpu_devunlock(fd);
    return r;
}

VGPU_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
    vgpu_init();
    __typeof__(&cuMemHostRegister_v2) real = REAL_CU(cuMemHostRegister_v2);
    return real == NULL ? CUDA_ERROR_NOT_FOUND : host_register(real, p, bytesize, flags);
}

/* cuMemHostRegister (CUDA 4.0) already took size_t; _v2 (6.5) keeps the signature. */
VGPU_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int flags)
{
    vgpu_init();
    __typeof__(&cuMemHostRegister) real = REAL_CU(cuMemHostRegister);
    return real == NULL ? CUDA_ERROR_NOT_FOUND : host_register(real, p, bytesize, flags);
}

/* --- limited views --------------------------------------------------------------------------- */

/* Replace (free, total) by the container's view of `host`; never an error. */
static void view(int host, unsigned long long *free_, unsigned long long *total)
{
    if (!limited(host))
        return;
    const struct vgpu_device_cfg *d = &vgpu_cfg()->dev[host];
    unsigned long long used, vmem, t, f;
    if (vgpu_usage(host, &used, &vmem) < 0) {
        /* Usage unknown: the limit still caps what is shown. */
        vgpu_limited_view(d->mem_limit, oversold(host), *total, 0, &t, &f);
        *free_ = *free_ < f ? *free_ : f;
        *total = t;
        return;
    }
    vgpu_limited_view(d->mem_limit, oversold(host), *total, used + vmem, &t, &f);
    *total = t;
    *free_ = f;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    HOOK_REAL_CU(cuMemGetInfo_v2);
    int host = vgpu_host_of_current();
    if (refused(host))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(free_, total);
    if (r != CUDA_SUCCESS || free_ == NULL || total == NULL)
        return r;
    unsigned long long f = *free_, t = *total;
    view(host, &f, &t);
    *free_ = f;
    *total = t;
    return r;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free_, unsigned int *total)
{
    vgpu_init();
    __typeof__(&cuMemGetInfo) real = REAL_CU(cuMemGetInfo);
    __typeof__(&cuMemGetInfo_v2) real2 = REAL_CU(cuMemGetInfo_v2);
    int host = vgpu_host_of_current();
    if (refused(host))
        return CUDA_ERROR_INVALID_DEVICE;
    if (real == NULL || real2 == NULL)
        return real == NULL ? CUDA_ERROR_NOT_FOUND : real(free_, total);
    size_t f, t;
    CUresult r = real2(&f, &t);
    if (r != CUDA_SUCCESS || free_ == NULL || total == NULL)
        return r != CUDA_SUCCESS ? r : real(free_, total);
    unsigned long long ff = f, tt = t;
    view(host, &ff, &tt);
    *free_ = ff > UINT_MAX ? UINT_MAX : (unsigned int)ff;
    *total = tt > UINT_MAX ? UINT_MAX : (unsigned int)tt;
    return r;
}

static unsigned long long total_view(int host, unsigned long long physical)
{
    if (!limited(host))
        return physical;
    unsigned long long t, f;
    vgpu_limited_view(vgpu_cfg()->dev[host].mem_limit, oversold(host), physical, 0, &t, &f);
    return t;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    HOOK_REAL_CU(cuDeviceTotalMem_v2);
    int host = vgpu_host_of_cudev(dev);
    if (refused(host))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes != NULL)
        *bytes = total_view(host, *bytes);
    return r;
}

VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    HOOK_REAL_CU(cuDeviceTotalMem);
    int host = vgpu_host_of_cudev(dev);
    if (refused(host))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes != NULL) {
        unsigned long long t = total_view(host, *bytes);
        *bytes = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return r;
}

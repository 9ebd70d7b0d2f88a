/*
 * fakecuda memory: every allocation is charged to the device in the shared state (so NVML lists it
 * under this pid) and refused with CUDA_ERROR_OUT_OF_MEMORY when the device has not that much free.
 *
 * Device pointers are addresses in a range no host mapping uses. A device allocation gets host bytes
 * behind it on its first copy (fc_mem_bytes: an anonymous MAP_NORESERVE mapping of its size, so only
 * the pages written use memory); one never copied to or from has none, however large.
 * Managed and host (pinned) memory are real host memory (anonymous mappings) and are not charged
 * to the device: NVML does not count them on a real GPU either. A stream-ordered allocation is
 * reserved at once but shown by NVML only when its stream's earlier work ends; on a capturing stream
 * it is an address and nothing else (the real driver records a memory node, and the fake's graphs
 * have none). Stream-ordered frees take effect at once. Allocations belong to the current context,
 * and go with it.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fakecuda.h"

enum kind { K_DEVICE, K_MANAGED, K_HOST, K_REGISTERED, K_ARRAY, K_VMM, K_RESERVE };

typedef struct {
    uint64_t key;     /* device pointer, host address, or handle */
    uint64_t bytes;   /* size of the range */
    uint64_t charged; /* device bytes charged in the shared state */
    int ordinal;      /* device charged, -1 if none */
    enum kind kind;
    CUcontext ctx; /* owner; NULL: the process (VMM handles, reservations) */
    void *backing; /* K_DEVICE: host bytes once copied to or from, else NULL */
} alloc;

static pthread_mutex_t mem_mutex = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;
static size_t n_allocs, cap_allocs;

#define GRANULARITY (2ull << 20)
#define VA_BASE 0x300000000ull /* device virtual addresses, like the driver's UVA ranges */
#define VA_V1_BASE 0x10000000ull /* 32-bit CUdeviceptr_v1 allocations */
#define VA_V1_END 0xF0000000ull
static uint64_t next_va = VA_BASE, next_va_v1 = VA_V1_BASE, next_handle = 0x1000;

static uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

static int remember(alloc a) {
    if (n_allocs == cap_allocs) {
        size_t cap = cap_allocs ? cap_allocs * 2 : 256;
        alloc *grown = realloc(allocs, cap * sizeof *grown);
        if (grown == NULL) return -1;
        allocs = grown;
        cap_allocs = cap;
    }
    allocs[n_allocs++] = a;
    return 0;
}

static alloc *find(uint64_t key, int kind_mask) {
    for (size_t i = n_allocs; i-- > 0;)
        if (allocs[i].key == key && (kind_mask & (1 << allocs[i].kind))) return &allocs[i];
    return NULL;
}

static void release(alloc *a) {
    if (a->charged) fs_mem_free((unsigned)fc_nvml_index(a->ordinal), a->charged);
    if (a->kind == K_MANAGED || a->kind == K_HOST) munmap((void *)(uintptr_t)a->key, a->bytes);
    if (a->backing) munmap(a->backing, a->bytes);
    *a = allocs[--n_allocs];
}

void fc_mem_drop_context(CUcontext ctx) {
    pthread_mutex_lock(&mem_mutex);
    for (size_t i = n_allocs; i-- > 0;)
        if (allocs[i].ctx == ctx) release(&allocs[i]);
    pthread_mutex_unlock(&mem_mutex);
}

/* Charge `bytes` to device `ordinal` (NVML shows them from `visible_ns`) and record the range; OOM
 * when the device is full. */
static CUresult charge_at(uint64_t key, uint64_t bytes, uint64_t charged, int ordinal, enum kind kind,
                          CUcontext ctx, uint64_t visible_ns) {
    if (charged && fs_mem_alloc_at((unsigned)fc_nvml_index(ordinal), charged, visible_ns) < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (remember((alloc){key, bytes, charged, ordinal, kind, ctx, NULL}) < 0) {
        if (charged) fs_mem_free((unsigned)fc_nvml_index(ordinal), charged);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static CUresult charge(uint64_t key, uint64_t bytes, uint64_t charged, int ordinal, enum kind kind, CUcontext ctx) {
    return charge_at(key, bytes, charged, ordinal, kind, ctx, 0);
}

/* A device allocation of `bytes` charging `charged` of them, shown by NVML from `visible_ns`. */
static CUresult device_alloc_at(CUdeviceptr *dptr, uint64_t bytes, uint64_t charged, int ordinal, int v1,
                                uint64_t visible_ns) {
    if (dptr == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mutex);
    uint64_t *next = v1 ? &next_va_v1 : &next_va;
    uint64_t span = round_up(bytes, GRANULARITY);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (!v1 || *next + span <= VA_V1_END) {
        rc = charge_at(*next, bytes, charged, ordinal, K_DEVICE, fc_current(), visible_ns);
        if (rc == CUDA_SUCCESS) {
            *dptr = *next;
            *next += span + GRANULARITY; /* a guard gap between allocations */
        }
    }
    pthread_mutex_unlock(&mem_mutex);
    return rc;
}

static CUresult device_alloc(CUdeviceptr *dptr, uint64_t bytes, int ordinal, int v1) {
    return device_alloc_at(dptr, bytes, bytes, ordinal, v1, 0);
}

static CUresult current_alloc(CUdeviceptr *dptr, uint64_t bytes, int v1) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    return rc != CUDA_SUCCESS ? rc : device_alloc(dptr, bytes, ordinal, v1);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return current_alloc(dptr, bytesize, 0); }

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CUdeviceptr p = 0;
    CUresult rc = current_alloc(dptr ? &p : NULL, bytesize, 1);
    if (rc == CUDA_SUCCESS) *dptr = (CUdeviceptr_v1)p;
    return rc;
}

/* Rows padded to 512 bytes; element size 4, 8 or 16. */
static CUresult pitch_alloc(CUdeviceptr *dptr, uint64_t *pitch, uint64_t width, uint64_t height, unsigned int elem,
                            int v1) {
    if (pitch == NULL || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = round_up(width, 512);
    CUresult rc = current_alloc(dptr, p * height, v1);
    if (rc == CUDA_SUCCESS) *pitch = p;
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                   unsigned int ElementSizeBytes) {
    uint64_t pitch;
    CUresult rc = pitch_alloc(dptr, pPitch ? &pitch : NULL, WidthInBytes, Height, ElementSizeBytes, 0);
    if (rc == CUDA_SUCCESS) *pPitch = pitch;
    return rc;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                unsigned int Height, unsigned int ElementSizeBytes) {
    CUdeviceptr p = 0;
    uint64_t pitch;
    CUresult rc = pitch_alloc(dptr ? &p : NULL, pPitch ? &pitch : NULL, WidthInBytes, Height, ElementSizeBytes, 1);
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned int)pitch;
    }
    return rc;
}

static CUresult free_device(CUdeviceptr dptr) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&mem_mutex);
    alloc *a = find(dptr, 1 << K_DEVICE | 1 << K_MANAGED);
    if (a) release(a);
    pthread_mutex_unlock(&mem_mutex);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return free_device(dptr); }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { return free_device(dptr); }

enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };

/* Host memory the device can use: not charged to the device (NVML does not count it either). */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (dptr == NULL || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mem_mutex);
    rc = charge((uintptr_t)m, bytesize, 0, ordinal, K_MANAGED, fc_current());
    pthread_mutex_unlock(&mem_mutex);
    if (rc != CUDA_SUCCESS) munmap(m, bytesize);
    else *dptr = (uintptr_t)m;
    return rc;
}

/* ---- stream-ordered allocation: reserved at once, shown by NVML when the stream gets there ---- */

struct CUmemPoolHandle_st {
    uint32_t tag;
    int ordinal;
};
static struct CUmemPoolHandle_st default_pools[FAKE_MAX_GPUS];

static CUresult async_alloc(CUdeviceptr *dptr, size_t bytes, CUstream stream, int ptsz, CUmemoryPool pool) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    fc_stream_ref s;
    if ((rc = fc_stream(stream, ptsz, &s)) != CUDA_SUCCESS) return rc;
    int ordinal = s.ordinal;
    if (pool) {
        if (pool->tag != TAG_POOL) return CUDA_ERROR_INVALID_VALUE;
        ordinal = pool->ordinal;
    }
    if (fc_stream_capturing(&s)) /* a memory node of the graph: nothing allocated yet */
        return device_alloc_at(dptr, bytes, 0, ordinal, 0, 0);
    return device_alloc_at(dptr, bytes, bytes, ordinal, 0, fc_stream_done(stream, ptsz, &s));
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return async_alloc(dptr, bytesize, hStream, 0, NULL);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    return async_alloc(dptr, bytesize, hStream, 1, NULL);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return async_alloc(dptr, bytesize, hStream, 0, pool);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return async_alloc(dptr, bytesize, hStream, 1, pool);
}

static CUresult async_free(CUdeviceptr dptr, CUstream stream, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_ready();
    if (rc == CUDA_SUCCESS) rc = fc_stream(stream, ptsz, &s);
    return rc != CUDA_SUCCESS ? rc : free_device(dptr);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return async_free(dptr, hStream, 0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return async_free(dptr, hStream, 1); }

/* CUmemLocation and the leading fields of CUmemPoolProps / CUmemAllocationProp (cuda.h). */
typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1, HOST = 2, HOST_NUMA = 3, HOST_NUMA_CURRENT = 4 */
    int id;
} CUmemLocation;
typedef struct {
    int allocType; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");

enum { LOC_DEVICE = 1, LOC_HOST = 2, LOC_HOST_NUMA_CURRENT = 4, ALLOC_PINNED = 1 };

/* A device's default pool; its current pool (cuDeviceSetMemPool) is that unless set. */
static CUmemoryPool current_pools[FAKE_MAX_GPUS];

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (fc_nvml_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    default_pools[dev] = (struct CUmemPoolHandle_st){TAG_POOL, dev};
    *pool = &default_pools[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    CUresult rc = cuDeviceGetDefaultMemPool(pool, dev);
    if (rc == CUDA_SUCCESS && current_pools[dev] != NULL) *pool = current_pools[dev];
    return rc;
}

/* The pool must be local to the device, as the real driver requires. */
EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (fc_nvml_index(dev) < 0) return CUDA_ERROR_INVALID_DEVICE;
    if (pool == NULL || pool->tag != TAG_POOL || pool->ordinal != dev) return CUDA_ERROR_INVALID_VALUE;
    current_pools[dev] = pool;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (pool == NULL || props == NULL || props->allocType != ALLOC_PINNED || props->location.type != LOC_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (fc_nvml_index(props->location.id) < 0) return CUDA_ERROR_INVALID_DEVICE;
    struct CUmemPoolHandle_st *p = malloc(sizeof *p);
    if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct CUmemPoolHandle_st){TAG_POOL, props->location.id};
    *pool = p;
    return CUDA_SUCCESS;
}

/* A default pool cannot be destroyed; a device's current pool falls back to its default one. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    if (pool == NULL || pool->tag != TAG_POOL) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < FAKE_MAX_GPUS; i++)
        if (pool == &default_pools[i]) return CUDA_ERROR_INVALID_VALUE;
    if (current_pools[pool->ordinal] == pool) current_pools[pool->ordinal] = NULL;
    pool->tag = 0;
    free(pool);
    return CUDA_SUCCESS;
}

/* CUDA 13's location forms: device locations and pinned pools only (the fake has no host or
 * managed pools: CUDA_ERROR_NOT_SUPPORTED). */
static CUresult pool_location(const CUmemLocation *location, int type) {
    if (location == NULL) return CUDA_ERROR_INVALID_VALUE;
    return location->type == LOC_DEVICE && type == ALLOC_PINNED ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, int type) {
    CUresult rc = pool_location(location, type);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetDefaultMemPool(pool, location->id);
}

EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, int type) {
    CUresult rc = pool_location(location, type);
    return rc != CUDA_SUCCESS ? rc : cuDeviceGetMemPool(pool, location->id);
}

/* ---- info ---- */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (free_bytes == NULL || total_bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    unsigned int dev = (unsigned)fc_nvml_index(ordinal);
    uint64_t total = fs_mem_total(dev), used = fs_mem_reserved(dev);
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return CUDA_SUCCESS;
}

/* The 32-bit form: each saturates at 4 GiB - 1. */
EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    size_t f, t;
    CUresult rc = cuMemGetInfo_v2(free_bytes ? &f : NULL, total_bytes ? &t : NULL);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = f > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)f;
        *total_bytes = t > 0xFFFFFFFFu ? 0xFFFFFFFFu : (unsigned int)t;
    }
    return rc;
}

/* ---- virtual memory management ---- */

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option) {
    (void)option;
    if (granularity == NULL || prop == NULL) return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

/* Physical memory: charged to the device for CU_MEM_LOCATION_TYPE_DEVICE, uncharged for host. */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 || size % GRANULARITY != 0 ||
        prop->type != ALLOC_PINNED || prop->location.type < LOC_DEVICE || prop->location.type > LOC_HOST_NUMA_CURRENT)
        return CUDA_ERROR_INVALID_VALUE;
    int device = prop->location.type == LOC_DEVICE;
    if (device && fc_nvml_index(prop->location.id) < 0) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mem_mutex);
    uint64_t h = next_handle++;
    rc = charge(h, size, device ? size : 0, device ? prop->location.id : -1, K_VMM, NULL);
    pthread_mutex_unlock(&mem_mutex);
    if (rc == CUDA_SUCCESS) *handle = h;
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    pthread_mutex_lock(&mem_mutex);
    alloc *a = find(handle, 1 << K_VMM);
    if (a) release(a);
    pthread_mutex_unlock(&mem_mutex);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                    unsigned long long flags) {
    (void)addr; /* a hint */
    if (ptr == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mutex);
    uint64_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    uint64_t start = round_up(next_va, align);
    CUresult rc = charge(start, size, 0, -1, K_RESERVE, NULL);
    if (rc == CUDA_SUCCESS) {
        next_va = start + size + GRANULARITY;
        *ptr = start;
    }
    pthread_mutex_unlock(&mem_mutex);
    return rc;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    pthread_mutex_lock(&mem_mutex);
    alloc *a = find(ptr, 1 << K_RESERVE);
    int ok = a && a->bytes == size;
    if (ok) release(a);
    pthread_mutex_unlock(&mem_mutex);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Checks the handle and that [ptr, ptr+size) lies in a reservation; maps nothing. */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                         unsigned long long flags) {
    if (flags != 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mutex);
    alloc *h = find(handle, 1 << K_VMM);
    int ok = h != NULL && offset + size <= h->bytes;
    int inside = 0;
    for (size_t i = 0; ok && i < n_allocs; i++)
        if (allocs[i].kind == K_RESERVE && ptr >= allocs[i].key && ptr + size <= allocs[i].key + allocs[i].bytes)
            inside = 1;
    pthread_mutex_unlock(&mem_mutex);
    if (h == NULL) return CUDA_ERROR_INVALID_HANDLE;
    return ok && inside ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count) {
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- arrays: device memory sized from the descriptor ---- */

struct CUarray_st {
    uint32_t tag;
};
struct CUmipmappedArray_st {
    uint32_t tag;
};

static uint64_t format_bytes(int format) {
    switch (format) {
    case 0x01: case 0x08: return 1; /* UNSIGNED_INT8, SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2; /* UNSIGNED_INT16, SIGNED_INT16, HALF */
    case 0x03: case 0x0a: case 0x20: return 4; /* UNSIGNED_INT32, SIGNED_INT32, FLOAT */
    default: return 0;
    }
}

static CUresult array_alloc(void **out, uint32_t tag, uint64_t w, uint64_t h, uint64_t d, int format,
                            unsigned int channels, unsigned int levels) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t elem = format_bytes(format);
    if (out == NULL || w == 0 || elem == 0 || (channels != 1 && channels != 2 && channels != 4) || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    for (unsigned int l = 0; l < levels; l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        bytes += lw * lh * ld * elem * channels;
    }
    struct CUarray_st *a = malloc(sizeof *a);
    if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    a->tag = tag;
    pthread_mutex_lock(&mem_mutex);
    rc = charge((uintptr_t)a, bytes, bytes, ordinal, K_ARRAY, fc_current());
    pthread_mutex_unlock(&mem_mutex);
    if (rc != CUDA_SUCCESS) free(a);
    else *out = a;
    return rc;
}

static CUresult array_free(void *a, uint32_t tag) {
    if (a == NULL || *(uint32_t *)a != tag) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&mem_mutex);
    alloc *rec = find((uintptr_t)a, 1 << K_ARRAY);
    if (rec) release(rec);
    pthread_mutex_unlock(&mem_mutex);
    if (rec == NULL) return CUDA_ERROR_INVALID_HANDLE;
    *(uint32_t *)a = 0;
    free(a);
    return CUDA_SUCCESS;
}

typedef struct {
    size_t Width, Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;
typedef struct {
    unsigned int Width, Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v2;
typedef struct {
    unsigned int Width, Height, Depth;
    int Format;
    unsigned int NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;
_Static_assert(sizeof(CUDA_ARRAY_DESCRIPTOR_v2) == 24, "CUDA_ARRAY_DESCRIPTOR_v2 layout");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR_v2) == 40, "CUDA_ARRAY3D_DESCRIPTOR_v2 layout");

EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v2 *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc((void **)arr, TAG_ARRAY, d->Width, d->Height, 1, d->Format, d->NumChannels, 1);
}
EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc((void **)arr, TAG_ARRAY, d->Width, d->Height, 1, d->Format, d->NumChannels, 1);
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v2 *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc((void **)arr, TAG_ARRAY, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1);
}
EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc((void **)arr, TAG_ARRAY, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1);
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v2 *d,
                                       unsigned int numLevels) {
    if (d == NULL) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc((void **)arr, TAG_MIPMAP, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, numLevels);
}
EXPORT CUresult cuArrayDestroy(CUarray arr) { return array_free(arr, TAG_ARRAY); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) { return array_free(arr, TAG_MIPMAP); }

/* ---- host memory: real, page-locked in name only, not charged to the device ---- */

enum { HOSTALLOC_FLAGS = 1 | 2 | 4, HOSTREGISTER_FLAGS = 1 | 2 | 4 | 8 };

static CUresult host_alloc(void **pp, size_t bytes, unsigned int flags) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (pp == NULL || bytes == 0 || (flags & ~HOSTALLOC_FLAGS)) return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mem_mutex);
    rc = charge((uintptr_t)m, bytes, 0, ordinal, K_HOST, fc_current());
    pthread_mutex_unlock(&mem_mutex);
    if (rc != CUDA_SUCCESS) munmap(m, bytes);
    else *pp = m;
    return rc;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) { return host_alloc(pp, bytesize, Flags); }
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) { return host_alloc(pp, bytesize, 0); }
EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize) { return host_alloc(pp, bytesize, 0); }

EXPORT CUresult cuMemFreeHost(void *p) {
    pthread_mutex_lock(&mem_mutex);
    alloc *a = find((uintptr_t)p, 1 << K_HOST);
    if (a) release(a);
    pthread_mutex_unlock(&mem_mutex);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    int ordinal;
    CUresult rc = fc_current_ordinal(&ordinal);
    if (rc != CUDA_SUCCESS) return rc;
    if (p == NULL || bytesize == 0 || (Flags & ~HOSTREGISTER_FLAGS)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mutex);
    rc = find((uintptr_t)p, 1 << K_REGISTERED) ? CUDA_ERROR_INVALID_VALUE
                                                : charge((uintptr_t)p, bytesize, 0, ordinal, K_REGISTERED, fc_current());
    pthread_mutex_unlock(&mem_mutex);
    return rc;
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags) {
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

EXPORT CUresult cuMemHostUnregister(void *p) {
    pthread_mutex_lock(&mem_mutex);
    alloc *a = find((uintptr_t)p, 1 << K_REGISTERED);
    if (a) release(a);
    pthread_mutex_unlock(&mem_mutex);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Unified addressing: the device sees host memory at its host address. */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
    if (pdptr == NULL || p == NULL || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mem_mutex);
    int ok = find((uintptr_t)p, 1 << K_HOST | 1 << K_REGISTERED) != NULL;
    pthread_mutex_unlock(&mem_mutex);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (uintptr_t)p;
    return CUDA_SUCCESS;
}

/* ---- host bytes of device ranges, for copies ---- */

CUresult fc_mem_bytes(CUdeviceptr ptr, size_t bytes, void **host) {
    enum { RANGES = 1 << K_DEVICE | 1 << K_MANAGED | 1 << K_HOST | 1 << K_REGISTERED };
    pthread_mutex_lock(&mem_mutex);
    alloc *a = NULL;
    for (size_t i = 0; i < n_allocs && a == NULL; i++)
        if ((RANGES & (1 << allocs[i].kind)) && ptr >= allocs[i].key && bytes <= allocs[i].bytes &&
            ptr - allocs[i].key <= allocs[i].bytes - bytes)
            a = &allocs[i];
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (a && a->kind == K_DEVICE && a->backing == NULL) {
        void *m = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) rc = CUDA_ERROR_OUT_OF_MEMORY;
        else a->backing = m;
    }
    if (rc == CUDA_SUCCESS)
        *host = a->kind == K_DEVICE ? (char *)a->backing + (ptr - a->key) : (void *)(uintptr_t)ptr;
    pthread_mutex_unlock(&mem_mutex);
    return rc;
}

/* ---- managed memory hints: checked, then no-ops (nothing migrates in the fake) ---- */

int fc_mem_is_managed(CUdeviceptr ptr, size_t bytes) {
    pthread_mutex_lock(&mem_mutex);
    int found = 0;
    for (size_t i = 0; i < n_allocs && !found; i++)
        found = allocs[i].kind == K_MANAGED && ptr >= allocs[i].key && bytes <= allocs[i].bytes &&
                ptr - allocs[i].key <= allocs[i].bytes - bytes;
    pthread_mutex_unlock(&mem_mutex);
    return found;
}

#define CU_DEVICE_CPU (-1)

/* A location that may hold managed pages: a device, or the host (types 2..4). */
static CUresult check_location(CUmemLocation loc) {
    if (loc.type == LOC_DEVICE) return fc_nvml_index(loc.id) < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
    return loc.type >= LOC_HOST && loc.type <= LOC_HOST_NUMA_CURRENT ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUmemLocation device_location(int device) {
    return device == CU_DEVICE_CPU ? (CUmemLocation){LOC_HOST, 0} : (CUmemLocation){LOC_DEVICE, device};
}

/* CUmem_advise: SET/UNSET of READ_MOSTLY, PREFERRED_LOCATION, ACCESSED_BY (1..6). */
static CUresult advise(CUdeviceptr ptr, size_t count, int advice, CUmemLocation loc) {
    CUresult rc = fc_ready();
    if (rc != CUDA_SUCCESS) return rc;
    if (advice < 1 || advice > 6 || count == 0 || !fc_mem_is_managed(ptr, count)) return CUDA_ERROR_INVALID_VALUE;
    return check_location(loc);
}

EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, int advice, CUdevice device) {
    return advise(devPtr, count, advice, device_location(device));
}
EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, int advice, CUmemLocation location) {
    return advise(devPtr, count, advice, location);
}

static CUresult prefetch(CUdeviceptr ptr, size_t count, CUmemLocation loc, unsigned int flags, CUstream h, int ptsz) {
    fc_stream_ref s;
    CUresult rc = fc_ready();
    if (rc == CUDA_SUCCESS) rc = fc_stream(h, ptsz, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (flags != 0 || count == 0 || !fc_mem_is_managed(ptr, count)) return CUDA_ERROR_INVALID_VALUE;
    return check_location(loc);
}

EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    return prefetch(devPtr, count, device_location(dstDevice), 0, hStream, 0);
}
EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream) {
    return prefetch(devPtr, count, device_location(dstDevice), 0, hStream, 1);
}
EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                      CUstream hStream) {
    return prefetch(devPtr, count, location, flags, hStream, 0);
}
EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                           unsigned int flags, CUstream hStream) {
    return prefetch(devPtr, count, location, flags, hStream, 1);
}

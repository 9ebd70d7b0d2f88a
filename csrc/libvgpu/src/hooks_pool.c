/* Memory pools and their devices. A pool lives on one device (its location), and with peer access
 * a stream on GPU 0 may allocate from a pool on GPU 1: that memory is GPU 1's. The driver API has
 * no way to ask a pool its device before CUDA 13.2 (CU_MEMPOOL_ATTR_LOCATION_ID), so the hooks
 * that hand out or create a pool record its device in a small table, and cuMemPoolDestroy forgets
 * it. Host pools are not device memory: recorded as nothing. */
#include <pthread.h>
#include <stdint.h>

#include "cuda_abi.h"
#include "hooks_pool.h"
#include "vgpu_state.h"

/* Pools a process uses are few (a default pool per device, a handful created); when the table is
 * full, a new pool is not recorded and its allocations fall back to the stream's device. */
#define MAX_POOLS 256
static struct {
    CUmemoryPool pool; /* NULL: a free slot */
    CUdevice dev;
} pools[MAX_POOLS];
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;

/* Record `pool` on CUDA device `dev`, or forget it when dev < 0 (a host pool at the address of a
 * destroyed one must not keep its device). */
static void record(CUmemoryPool pool, CUdevice dev)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pools_lock);
    int slot = -1;
    for (int i = 0; i < MAX_POOLS; i++) {
        if (pools[i].pool == pool) {
            slot = i;
            break;
        }
        if (slot < 0 && pools[i].pool == NULL)
            slot = i;
    }
    if (slot >= 0) {
        pools[slot].pool = dev >= 0 ? pool : NULL;
        pools[slot].dev = dev;
    }
    pthread_mutex_unlock(&pools_lock);
}

static void record_location(CUmemoryPool pool, const CUmemLocation *loc)
{
    record(pool, loc != NULL && loc->type == CU_MEM_LOCATION_TYPE_DEVICE ? loc->id : -1);
}

int vgpu_pool_device(CUmemoryPool pool, CUdevice *dev)
{
    int found = 0;
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < MAX_POOLS && !found; i++) {
        if (pools[i].pool == pool && pool != NULL) {
            *dev = pools[i].dev;
            found = 1;
        }
    }
    pthread_mutex_unlock(&pools_lock);
    return found;
}

void vgpu_pools_after_fork(void)
{
    pthread_mutex_init(&pools_lock, NULL); /* a thread of the parent may have held it */
    for (int i = 0; i < MAX_POOLS; i++)
        pools[i].pool = NULL;
}

VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    HOOK_REAL_CU(cuMemPoolCreate);
    CUresult r = real(pool, props);
    if (r == CUDA_SUCCESS && pool != NULL && props != NULL)
        record_location(*pool, &props->location);
    return r;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    HOOK_REAL_CU(cuMemPoolDestroy);
    CUresult r = real(pool);
    if (r == CUDA_SUCCESS)
        record(pool, -1);
    return r;
}

/* The default or current pool of a device: on that device (a device's current pool must be local
 * to it, cuDeviceSetMemPool). Setting a pool as current needs no hook: the pool was recorded when
 * it was created or handed out, and an imported pool cannot be set (nor allocated from). */
#define DEVICE_POOL(name)                                                                      \
    VGPU_EXPORT CUresult name(CUmemoryPool *pool, CUdevice dev)                                \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        CUresult r = real(pool, dev);                                                          \
        if (r == CUDA_SUCCESS && pool != NULL)                                                 \
            record(*pool, dev);                                                                \
        return r;                                                                              \
    }
DEVICE_POOL(cuDeviceGetDefaultMemPool)
DEVICE_POOL(cuDeviceGetMemPool)

/* CUDA 13's location-based forms: a device location gives the device, any other none. */
#define LOCATION_POOL(name)                                                                    \
    VGPU_EXPORT CUresult name(CUmemoryPool *pool, CUmemLocation *location, int type)           \
    {                                                                                          \
        HOOK_REAL_CU(name);                                                                    \
        CUresult r = real(pool, location, type);                                               \
        if (r == CUDA_SUCCESS && pool != NULL)                                                 \
            record_location(*pool, location);                                                  \
        return r;                                                                              \
    }
LOCATION_POOL(cuMemGetDefaultMemPool)
LOCATION_POOL(cuMemGetMemPool)

/* The device of each memory pool the process obtained through the driver (hooks_pool.c), so a
 * from-pool allocation is charged to the pool's device, not the stream's. */
#ifndef VGPU_HOOKS_POOL_H
#define VGPU_HOOKS_POOL_H

#include "cuda_abi.h"
#include "real.h"

/* The CUDA ordinal of `pool` in *dev: 1 when the library saw the pool's device, else 0 (a pool it
 * never saw, or a host pool). */
VGPU_HIDDEN int vgpu_pool_device(CUmemoryPool pool, CUdevice *dev);

/* In a forked child: forget every pool (CUDA handles do not survive fork). */
VGPU_HIDDEN void vgpu_pools_after_fork(void);

#endif

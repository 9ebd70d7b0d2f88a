/* The core (SM) limit inside libvgpu-control.so: the charging API the launch hooks call. Settings
 * come from the environment once (core_env.h); each limited device's bucket (per process, or the
 * container's in sm_node.config with CUDA_SM_SHARED_BUCKET) is set up at its first charge, and the
 * watcher threads (one per CORE_WATCH_PER_THREAD devices) start then, never at load. */
#ifndef VGPU_CORE_LIMIT_H
#define VGPU_CORE_LIMIT_H

#include <stdbool.h>

#include "real.h"

/* Charges `blocks` to host device `host_index`'s bucket, waiting (10 ms steps) while it is
 * negative. Returns at once when the device is not limited or out of range. */
VGPU_HIDDEN void vgpu_core_charge(int host_index, unsigned long long blocks);

/* Whether any device has a core limit (the hooks skip the device lookup when none has). */
VGPU_HIDDEN bool vgpu_core_any_limit(void);

/* Charges the device of the current context. */
VGPU_HIDDEN void vgpu_core_charge_current(unsigned long long blocks);

#endif

/* The memory limit (reference §2): the per-device allocation lock, the container's usage, the
 * decision, and the limited views. */
#ifndef VGPU_MEMLIMIT_H
#define VGPU_MEMLIMIT_H

#include "real.h"

/* Take host device `host`'s allocation lock: its thread mutex and the OFD lock on its lock file
 * (10 s timeout). A token for vgpu_devunlock (>= 0), or -1 when not taken. */
VGPU_HIDDEN int vgpu_devlock(int host);
VGPU_HIDDEN void vgpu_devunlock(int token);
/* Whether this thread holds an allocation lock (a nested call from inside the driver). */
VGPU_HIDDEN int vgpu_devlock_held(void);
/* A forked child: drop the inherited lock files (they share the parent's OFD locks). */
VGPU_HIDDEN void vgpu_devlock_after_fork(void);

/* The container's usage of host device `host`: Σ NVML usedGpuMemory of its processes + the
 * ledger. 0 on success, -1 when it cannot be known (the caller fails closed). */
VGPU_HIDDEN int vgpu_usage(int host, unsigned long long *nvml_used, unsigned long long *ledger_used);

/* The decision for `req` more bytes on `host` (lock held): 0 fits, 1 fits only as managed memory
 * past real_memory (oversubscribed), -1 does not fit / unknown usage. */
VGPU_HIDDEN int vgpu_mem_decide(int host, unsigned long long req);

/* Limited view (pure): what to report for a device with `limit` (0 = none), the physical total
 * and the container's `used`. */
VGPU_HIDDEN void vgpu_limited_view(unsigned long long limit, int oversold, unsigned long long physical,
                                   unsigned long long used, unsigned long long *total, unsigned long long *free_);

/* Which membership rule matched first in one NVML process list (cgroup modes with the open kernel
 * bit: host PIDs by cgroup, else our namespace's PIDs by namespaces and maps). */
enum vgpu_rule { VGPU_RULE_NONE, VGPU_RULE_CGROUP, VGPU_RULE_NAMESPACES };

/* The membership test over one NVML process list: start each list at {mode, VGPU_RULE_NONE}. */
struct vgpu_membership {
    long mode;
    enum vgpu_rule rule;
};

/* Whether PID `pid` (as NVML reports it) belongs to this container under m->mode. -1: cannot tell. */
VGPU_HIDDEN int vgpu_pid_is_ours(struct vgpu_membership *m, unsigned int pid);

#endif

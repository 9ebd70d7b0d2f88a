/* The container-wide token bucket (CUDA_SM_SHARED_BUCKET) in sm_node.config (layout and protocol:
 * vgpu_files.h). Every process of the container maps the file MAP_SHARED and charges the same
 * `tokens`; one process, the holder of an OFD write lock on sm_node.lock, samples NVML and runs the
 * controller (the kernel drops the lock when it dies and the next watcher takes over); refills are
 * elected by a CAS on the device's last_refill_ns, so at most one per VGPU_SM_REFILL_PERIOD_NS however
 * many processes try. */
#ifndef VGPU_CORE_SHARED_H
#define VGPU_CORE_SHARED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vgpu_files.h"

struct core_shared {
    int fd;                   /* sm_node.config */
    int lock_fd;              /* sm_node.lock, held (OFD write lock) while we are the sampler; -1 if not */
    char lock_path[256];
    struct vgpu_sm_node *node;
};

/* Opens `dir`/sm_node.config (dir created if missing), creating it or rebuilding a bad header in place
 * under an OFD write lock on byte 0, and maps it. 0, or -1 with err filled and nothing left open. */
int core_shared_open(struct core_shared *s, const char *dir, char *err, size_t cap);

void core_shared_close(struct core_shared *s);

/* Device `d`'s bucket, initialised on its first use in the container (ceiling, limits, a first
 * share, a full first refill); NULL when d is out of range. */
struct vgpu_sm_device *core_shared_device(struct core_shared *s, int d, int64_t ceiling, int hard, int soft,
                                          int64_t first_share);

/* Whether this process is the sampler: keeps the lock if held, else tries to take it (non-blocking).
 * On success the pid and heartbeat are written by core_shared_heartbeat(). */
bool core_shared_try_sampler(struct core_shared *s);

/* The sampler's heartbeat: sampler_pid = getpid(), sampler_heartbeat_ns = now_ns. */
void core_shared_heartbeat(struct core_shared *s, uint64_t now_ns);

/* Whether the sampler's heartbeat is older than `stale_ns` (or there never was one). */
bool core_shared_sampler_stale(const struct core_shared *s, uint64_t now_ns, uint64_t stale_ns);

/* The elected refill: when now_ns - last_refill_ns >= VGPU_SM_REFILL_PERIOD_NS and our CAS of
 * last_refill_ns to now_ns wins, adds `add` capped at `cap` and returns true (*after: the count after
 * it); else false, nothing changed. */
bool core_shared_refill(struct vgpu_sm_device *dev, uint64_t now_ns, int64_t add, int64_t cap, int64_t *after);

/* After fork: the child drops its copy of the sampler lock's descriptor (the parent still holds the
 * lock through its own; the child must not keep it alive past the parent's death). */
void core_shared_after_fork(struct core_shared *s);

#endif

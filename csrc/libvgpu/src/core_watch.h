/* The watcher of the core limit: each device's cycle (~100 ms) samples the container's SM
 * utilisation, runs the controller and refills the bucket; in shared-bucket mode only the elected
 * sampler does, and the others refill the last share when the sampler's heartbeat is stale. The
 * sampler and the clock are injected, so one cycle is testable without NVML or a thread; the thread
 * serves up to CORE_WATCH_PER_THREAD devices. */
#ifndef VGPU_CORE_WATCH_H
#define VGPU_CORE_WATCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core_ctl.h"
#include "core_shared.h"

#define CORE_WATCH_PERIOD_NS 100000000ull
#define CORE_WATCH_PER_THREAD 4
#define CORE_WATCH_STALE_NS 1000000000ull /* a sampler silent this long is presumed stuck */

struct core_watch_ops {
    /* The container's SM % (sm + 0.85 (enc + dec)) and the busiest other process's SM % on host
     * device `host` over the last second: 0, or -1 when there is no sample (NOT_FOUND, no process). */
    int (*sample)(void *ctx, int host, double *util, double *external);
    uint64_t (*now_ns)(void *ctx);
    void *ctx;
    /* Optional: told each sampled cycle's outcome (the library logs it at LOGGER_LEVEL detail). */
    void (*cycle)(void *ctx, int host, double util, double target, int64_t add, int64_t level);
};

struct core_device {
    int host;
    int64_t *tokens;                 /* the local bucket, or the shared device's `tokens` */
    int64_t local_tokens;
    struct vgpu_sm_device *shared;   /* NULL: this process's own bucket */
    struct core_ctl ctl;
    int64_t after_refill;            /* the count right after our last refill */
    uint64_t last_ns;                /* our last cycle */
    double last_util;                /* what the last cycle measured (negative: nothing) */
};

/* Sets up a device's state: the controller for hard/soft and the ceiling, and the first refill
 * (one cycle of the first rate). `shared`: the device's bucket in sm_node.config, or NULL. */
void core_device_init(struct core_device *d, int host, int hard, int soft, int64_t ceiling,
                      struct vgpu_sm_device *shared, uint64_t now_ns);

/* One watcher cycle for one device; `sh` is the shared file (NULL in per-process mode). */
void core_watch_cycle(struct core_device *d, struct core_shared *sh, const struct core_watch_ops *ops);

struct core_watcher {
    pthread_t thread;
    struct core_device *devs[CORE_WATCH_PER_THREAD];
    int count;
    struct core_shared *sh;
    const struct core_watch_ops *ops;
    volatile int stop;
};

/* Starts the thread running every CORE_WATCH_PERIOD_NS a cycle for each of w->devs. 0 or an errno. */
int core_watcher_start(struct core_watcher *w);

/* Stops and joins it (tests; the library's watchers live as long as the process). */
void core_watcher_stop(struct core_watcher *w);

#endif

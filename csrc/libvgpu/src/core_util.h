/* The container's SM utilisation from NVML's per-process samples (pure): per PID the mean of its
 * samples' sm + 0.85 x (enc + dec), summed over the container's PIDs; the busiest other PID's SM %
 * is the contention the soft limit watches. A PID whose membership cannot be told counts as
 * another's (contention, never our share). */
#ifndef VGPU_CORE_UTIL_H
#define VGPU_CORE_UTIL_H

#include <stddef.h>

#define CORE_UTIL_CODEC_WEIGHT 0.85

struct core_proc_sample {
    unsigned int pid;
    unsigned int sm, enc, dec; /* percent */
};

/* 1 ours, 0 not, -1 cannot tell. */
typedef int (*core_pid_is_ours)(void *ctx, unsigned int pid);

void core_util_sum(const struct core_proc_sample *s, size_t n, core_pid_is_ours is_ours, void *ctx, double *ours,
                   double *external);

#endif

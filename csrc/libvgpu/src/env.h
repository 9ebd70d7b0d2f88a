/* The library's configuration from the container environment (reference §4): getenv, else the
 * container's /proc/1/environ; `NAME_<i>` first, then `NAME`; present but empty = off.
 * <i> is the host NVML index (0..15). */
#ifndef VGPU_ENV_H
#define VGPU_ENV_H

#include <stddef.h>

#include "real.h"

#include "vgpu_files.h"
#define VGPU_UUID_MAX 96

struct vgpu_device_cfg {
    char uuid[VGPU_UUID_MAX];        /* "GPU-...", "" when position i is not ours */
    unsigned long long mem_limit;    /* bytes; 0 = not limited */
    double mem_ratio;                /* CUDA_MEM_RATIO_<i>; > 1 oversubscribes */
    int mem_oversold;                /* CUDA_MEM_OVERSOLD_<i> */
    unsigned long long total_memory; /* what the container sees (the limit) */
    unsigned long long real_memory;  /* physical bytes it may take before managed memory: limit/ratio */
    int from_file;                   /* 1: not in the env; adopted from vgpu.config (a hot-plugged device) */
    int hard_core, soft_core;        /* from_file only: its core limits (the env's are in core_env) */
};

struct vgpu_env_config {
    struct vgpu_device_cfg dev[VGPU_MAX_DEVICES];
    long mode; /* MANAGER_COMPATIBILITY_MODE */
    int vmem_node_enabled;
};

typedef const char *(*vgpu_env_lookup)(void *ctx, const char *name);

/* Parse everything (pure given `lookup`). 0, or -1 with err naming the bad variable. */
VGPU_HIDDEN int vgpu_config_parse(struct vgpu_env_config *cfg, vgpu_env_lookup lookup, void *ctx, char *err, size_t cap);

/* "8192m" -> bytes (k/m/g/t binary, optional trailing 'b'/'i'; plain number = bytes). 0, or -1. */
VGPU_HIDDEN int vgpu_parse_size(const char *s, unsigned long long *out);

/* getenv, else /proc/1/environ (read once per process); NULL when absent. */
VGPU_HIDDEN const char *vgpu_env(void *ctx, const char *name);


#endif

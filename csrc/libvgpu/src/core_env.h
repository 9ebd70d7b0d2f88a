/* The core limit's settings from the container environment (reference §4): CUDA_CORE_LIMIT_<i>,
 * CUDA_CORE_SOFT_LIMIT_<i> (percent; `NAME_<i>` first, then `NAME`; empty, <= 0 or >= 100 = off)
 * and CUDA_SM_SHARED_BUCKET (true/TRUE/1). Pure given the lookup. */
#ifndef VGPU_CORE_ENV_H
#define VGPU_CORE_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "vgpu_files.h"

#define CORE_ENV_LIMIT "CUDA_CORE_LIMIT"
#define CORE_ENV_SOFT_LIMIT "CUDA_CORE_SOFT_LIMIT"
#define CORE_ENV_SHARED_BUCKET "CUDA_SM_SHARED_BUCKET"
/* The reference's controller settings: this library has one controller of its own (core_ctl.h),
 * so a value there changes nothing and is named in a warning. */
#define CORE_ENV_UNUSED {"CUDA_SM_CONTROLLER", "CUDA_SM_USAGE_THRESHOLD", "CUDA_SM_DELTA_RAMP_FLOOR_DIVISOR"}
#define CORE_ENV_UNUSED_PREFIX "CUDA_SM_AIMD_"

struct core_env {
    int hard[VGPU_MAX_DEVICES]; /* percent, 0 = not limited */
    int soft[VGPU_MAX_DEVICES]; /* percent, 0 = none (also when not above hard) */
    bool shared_bucket;
};

typedef const char *(*core_env_lookup)(void *ctx, const char *name);

/* 0, or -1 with err naming the variable whose value is not a whole number (nothing else changes:
 * *out is only written on success). */
int core_env_parse(struct core_env *out, core_env_lookup lookup, void *ctx, char *err, size_t cap);

#endif

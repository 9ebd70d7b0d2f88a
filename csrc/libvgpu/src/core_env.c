/* Parsing of the core limit's environment (see core_env.h). */
#include "core_env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `NAME_<i>` if present (even empty), else `NAME`. */
static const char *per_device(core_env_lookup lookup, void *ctx, const char *name, int i, char *used, size_t cap)
{
    snprintf(used, cap, "%s_%d", name, i);
    const char *v = lookup(ctx, used);
    if (v)
        return v;
    snprintf(used, cap, "%s", name);
    return lookup(ctx, name);
}

/* Percent in 1..99, 0 for off (absent, empty, <= 0, >= 100); -1 for a malformed value. */
static int percent(const char *v)
{
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    while (*end == ' ' || *end == '\n')
        end++;
    if (errno || *end || end == v)
        return -1;
    return n <= 0 || n >= 100 ? 0 : (int)n;
}

int core_env_parse(struct core_env *out, core_env_lookup lookup, void *ctx, char *err, size_t cap)
{
    struct core_env e = {0};
    char used[64];
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const char *v = per_device(lookup, ctx, CORE_ENV_LIMIT, i, used, sizeof(used));
        if ((e.hard[i] = percent(v)) < 0) {
            snprintf(err, cap, "%s=%s is not a whole percent", used, v);
            return -1;
        }
        v = per_device(lookup, ctx, CORE_ENV_SOFT_LIMIT, i, used, sizeof(used));
        if ((e.soft[i] = percent(v)) < 0) {
            snprintf(err, cap, "%s=%s is not a whole percent", used, v);
            return -1;
        }
        if (e.hard[i] == 0 || e.soft[i] <= e.hard[i])
            e.soft[i] = 0;
    }
    const char *b = lookup(ctx, CORE_ENV_SHARED_BUCKET);
    e.shared_bucket = b && (strcmp(b, "true") == 0 || strcmp(b, "TRUE") == 0 || strcmp(b, "1") == 0);
    *out = e;
    return 0;
}

/* See env.h. */
#include "env.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "vgpu_paths.h"

int vgpu_parse_size(const char *s, unsigned long long *out)
{
    if (s == NULL || !isdigit((unsigned char)s[0]))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return -1;
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case '\0': break;
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: return -1;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (shift && (*end == 'b' || *end == 'B'))
        end++;
    if (*end != '\0' || (shift && v > (~0ULL >> shift)))
        return -1;
    *out = v << shift;
    return 0;
}

/* NAME_<i> if present (even empty), else NAME. */
static const char *indexed(vgpu_env_lookup lookup, void *ctx, const char *name, int i)
{
    char key[96];
    snprintf(key, sizeof(key), "%s_%d", name, i);
    const char *v = lookup(ctx, key);
    return v != NULL ? v : lookup(ctx, name);
}

static int parse_bool(const char *v)
{
    return v != NULL && (strcmp(v, "true") == 0 || strcmp(v, "TRUE") == 0 || strcmp(v, "True") == 0 ||
                         strcmp(v, "1") == 0);
}

/* Position i of a comma list into dst ("" when absent or not a GPU UUID). */
static void list_item(const char *list, int i, char *dst, size_t cap)
{
    dst[0] = '\0';
    for (int k = 0; list != NULL && *list; k++) {
        const char *comma = strchr(list, ',');
        size_t n = comma ? (size_t)(comma - list) : strlen(list);
        while (n > 0 && isspace((unsigned char)*list)) {
            list++;
            n--;
        }
        while (n > 0 && isspace((unsigned char)list[n - 1]))
            n--;
        if (k == i) {
            if (n < cap && n > 4 && strncmp(list, "GPU-", 4) == 0)
                snprintf(dst, cap, "%.*s", (int)n, list);
            return;
        }
        if (comma == NULL)
            return;
        list = comma + 1;
    }
}

/* NVIDIA's container runtime values of NVIDIA_VISIBLE_DEVICES that are not device lists: `void`
 * and `none` (no GPU through the runtime; vgpud sets `void`: devices come from CDI), empty, and
 * `all` (every GPU of the node to the runtime: never "every GPU is ours"). */
static int runtime_keyword(const char *v)
{
    while (isspace((unsigned char)*v))
        v++;
    size_t n = strlen(v);
    while (n > 0 && isspace((unsigned char)v[n - 1]))
        n--;
    static const char *const words[] = {"void", "none", "all", NULL};
    for (int i = 0; words[i] != NULL; i++)
        if (n == strlen(words[i]) && strncasecmp(v, words[i], n) == 0)
            return 1;
    return n == 0;
}

static int visible_devices(struct vgpu_env_config *cfg, vgpu_env_lookup lookup, void *ctx)
{
    int any = 0;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        char key[64];
        snprintf(key, sizeof(key), "MANAGER_VISIBLE_DEVICE_%d", i);
        const char *v = lookup(ctx, key);
        if (v != NULL && v[0] != '\0') {
            list_item(v, 0, cfg->dev[i].uuid, sizeof(cfg->dev[i].uuid));
            any = 1;
        }
    }
    if (any)
        return 0;
    const char *list = lookup(ctx, "MANAGER_VISIBLE_DEVICES");
    if (list == NULL || list[0] == '\0') {
        list = lookup(ctx, "NVIDIA_VISIBLE_DEVICES"); /* the last resort */
        if (list != NULL && runtime_keyword(list))
            return 0; /* no devices from it */
    }
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        list_item(list, i, cfg->dev[i].uuid, sizeof(cfg->dev[i].uuid));
    return 0;
}

int vgpu_config_parse(struct vgpu_env_config *cfg, vgpu_env_lookup lookup, void *ctx, char *err, size_t cap)
{
    memset(cfg, 0, sizeof(*cfg));
    visible_devices(cfg, lookup, ctx);
    const char *mode = lookup(ctx, "MANAGER_COMPATIBILITY_MODE");
    if (mode != NULL && mode[0] != '\0') {
        char *end;
        cfg->mode = strtol(mode, &end, 10);
        if (!isdigit((unsigned char)mode[0]) || *end != '\0') {
            snprintf(err, cap, "MANAGER_COMPATIBILITY_MODE=%.64s is not a non-negative integer", mode);
            return -1;
        }
    }
    cfg->vmem_node_enabled = parse_bool(lookup(ctx, "VMEMORY_NODE_ENABLED"));
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        struct vgpu_device_cfg *d = &cfg->dev[i];
        const char *lim = indexed(lookup, ctx, "CUDA_MEM_LIMIT", i);
        if (lim != NULL && lim[0] != '\0' && vgpu_parse_size(lim, &d->mem_limit) < 0) {
            snprintf(err, cap, "CUDA_MEM_LIMIT_%d (or CUDA_MEM_LIMIT)=%.64s is not a size like 8192m", i, lim);
            return -1;
        }
        d->mem_ratio = 1.0;
        const char *ratio = indexed(lookup, ctx, "CUDA_MEM_RATIO", i);
        if (ratio != NULL && ratio[0] != '\0') {
            char *end;
            double r = strtod(ratio, &end);
            if (*end != '\0' || !(r >= 1.0) || !isfinite(r)) {
                snprintf(err, cap, "CUDA_MEM_RATIO_%d (or CUDA_MEM_RATIO)=%.64s is not a number >= 1", i, ratio);
                return -1;
            }
            d->mem_ratio = r;
        }
        d->mem_oversold = parse_bool(indexed(lookup, ctx, "CUDA_MEM_OVERSOLD", i));
        d->total_memory = d->mem_limit;
        d->real_memory = d->mem_ratio > 1.0 ? (unsigned long long)((double)d->mem_limit / d->mem_ratio) : d->mem_limit;
    }
    return 0;
}

/* --- getenv, else /proc/1/environ -------------------------------------------------------------- */

static char *pid1_env;
static size_t pid1_len;
static pthread_once_t pid1_once = PTHREAD_ONCE_INIT;

static void read_pid1(void)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/1/environ", vgpu_path(VGPU_PATH_PROC));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf != NULL) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            char *bigger = cap < (1 << 24) ? realloc(buf, cap * 2 + 1) : NULL;
            if (bigger == NULL)
                break;
            buf = bigger;
            cap *= 2;
        }
    }
    close(fd);
    if (buf != NULL)
        buf[n] = '\0';
    pid1_env = buf;
    pid1_len = n;
}

const char *vgpu_env(void *ctx, const char *name)
{
    (void)ctx;
    const char *v = getenv(name);
    if (v != NULL)
        return v;
    pthread_once(&pid1_once, read_pid1);
    size_t n = strlen(name);
    for (size_t off = 0; pid1_env != NULL && off < pid1_len;) {
        const char *e = pid1_env + off;
        size_t len = strnlen(e, pid1_len - off);
        if (len > n && strncmp(e, name, n) == 0 && e[n] == '=')
            return e + n + 1;
        off += len + 1;
    }
    return NULL;
}


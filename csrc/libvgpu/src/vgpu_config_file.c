/* See vgpu_config_file.h. */
#include "vgpu_config_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core_env.h"
#include "cuda_abi.h"
#include "nvml_abi.h"
#include "real.h"
#include "vgpu_paths.h"
#include "vgpu_state.h"

static void put_text(char *dst, size_t cap, const char *src)
{
    memset(dst, 0, cap);
    if (src != NULL)
        memcpy(dst, src, strnlen(src, cap)); /* NUL-padded, not necessarily terminated when full */
}

static int flag(const char *v)
{
    return v != NULL && (strcmp(v, "true") == 0 || strcmp(v, "TRUE") == 0 || strcmp(v, "1") == 0);
}

int vgpu_config_build(struct vgpu_config *out, const struct vgpu_env_config *cfg, vgpu_env_lookup lookup, void *ctx,
                      int cuda_version, const char *driver_version, char *err, size_t cap)
{
    struct core_env core;
    if (core_env_parse(&core, lookup, ctx, err, cap) < 0)
        return -1;
    memset(out, 0, sizeof(*out));
    out->magic = VGPU_CONFIG_MAGIC;
    out->layout = VGPU_CONFIG_LAYOUT;
    out->size = VGPU_CONFIG_STRUCT_SIZE;
    out->count = VGPU_MAX_DEVICES;
    out->cuda_version_major = cuda_version / 1000;
    out->cuda_version_minor = (cuda_version % 1000) / 10;
    put_text(out->driver_version, sizeof(out->driver_version), driver_version);
    put_text(out->pod_uid, sizeof(out->pod_uid), lookup(ctx, "VGPU_POD_UID"));
    put_text(out->pod_name, sizeof(out->pod_name), lookup(ctx, "VGPU_POD_NAME"));
    put_text(out->pod_namespace, sizeof(out->pod_namespace), lookup(ctx, "VGPU_POD_NAMESPACE"));
    put_text(out->container_name, sizeof(out->container_name), lookup(ctx, "VGPU_CONTAINER_NAME"));
    put_text(out->reg_uuid, sizeof(out->reg_uuid), lookup(ctx, "MANAGER_CLIENT_REGISTER_UUID"));
    out->compatibility_mode = (int32_t)cfg->mode;
    out->sm_watcher = flag(lookup(ctx, "EXTERNAL_SM_WATCHER_ENABLED"));
    out->vmem_node = cfg->vmem_node_enabled;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_device_cfg *d = &cfg->dev[i];
        struct vgpu_config_device *o = &out->devices[i];
        if (d->uuid[0] == '\0' || d->from_file) /* an adopted (hot-plugged) device is vgpud's entry */
            continue;
        put_text(o->uuid, sizeof(o->uuid), d->uuid);
        o->total_memory = d->total_memory;
        o->real_memory = d->real_memory;
        o->memory_limit = d->mem_limit > 0;
        o->memory_oversold = d->mem_ratio > 1.0 || d->mem_oversold;
        o->hard_core = core.hard[i];
        o->soft_core = core.soft[i];
        o->core_limit = core.hard[i] > 0;
        o->hard_limit = core.hard[i] > 0 && core.soft[i] == 0;
        o->activate = 1;
    }
    return 0;
}

static int lock_byte0(int fd, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    int rc;
    while ((rc = fcntl(fd, F_OFD_SETLKW, &fl)) < 0 && errno == EINTR)
        ;
    if (rc < 0 && errno == EINVAL)
        while ((rc = fcntl(fd, F_SETLKW, &fl)) < 0 && errno == EINTR)
            ;
    return rc;
}

static int header_valid(int fd)
{
    struct vgpu_config head;
    ssize_t n = pread(fd, &head, 16, 0);
    return n == 16 && head.magic == VGPU_CONFIG_MAGIC && head.layout == VGPU_CONFIG_LAYOUT &&
           head.size == VGPU_CONFIG_STRUCT_SIZE && head.count == VGPU_MAX_DEVICES;
}

int vgpu_config_read(struct vgpu_config *out)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/vgpu.config", vgpu_path(VGPU_PATH_CONFIG_DIR));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && lock_byte0(fd, F_RDLCK) == 0;
    if (ok) {
        ok = header_valid(fd) && pread(fd, out, sizeof(*out), 0) == (ssize_t)sizeof(*out);
        lock_byte0(fd, F_UNLCK);
    }
    close(fd);
    return ok ? 0 : -1;
}

/* A percent the core limit accepts (core_env.c): 1..99, else 0 (off). */
static int percent(int32_t v) { return v > 0 && v < 100 ? v : 0; }

int vgpu_config_adopt(struct vgpu_env_config *cfg, const struct vgpu_config *file)
{
    int adopted = 0;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_config_device *e = &file->devices[i];
        struct vgpu_device_cfg *d = &cfg->dev[i];
        char uuid[VGPU_UUID_LEN + 1];
        memcpy(uuid, e->uuid, VGPU_UUID_LEN);
        uuid[VGPU_UUID_LEN] = '\0';
        if (!e->activate || !e->hotplug || d->uuid[0] != '\0')
            continue;
        if (strncmp(uuid, "GPU-", 4) != 0 || uuid[4] == '\0')
            continue;
        int named = 0;
        for (int j = 0; j < VGPU_MAX_DEVICES; j++)
            named = named || strcasecmp(cfg->dev[j].uuid, uuid) == 0;
        if (named)
            continue;
        memset(d, 0, sizeof(*d));
        snprintf(d->uuid, sizeof(d->uuid), "%s", uuid);
        d->from_file = 1;
        d->mem_ratio = 1.0;
        if (e->memory_limit && e->total_memory > 0) {
            d->mem_limit = d->total_memory = e->total_memory;
            d->real_memory = e->real_memory > 0 && e->real_memory < e->total_memory ? e->real_memory : e->total_memory;
            if (d->real_memory < d->total_memory)
                d->mem_ratio = (double)d->total_memory / (double)d->real_memory;
            d->mem_oversold = e->memory_oversold != 0;
        }
        d->hard_core = e->core_limit ? percent(e->hard_core) : 0;
        d->soft_core = d->hard_core > 0 && percent(e->soft_core) > d->hard_core ? percent(e->soft_core) : 0;
        adopted++;
    }
    return adopted;
}

/* The driver's versions for the header, when the driver and NVML are there. */
static void versions(int *cuda_version, char *driver, size_t cap)
{
    static void *s1, *s2;
    CUresult (*get_version)(int *) = vgpu_real_cached(&s1, VGPU_LIB_CUDA, "cuDriverGetVersion");
    nvmlReturn_t (*get_driver)(char *, unsigned int) =
        vgpu_real_cached(&s2, VGPU_LIB_NVML, "nvmlSystemGetDriverVersion");
    *cuda_version = 0;
    driver[0] = '\0';
    if (get_version != NULL && get_version(cuda_version) != CUDA_SUCCESS)
        *cuda_version = 0;
    if (get_driver != NULL && vgpu_nvml_ready() && get_driver(driver, (unsigned int)cap) != NVML_SUCCESS)
        driver[0] = '\0';
}

/* Copy `src` over `dst` when `dst` is all zero: a field nobody wrote yet. */
static void fill_blank(void *dst, const void *src, size_t n)
{
    const unsigned char *d = dst;
    for (size_t i = 0; i < n; i++)
        if (d[i] != 0)
            return;
    memcpy(dst, src, n);
}

void vgpu_config_merge(struct vgpu_config *file, const struct vgpu_config *env)
{
    if (file->cuda_version_major == 0 && file->cuda_version_minor == 0) {
        file->cuda_version_major = env->cuda_version_major;
        file->cuda_version_minor = env->cuda_version_minor;
    }
#define FILL(f) fill_blank(&file->f, &env->f, sizeof(file->f))
    FILL(driver_version);
    FILL(pod_uid);
    FILL(pod_name);
    FILL(pod_namespace);
    FILL(container_name);
    FILL(reg_uuid);
    FILL(compatibility_mode);
    FILL(sm_watcher);
    FILL(vmem_node);
#undef FILL
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        struct vgpu_config_device *d = &file->devices[i];
        if (!env->devices[i].activate || (d->activate && !d->hotplug))
            continue; /* not the env's device, or the first publisher's entry (same env: same bytes) */
        *d = env->devices[i]; /* an empty slot, or a hot-plugged entry where the env has its own device */
    }
}

void vgpu_config_publish(const struct vgpu_env_config *cfg)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/vgpu.config", vgpu_path(VGPU_PATH_CONFIG_DIR));
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return; /* a read-only mount, or a file vgpud created that this user cannot write */
    if (lock_byte0(fd, F_WRLCK) < 0) {
        close(fd);
        return;
    }
    struct vgpu_config out, file;
    char err[256], driver[VGPU_DRIVER_VERSION_LEN + 1];
    int cuda_version;
    versions(&cuda_version, driver, sizeof(driver));
    if (vgpu_config_build(&out, cfg, vgpu_env, NULL, cuda_version, driver, err, sizeof(err)) < 0) {
        vgpu_log(VGPU_LOG_WARNING, "%s is not written: %s", path, err);
    } else if (header_valid(fd) && pread(fd, &file, sizeof(file), 0) == (ssize_t)sizeof(file)) {
        struct vgpu_config merged = file; /* written by another process, or created by vgpud */
        vgpu_config_merge(&merged, &out);
        if (memcmp(&merged, &file, sizeof(file)) != 0 &&
            pwrite(fd, &merged, sizeof(merged), 0) != (ssize_t)sizeof(merged))
            vgpu_log(VGPU_LOG_WARNING, "cannot write %s: %s", path, strerror(errno));
    } else if (ftruncate(fd, 0) < 0 || pwrite(fd, &out, sizeof(out), 0) != (ssize_t)sizeof(out) ||
               ftruncate(fd, VGPU_CONFIG_FILE_SIZE) < 0) {
        vgpu_log(VGPU_LOG_WARNING, "cannot write %s: %s", path, strerror(errno));
    }
    lock_byte0(fd, F_UNLCK);
    close(fd);
}

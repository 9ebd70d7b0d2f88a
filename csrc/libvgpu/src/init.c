/* Lazy initialisation and the device mapping (vgpu_state.h). */
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hooks_pool.h"
#include "ledger.h"
#include "loader.h"
#include "memlimit.h"
#include "vgpu_config_file.h"
#include "vgpu_paths.h"
#include "vgpu_state.h"

/* The library links without crtbeginS.o (-nostartfiles: no DT_INIT, no .init_array), which is
 * where __dso_handle normally lives; atexit (libc_nonshared) names this object by it. */
void *__dso_handle __attribute__((visibility("hidden"))) = &__dso_handle;

static struct vgpu_env_config cfg;
static int configured; /* cfg names a device; else the library is inert (vgpu_state.h) */
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static int process_ready; /* this process ran the loader; cleared in a forked child */
static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_CUDEV 64
/* The vgpu_host_of_cudev result per ordinal; NOT_LOOKED_UP until known. Reset after fork (ordinals
 * are per process). */
#define NOT_LOOKED_UP INT_MIN
static int cudev_host[MAX_CUDEV];
static struct {
    nvmlDevice_t handle;
    int host;
} nvml_map[VGPU_MAX_DEVICES * 2];
/* The UUIDs refused so far (logged once each); under map_lock. */
#define MAX_REFUSED 64
static char refused[MAX_REFUSED][VGPU_UUID_MAX];
static int n_refused;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;

static void reset_caches(void)
{
    for (int i = 0; i < MAX_CUDEV; i++)
        __atomic_store_n(&cudev_host[i], NOT_LOOKED_UP, __ATOMIC_RELAXED);
    memset(nvml_map, 0, sizeof(nvml_map));
    n_refused = 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&process_lock);
    pthread_mutex_lock(&map_lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&map_lock);
    pthread_mutex_unlock(&process_lock);
}

static void atfork_child(void)
{
    pthread_mutex_unlock(&map_lock);
    pthread_mutex_unlock(&process_lock);
    reset_caches();
    vgpu_ledger_after_fork();
    vgpu_devlock_after_fork();
    vgpu_pools_after_fork();
    __atomic_store_n(&process_ready, 0, __ATOMIC_RELEASE);
}

static void global_init(void)
{
    char err[256];
    reset_caches();
    if (vgpu_config_parse(&cfg, vgpu_env, NULL, err, sizeof(err)) < 0) {
        vgpu_log(VGPU_LOG_FATAL, "%s", err);
        abort();
    }
    struct vgpu_config file; /* devices hot-plugged after the container started: not in its env */
    if (vgpu_config_read(&file) == 0)
        vgpu_config_adopt(&cfg, &file);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        configured = configured || cfg.dev[i].uuid[0] != '\0';
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    vgpu_ledger_install_exit_handlers();
}

/* At LOGGER_LEVEL info, once per process: the devices it may use and their memory limits. */
static void log_devices(void)
{
    if (!vgpu_log_enabled(VGPU_LOG_INFO))
        return;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        const struct vgpu_device_cfg *d = &cfg.dev[i];
        if (d->uuid[0] == '\0')
            continue;
        if (d->mem_limit == 0)
            vgpu_log(VGPU_LOG_INFO, "device %d %s%s: no memory limit (compatibility mode %ld)", i, d->uuid,
                     d->from_file ? " (hot-plugged)" : "", cfg.mode);
        else
            vgpu_log(VGPU_LOG_INFO, "device %d %s%s: memory limit %llu bytes, %llu of them device memory "
                     "(compatibility mode %ld)", i, d->uuid, d->from_file ? " (hot-plugged)" : "",
                     d->total_memory, d->real_memory, cfg.mode);
    }
}

/* The loader once per process: registration (client mode) and the partition directories. */
static void process_init(void)
{
    struct loader_env env = {
        .getenv = vgpu_env,
        .getenv_ctx = NULL,
        .paths =
            {
                .config_dir = vgpu_path(VGPU_PATH_CONFIG_DIR),
                .pids_config = vgpu_path(VGPU_PATH_PIDS_CONFIG),
                .vgpu_lock_dir = vgpu_path(VGPU_PATH_LOCK_DIR),
                .vmem_node_dir = vgpu_path(VGPU_PATH_VMEM_NODE_DIR),
                .sm_node_dir = vgpu_path(VGPU_PATH_SM_NODE_DIR),
                .register_client = vgpu_path(VGPU_PATH_REGISTER_CLIENT),
                .registry_socket = vgpu_path(VGPU_PATH_REGISTRY_SOCKET),
            },
    };
    struct loader_ops ops = vgpu_default_ops;
    ops.log = vgpu_log_loader_line; /* its lines by LOGGER_LEVEL */
    struct loader_result r;
    if (vgpu_loader_init(&env, &ops, &r) != VGPU_LOADER_OK)
        abort(); /* the FATAL line is on stderr already */
    vgpu_config_publish(&cfg);
    log_devices();
}

/* Set while this thread initialises: the real libraries may call their own exported functions
 * through the PLT (a fake NVML's nvmlInit_v2 calls nvmlInitWithFlags), which lands in our hooks;
 * those must pass through rather than wait for the initialisation they are part of. */
static __thread int initialising;

void vgpu_init(void)
{
    if (__atomic_load_n(&process_ready, __ATOMIC_ACQUIRE) || initialising)
        return;
    initialising = 1;
    pthread_once(&global_once, global_init);
    pthread_mutex_lock(&process_lock);
    if (!__atomic_load_n(&process_ready, __ATOMIC_RELAXED)) {
        process_init();
        __atomic_store_n(&process_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&process_lock);
    initialising = 0;
}

const struct vgpu_env_config *vgpu_cfg(void)
{
    vgpu_init();
    return &cfg;
}

void vgpu_format_uuid(const unsigned char b[16], char out[41])
{
    snprintf(out, 41, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int host_of_uuid(const char *uuid)
{
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        if (cfg.dev[i].uuid[0] != '\0' && strcasecmp(cfg.dev[i].uuid, uuid) == 0)
            return i;
    return -1;
}

/* The UUID of CUDA device `dev` through the real driver: CUDA_SUCCESS, the driver's error, or
 * CUDA_ERROR_NOT_FOUND when the driver has no cuDeviceGetUuid at all. */
static CUresult cudev_uuid(CUdevice dev, char out[41])
{
    static void *slot, *slot2;
    cu_device_get_uuid_fn get = vgpu_real_cached(&slot2, VGPU_LIB_CUDA, "cuDeviceGetUuid_v2");
    if (get == NULL)
        get = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuDeviceGetUuid");
    if (get == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUuuid u;
    CUresult r = get(&u, dev);
    if (r == CUDA_SUCCESS)
        vgpu_format_uuid((const unsigned char *)u.bytes, out);
    return r;
}

int vgpu_judge_cudev(CUdevice dev, CUresult *why)
{
    vgpu_init();
    *why = CUDA_SUCCESS;
    if (!configured)
        return VGPU_HOST_NONE; /* inert: nothing is ours, nothing is refused */
    if (dev >= 0 && dev < MAX_CUDEV) {
        int h = __atomic_load_n(&cudev_host[dev], __ATOMIC_ACQUIRE);
        if (h != NOT_LOOKED_UP)
            return h;
    }
    char s[41];
    CUresult r = cudev_uuid(dev, s);
    if (r != CUDA_SUCCESS) {
        /* Not cached: a later call may succeed (e.g. after cuInit). A driver without
         * cuDeviceGetUuid cannot be judged at all: its devices pass. */
        *why = r == CUDA_ERROR_NOT_FOUND ? CUDA_SUCCESS : r;
        return VGPU_HOST_NONE;
    }
    int h = host_of_uuid(s);
    if (h < 0) /* the ordinal rides along for the log line (a negative or huge one cannot) */
        h = dev >= 0 && dev < (1 << 30) ? VGPU_FOREIGN_CUDEV(dev) : VGPU_HOST_FOREIGN;
    if (dev >= 0 && dev < MAX_CUDEV)
        __atomic_store_n(&cudev_host[dev], h, __ATOMIC_RELEASE);
    return h;
}

int vgpu_host_of_cudev(CUdevice dev)
{
    CUresult why;
    return vgpu_judge_cudev(dev, &why);
}

int vgpu_host_of_current(void)
{
    static void *slot;
    cu_ctx_get_device_fn get = vgpu_real_cached(&slot, VGPU_LIB_CUDA, "cuCtxGetDevice");
    CUdevice dev;
    if (get == NULL || get(&dev) != CUDA_SUCCESS)
        return VGPU_HOST_NONE;
    return vgpu_host_of_cudev(dev);
}

static nvmlReturn_t nvml_uuid(nvmlDevice_t h, char out[NVML_DEVICE_UUID_V2_BUFFER_SIZE])
{
    static void *slot;
    nvml_get_uuid_fn get = vgpu_real_cached(&slot, VGPU_LIB_NVML, "nvmlDeviceGetUUID");
    return get == NULL ? NVML_ERROR_FUNCTION_NOT_FOUND : get(h, out, NVML_DEVICE_UUID_V2_BUFFER_SIZE);
}

int vgpu_judge_nvml(nvmlDevice_t h, nvmlReturn_t *why)
{
    vgpu_init();
    *why = NVML_SUCCESS;
    if (!configured)
        return VGPU_HOST_NONE;
    pthread_mutex_lock(&map_lock);
    for (size_t i = 0; i < sizeof(nvml_map) / sizeof(nvml_map[0]); i++) {
        if (nvml_map[i].handle == h) {
            int host = nvml_map[i].host;
            pthread_mutex_unlock(&map_lock);
            return host;
        }
    }
    pthread_mutex_unlock(&map_lock);
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    nvmlReturn_t r = nvml_uuid(h, uuid);
    if (r != NVML_SUCCESS) {
        *why = r == NVML_ERROR_FUNCTION_NOT_FOUND ? NVML_SUCCESS : r;
        return VGPU_HOST_NONE;
    }
    int host = host_of_uuid(uuid);
    if (host < 0)
        host = VGPU_HOST_FOREIGN;
    pthread_mutex_lock(&map_lock);
    for (size_t i = 0; i < sizeof(nvml_map) / sizeof(nvml_map[0]); i++) {
        if (nvml_map[i].handle == NULL) {
            nvml_map[i].handle = h;
            nvml_map[i].host = host;
            break;
        }
    }
    pthread_mutex_unlock(&map_lock);
    return host;
}

int vgpu_host_of_nvml(nvmlDevice_t h)
{
    nvmlReturn_t why;
    return vgpu_judge_nvml(h, &why);
}

static void log_refused(const char *uuid)
{
    int seen = 0;
    pthread_mutex_lock(&map_lock);
    for (int i = 0; i < n_refused && !seen; i++)
        seen = strcasecmp(refused[i], uuid) == 0;
    if (!seen && n_refused < MAX_REFUSED)
        snprintf(refused[n_refused++], sizeof(refused[0]), "%s", uuid);
    pthread_mutex_unlock(&map_lock);
    if (!seen)
        vgpu_log(VGPU_LOG_WARNING, "refused device %s: not one of this container's devices", uuid);
}

void vgpu_log_refused_cudev(int host)
{
    char s[41];
    if (VGPU_IS_FOREIGN(host) && cudev_uuid(VGPU_HOST_FOREIGN - host, s) == CUDA_SUCCESS)
        log_refused(s);
}

void vgpu_log_refused_nvml(nvmlDevice_t h)
{
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (nvml_uuid(h, uuid) == NVML_SUCCESS)
        log_refused(uuid);
}

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_ok;

static void nvml_init(void)
{
    static void *slot;
    nvml_init_fn init = vgpu_real_cached(&slot, VGPU_LIB_NVML, "nvmlInit_v2");
    nvml_ok = init != NULL && init() == NVML_SUCCESS;
    if (!nvml_ok)
        vgpu_log(VGPU_LOG_ERROR, "cannot initialise NVML; container memory usage cannot be read");
}

int vgpu_nvml_ready(void)
{
    pthread_once(&nvml_once, nvml_init);
    return nvml_ok;
}

nvmlDevice_t vgpu_nvml_of_host(int host)
{
    vgpu_init();
    if (!vgpu_nvml_ready() || host < 0 || host >= VGPU_MAX_DEVICES || cfg.dev[host].uuid[0] == '\0')
        return NULL;
    static void *slot;
    nvml_get_handle_by_uuid_fn get = vgpu_real_cached(&slot, VGPU_LIB_NVML, "nvmlDeviceGetHandleByUUID");
    nvmlDevice_t h = NULL;
    if (get == NULL || get(cfg.dev[host].uuid, &h) != NVML_SUCCESS)
        return NULL;
    return h;
}

/* The core limit's process state: settings, per-device buckets, watcher threads, the NVML sampler
 * (see core_limit.h). */
#include "core_limit.h"

#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core_abi.h"
#include "core_bucket.h"
#include "core_env.h"
#include "core_util.h"
#include "core_watch.h"
#include "memlimit.h"
#include "vgpu_paths.h"
#include "vgpu_state.h"

#define WAIT_NS 10000000L /* a refused launch retries every 10 ms */
#define MAX_WATCHERS ((VGPU_MAX_DEVICES + CORE_WATCH_PER_THREAD - 1) / CORE_WATCH_PER_THREAD)

enum { DEV_UNSET = 0, DEV_READY = 1, DEV_UNAVAILABLE = 2 };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct core_env env;
static bool any_limit;
static struct core_shared shared;
static bool shared_ok;
static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;
static struct core_device devs[VGPU_MAX_DEVICES];
static int dev_state[VGPU_MAX_DEVICES];
static struct core_watcher watchers[MAX_WATCHERS];
static int n_devices; /* devices handed to watchers so far */

static uint64_t mono_ns(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int pid_is_ours(void *ctx, unsigned int pid) { return vgpu_pid_is_ours(ctx, pid); }

/* The per-process samples since `since` (µs) through nvmlDeviceGetProcessUtilization: NVML's result
 * and, on success, *out (malloc'd) and *n. */
static nvmlReturn_t legacy_samples(nvmlDevice_t dev, unsigned long long since, struct core_proc_sample **out,
                                   unsigned int *n)
{
    static void *slot;
    nvml_get_process_utilization_fn get = vgpu_real_cached(&slot, VGPU_LIB_NVML, "nvmlDeviceGetProcessUtilization");
    if (get == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlProcessUtilizationSample_t stack[64], *buf = stack;
    unsigned int count = 64;
    nvmlReturn_t rc = get(dev, buf, &count, since);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE && count > 0) {
        if ((buf = malloc(sizeof(*buf) * count)) == NULL)
            return NVML_ERROR_UNKNOWN;
        rc = get(dev, buf, &count, since);
    }
    if (rc == NVML_SUCCESS && (*out = malloc(sizeof(**out) * (count ? count : 1))) == NULL)
        rc = NVML_ERROR_UNKNOWN;
    if (rc == NVML_SUCCESS) {
        for (unsigned int i = 0; i < count; i++)
            (*out)[i] = (struct core_proc_sample){buf[i].pid, buf[i].smUtil, buf[i].encUtil, buf[i].decUtil};
        *n = count;
    }
    if (buf != stack)
        free(buf);
    return rc;
}

/* The same through nvmlDeviceGetProcessesUtilizationInfo, for drivers where the older call is not
 * supported (the reference's fallback). */
static nvmlReturn_t info_samples(nvmlDevice_t dev, unsigned long long since, struct core_proc_sample **out,
                                 unsigned int *n)
{
    static void *slot;
    nvml_get_processes_utilization_info_fn get =
        vgpu_real_cached(&slot, VGPU_LIB_NVML, "nvmlDeviceGetProcessesUtilizationInfo");
    if (get == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlProcessesUtilizationInfo_v1_t info = {NVML_PROCESSES_UTILIZATION_INFO_V1, 0, since, NULL};
    nvmlReturn_t rc = get(dev, &info); /* the count needed */
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE || info.processSamplesCount == 0)
        return rc;
    unsigned int room = info.processSamplesCount;
    if ((info.procUtilArray = malloc(sizeof(*info.procUtilArray) * room)) == NULL)
        return NVML_ERROR_UNKNOWN;
    info.lastSeenTimeStamp = since;
    rc = get(dev, &info);
    if (rc == NVML_SUCCESS && (*out = malloc(sizeof(**out) * (info.processSamplesCount ? info.processSamplesCount : 1))) == NULL)
        rc = NVML_ERROR_UNKNOWN;
    if (rc == NVML_SUCCESS) {
        for (unsigned int i = 0; i < info.processSamplesCount && i < room; i++) {
            const nvmlProcessUtilizationInfo_v1_t *p = &info.procUtilArray[i];
            (*out)[i] = (struct core_proc_sample){p->pid, p->smUtil, p->encUtil, p->decUtil};
        }
        *n = info.processSamplesCount < room ? info.processSamplesCount : room;
    }
    free(info.procUtilArray);
    return rc;
}

/* The container's SM share over the last second (now - 1 s) of host device `host`: by
 * nvmlDeviceGetProcessUtilization, else nvmlDeviceGetProcessesUtilizationInfo; NOT_FOUND (no sample
 * in that second) is an idle GPU, not an error. */
static int nvml_sample(void *ctx, int host, double *util, double *external)
{
    (void)ctx;
    nvmlDevice_t dev = vgpu_nvml_of_host(host);
    if (dev == NULL)
        return -1;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    unsigned long long since = (unsigned long long)tv.tv_sec * 1000000ull + (unsigned long long)tv.tv_usec - 1000000ull;
    struct core_proc_sample *s = NULL;
    unsigned int count = 0;
    nvmlReturn_t rc = legacy_samples(dev, since, &s, &count);
    if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND)
        rc = info_samples(dev, since, &s, &count);
    if (rc == NVML_ERROR_NOT_FOUND) {
        *util = 0;
        *external = 0;
        return 0;
    }
    if (rc != NVML_SUCCESS)
        return -1;
    struct vgpu_membership membership = {vgpu_cfg()->mode, VGPU_RULE_NONE};
    core_util_sum(s, count, pid_is_ours, &membership, util, external);
    free(s);
    return 0;
}

static void log_cycle(void *ctx, int host, double util, double target, int64_t add, int64_t level)
{
    (void)ctx;
    vgpu_log(VGPU_LOG_DETAIL, "device %d: core utilisation %.1f%% (target %.0f%%), bucket %lld, refill %lld", host,
             util, target, (long long)level, (long long)add);
}

static const struct core_watch_ops nvml_ops = {
    .sample = nvml_sample, .now_ns = mono_ns, .cycle = log_cycle, .ctx = NULL};

/* The child of a fork has none of the parent's threads: its devices are set up again at its first
 * charge (new local buckets, new watchers), and it drops its copy of the sampler lock. */
static void after_fork_child(void)
{
    pthread_mutex_init(&setup_lock, NULL);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        dev_state[i] = DEV_UNSET;
    for (int i = 0; i < MAX_WATCHERS; i++)
        watchers[i] = (struct core_watcher){0};
    n_devices = 0;
    if (shared_ok)
        core_shared_after_fork(&shared);
}

/* The reference's controller settings are not this library's: say so once, when one is set. */
static void warn_unused_settings(void)
{
    static const char *const names[] = CORE_ENV_UNUSED;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = vgpu_env(NULL, names[i]);
        if (v != NULL && *v != '\0')
            vgpu_log(VGPU_LOG_WARNING, "%s=%s is not used: this library has one core limit controller of its own",
                     names[i], v);
    }
    for (char **e = environ; e != NULL && *e != NULL; e++)
        if (strncmp(*e, CORE_ENV_UNUSED_PREFIX, strlen(CORE_ENV_UNUSED_PREFIX)) == 0)
            vgpu_log(VGPU_LOG_WARNING, "%s is not used: this library has one core limit controller of its own", *e);
}

static void core_init(void)
{
    vgpu_init();
    warn_unused_settings();
    char err[256];
    if (core_env_parse(&env, vgpu_env, NULL, err, sizeof(err)) < 0) {
        vgpu_log(VGPU_LOG_WARNING, "core limit off: %s", err);
        return;
    }
    const struct vgpu_env_config *cfg = vgpu_cfg();
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        if (cfg->dev[i].from_file) { /* a hot-plugged device: its limits are in vgpu.config */
            env.hard[i] = cfg->dev[i].hard_core;
            env.soft[i] = cfg->dev[i].soft_core;
        }
        any_limit = any_limit || env.hard[i] > 0;
    }
    if (any_limit && env.shared_bucket) {
        shared_ok = core_shared_open(&shared, vgpu_path(VGPU_PATH_SM_NODE_DIR), err, sizeof(err)) == 0;
        if (!shared_ok)
            vgpu_log(VGPU_LOG_WARNING, "shared SM bucket unavailable, each process limits itself: %s", err);
    }
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* The CUDA device of host index `host`, by UUID (never by ordinal). */
static int cudev_of_host(int host, CUdevice *out)
{
    static void *count_slot, *get_slot;
    cu_device_get_count_fn count_fn = vgpu_real_cached(&count_slot, VGPU_LIB_CUDA, "cuDeviceGetCount");
    cu_device_get_fn get_fn = vgpu_real_cached(&get_slot, VGPU_LIB_CUDA, "cuDeviceGet");
    int n = 0;
    if (count_fn == NULL || get_fn == NULL || count_fn(&n) != CUDA_SUCCESS)
        return -1;
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        if (get_fn(&dev, i) == CUDA_SUCCESS && vgpu_host_of_cudev(dev) == host) {
            *out = dev;
            return 0;
        }
    }
    return -1;
}

/* Sets up host device `host` (under setup_lock): its ceiling from the driver, its bucket, and its
 * place in a watcher thread (started with its first device). */
static void setup_device(int host)
{
    static void *attr_slot;
    cu_device_get_attribute_fn attr = vgpu_real_cached(&attr_slot, VGPU_LIB_CUDA, "cuDeviceGetAttribute");
    CUdevice dev;
    int sms = 0, threads = 0;
    if (attr == NULL || cudev_of_host(host, &dev) < 0 ||
        attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) != CUDA_SUCCESS ||
        core_bucket_ceiling(sms, threads) <= 0) {
        vgpu_log(VGPU_LOG_WARNING, "core limit of device %d not applied: cannot read its SM count", host);
        __atomic_store_n(&dev_state[host], DEV_UNAVAILABLE, __ATOMIC_RELEASE);
        return;
    }
    int64_t ceiling = core_bucket_ceiling(sms, threads);
    struct core_device *d = &devs[host];
    struct vgpu_sm_device *sd = NULL;
    if (shared_ok) {
        struct core_ctl probe; /* the first share, as the controller would start */
        core_ctl_init(&probe, env.hard[host], env.soft[host], ceiling);
        sd = core_shared_device(&shared, host, ceiling, env.hard[host], env.soft[host],
                                (int64_t)(probe.rate * probe.period));
    }
    core_device_init(d, host, env.hard[host], env.soft[host], ceiling, sd, mono_ns(NULL));
    struct core_watcher *w = &watchers[n_devices / CORE_WATCH_PER_THREAD];
    w->sh = shared_ok ? &shared : NULL;
    w->ops = &nvml_ops;
    w->devs[w->count] = d;
    __atomic_store_n(&w->count, w->count + 1, __ATOMIC_RELEASE);
    if (n_devices++ % CORE_WATCH_PER_THREAD == 0 && core_watcher_start(w) != 0)
        vgpu_log(VGPU_LOG_WARNING, "core limit watcher thread not started: device %d keeps its last rate", host);
    vgpu_log(VGPU_LOG_INFO, "device %d: core limit %d%%%s, %d SMs x %d threads (bucket ceiling %lld)", host,
             env.hard[host], env.soft[host] > 0 ? " (soft limit applies while uncontended)" : "", sms, threads,
             (long long)ceiling);
    __atomic_store_n(&dev_state[host], DEV_READY, __ATOMIC_RELEASE);
}

bool vgpu_core_any_limit(void)
{
    pthread_once(&once, core_init);
    return any_limit;
}

void vgpu_core_charge(int host, unsigned long long blocks)
{
    if (host < 0 || host >= VGPU_MAX_DEVICES || !vgpu_core_any_limit() || env.hard[host] <= 0)
        return;
    int state = __atomic_load_n(&dev_state[host], __ATOMIC_ACQUIRE);
    if (state == DEV_UNSET) {
        pthread_mutex_lock(&setup_lock);
        if (__atomic_load_n(&dev_state[host], __ATOMIC_ACQUIRE) == DEV_UNSET)
            setup_device(host);
        pthread_mutex_unlock(&setup_lock);
        state = __atomic_load_n(&dev_state[host], __ATOMIC_ACQUIRE);
    }
    if (state != DEV_READY)
        return;
    while (!core_bucket_try_charge(devs[host].tokens, blocks)) {
        struct timespec ts = {0, WAIT_NS};
        nanosleep(&ts, NULL);
    }
}

void vgpu_core_charge_current(unsigned long long blocks)
{
    if (!vgpu_core_any_limit())
        return;
    vgpu_core_charge(vgpu_host_of_current(), blocks);
}

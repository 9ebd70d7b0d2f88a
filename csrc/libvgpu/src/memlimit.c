/* See memlimit.h. */
#include "memlimit.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ledger.h"
#include "loader.h"
#include "vgpu_paths.h"
#include "vgpu_state.h"

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define LOCK_TIMEOUT_NS (10LL * 1000000000LL)

/* One open lock file per device, kept for the life of the process: the OFD lock belongs to the
 * open file description, which every thread shares, so a per-device mutex excludes the threads of
 * this process and the OFD lock the other processes. A forked child shares its parent's
 * descriptions and must open its own (vgpu_devlock_after_fork). */
static struct {
    pthread_mutex_t mu;
    int fd;
} devlocks[VGPU_MAX_DEVICES] = {[0 ... VGPU_MAX_DEVICES - 1] = {PTHREAD_MUTEX_INITIALIZER, -1}};

/* The last pids.config text read, reused while a stat(2) of the file shows the same file, size,
 * mtime and ctime: one syscall per decision instead of open, flock, read and close. The writer
 * rewrites it in place, and a rewrite updates mtime and ctime before the first byte changes; but
 * those timestamps may be as coarse as a scheduler tick, so a rewrite in the same tick as the text
 * we read could keep them. Hence a text whose timestamps are under PIDS_SETTLED_NS old when read
 * is not reused: any later rewrite gets a later timestamp than one that had settled. */
#define PIDS_SETTLED_NS 100000000LL
static pthread_mutex_t pids_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *text;
    int reusable;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
} pids_cache;

/* Allocation locks this thread holds: a driver that calls its own exported allocation functions
 * through the PLT re-enters our hooks inside the outer allocation, already decided and locked. */
static __thread int locks_held;

int vgpu_devlock_held(void) { return locks_held > 0; }

static int open_lock_file(int host)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/vgpu_%d.lock", vgpu_path(VGPU_PATH_LOCK_DIR), host);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd >= 0)
            fchmod(fd, 0666); /* every uid of the container takes it; the umask must not narrow it */
    }
    if (fd < 0)
        vgpu_log(VGPU_LOG_ERROR, "cannot open %s: %s", path, strerror(errno));
    return fd;
}

int vgpu_devlock(int host)
{
    if (host < 0 || host >= VGPU_MAX_DEVICES)
        return -1;
    long long start = now_ns();
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += LOCK_TIMEOUT_NS / 1000000000LL;
    if (pthread_mutex_timedlock(&devlocks[host].mu, &deadline) != 0) {
        vgpu_log(VGPU_LOG_ERROR, "device %d allocation lock held by another thread for over 10 s", host);
        return -1;
    }
    if (devlocks[host].fd < 0)
        devlocks[host].fd = open_lock_file(host);
    int fd = devlocks[host].fd;
    /* Whole file, OFD: the kernel drops it when the holder dies, SIGKILL included. */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    int cmd = F_OFD_SETLK;
    long long round = start;
    long sleep_ns = 200000;
    for (int tries = 0; fd >= 0; tries++) {
        if (fcntl(fd, cmd, &fl) == 0) {
            locks_held++;
            return host;
        }
        if (errno == EINVAL && cmd == F_OFD_SETLK) {
            cmd = F_SETLK; /* a kernel without OFD locks */
            continue;
        }
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
            vgpu_log(VGPU_LOG_ERROR, "cannot lock the device %d lock file: %s", host, strerror(errno));
            break;
        }
        long long t = now_ns();
        if (t - start > LOCK_TIMEOUT_NS) {
            vgpu_log(VGPU_LOG_ERROR, "device %d lock file held by another process for over 10 s", host);
            break;
        }
        if (tries < 4) {
            sched_yield();
            continue;
        }
        if (t - round > 50000000LL) { /* reset the backoff every 50 ms */
            round = t;
            sleep_ns = 200000;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000)
            sleep_ns *= 2;
    }
    pthread_mutex_unlock(&devlocks[host].mu);
    return -1;
}

void vgpu_devunlock(int token)
{
    if (token < 0 || token >= VGPU_MAX_DEVICES)
        return;
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(devlocks[token].fd, F_OFD_SETLK, &fl) < 0 && errno == EINVAL)
        fcntl(devlocks[token].fd, F_SETLK, &fl);
    locks_held--;
    pthread_mutex_unlock(&devlocks[token].mu);
}

void vgpu_devlock_after_fork(void)
{
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        if (devlocks[i].fd >= 0)
            close(devlocks[i].fd); /* the parent's description keeps the parent's lock */
        devlocks[i].fd = -1;
        pthread_mutex_init(&devlocks[i].mu, NULL);
    }
    pthread_mutex_init(&pids_mu, NULL); /* the cached text stays: a stat decides whether it is reused */
}

/* --- container membership ---------------------------------------------------------------------- */

static int read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && ((r = read(fd, buf + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            n += (size_t)r;
    close(fd);
    buf[n] = '\0';
    return (int)n;
}

/* pids.config under flock(LOCK_SH|LOCK_NB) retried for about 1 ms, else unlocked (the writer never
 * truncates first): its text (malloc'd, sized to fit), or NULL when unreadable or empty (fail
 * closed); *st: the file's status as read. */
static char *load_pids_config(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    for (int i = 0; i < 10 && flock(fd, LOCK_SH | LOCK_NB) < 0; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    size_t n = 0;
    enum { PIDS_MAX = 1 << 20 };
    char *buf = fstat(fd, st) == 0 ? malloc(PIDS_MAX) : NULL;
    ssize_t r;
    while (buf != NULL && n < PIDS_MAX - 1 &&
           ((r = read(fd, buf + n, PIDS_MAX - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
        if (r > 0)
            n += (size_t)r;
    close(fd);
    if (buf == NULL || n == 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    char *fit = realloc(buf, n + 1);
    return fit != NULL ? fit : buf;
}


static int same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

static long long age_ns(const struct timespec *t, const struct timespec *now)
{
    return (long long)(now->tv_sec - t->tv_sec) * 1000000000LL + (now->tv_nsec - t->tv_nsec);
}

/* pids.config's current text, with pids_mu held until pids_release(); NULL (and not held) when it
 * is unreadable or empty. */
static const char *pids_acquire(void)
{
    const char *path = vgpu_path(VGPU_PATH_PIDS_CONFIG);
    struct stat st;
    pthread_mutex_lock(&pids_mu);
    if (pids_cache.reusable && stat(path, &st) == 0 && st.st_dev == pids_cache.dev &&
        st.st_ino == pids_cache.ino && st.st_size == pids_cache.size && same_time(&st.st_mtim, &pids_cache.mtime) &&
        same_time(&st.st_ctim, &pids_cache.ctime))
        return pids_cache.text;
    free(pids_cache.text);
    pids_cache.text = load_pids_config(path, &st);
    pids_cache.reusable = 0;
    if (pids_cache.text == NULL) {
        pthread_mutex_unlock(&pids_mu);
        return NULL;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    pids_cache.reusable = age_ns(&st.st_mtim, &now) > PIDS_SETTLED_NS && age_ns(&st.st_ctim, &now) > PIDS_SETTLED_NS;
    pids_cache.dev = st.st_dev;
    pids_cache.ino = st.st_ino;
    pids_cache.size = st.st_size;
    pids_cache.mtime = st.st_mtim;
    pids_cache.ctime = st.st_ctim;
    return pids_cache.text;
}

static void pids_release(void) { pthread_mutex_unlock(&pids_mu); }

static int pid_listed(const char *text, unsigned int pid)
{
    for (const char *p = text; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end != p && v == pid)
            return 1;
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* 1 listed, 0 not, -1 unreadable or empty. */
static int pid_in_pids_config(unsigned int pid)
{
    const char *text = pids_acquire();
    if (text == NULL)
        return -1;
    int found = pid_listed(text, pid);
    pids_release();
    return found;
}

/* The path of cgroup v1 controller `ctl` in a /proc/<pid>/cgroup text, into out. */
static int v1_path(const char *text, const char *ctl, char *out, size_t cap)
{
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2 != NULL) {
            /* controllers field: comma list between the colons */
            size_t n = strlen(ctl);
            for (const char *p = c1 + 1; p < c2;) {
                const char *comma = memchr(p, ',', (size_t)(c2 - p));
                size_t w = comma ? (size_t)(comma - p) : (size_t)(c2 - p);
                if (w == n && strncmp(p, ctl, n) == 0) {
                    snprintf(out, cap, "%.*s", (int)(len - (size_t)(c2 + 1 - line)), c2 + 1);
                    return 0;
                }
                p += w + 1;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return -1;
}

static int same_ns(const char *proc, unsigned int pid, const char *ns)
{
    char a[4096], b[256], la[256], lb[256];
    snprintf(a, sizeof(a), "%s/%u/ns/%s", proc, pid, ns);
    snprintf(b, sizeof(b), "/proc/self/ns/%s", ns);
    ssize_t na = readlink(a, la, sizeof(la) - 1), nb = readlink(b, lb, sizeof(lb) - 1);
    return na > 0 && nb > 0 && na == nb && memcmp(la, lb, (size_t)na) == 0;
}

/* Whether the unified-hierarchy line of a /proc/<pid>/cgroup text reads "0::/": the only line on a
 * v2 host, the last one (after the v1 controllers') on a hybrid host. */
static int v2_is_root(const char *text)
{
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len == 4 && memcmp(line, "0::/", 4) == 0)
            return 1;
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

/* Cgroup rule: the process's cgroup, read through the host's /proc (NVML gives host PIDs), is ours.
 * v2: seen through our cgroup namespace, a process of our own cgroup reads "0::/"; v1: the same
 * `memory` path as our own. */
static int in_our_cgroup(int v2, unsigned int pid)
{
    char path[4096], text[8192];
    snprintf(path, sizeof(path), "%s/%u/cgroup", vgpu_path(VGPU_PATH_HOST_PROC), pid);
    if (read_file(path, text, sizeof(text)) <= 0)
        return 0; /* gone, or not visible: not ours */
    if (v2)
        return v2_is_root(text);
    char ours[4096], theirs[4096], self[8192];
    snprintf(path, sizeof(path), "%s/self/cgroup", vgpu_path(VGPU_PATH_PROC));
    if (read_file(path, self, sizeof(self)) <= 0 || v1_path(self, "memory", ours, sizeof(ours)) < 0 ||
        v1_path(text, "memory", theirs, sizeof(theirs)) < 0)
        return 0;
    return strcmp(ours, theirs) == 0;
}

/* Open kernel module rule: NVML gives PIDs of our own namespace; /proc/<pid> is one of ours when it
 * shares our mount and cgroup namespaces and maps the driver. */
static int in_our_namespaces(unsigned int pid)
{
    char path[4096];
    const char *procs = vgpu_path(VGPU_PATH_PROC);
    if (!same_ns(procs, pid, "mnt") || !same_ns(procs, pid, "cgroup"))
        return 0;
    snprintf(path, sizeof(path), "%s/%u/maps", procs, pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 0;
    char line[1024];
    int hit = 0;
    while (!hit && fgets(line, sizeof(line), f))
        hit = strstr(line, "nvidia") != NULL;
    fclose(f);
    return hit;
}

int vgpu_pid_is_ours(struct vgpu_membership *m, unsigned int pid)
{
    long mode = m->mode;
    if (vgpu_mode_is(mode, VGPU_MODE_CLIENT))
        return pid_in_pids_config(pid);
    int open_kernel = mode != 0 && vgpu_mode_is(mode, VGPU_MODE_OPEN_KERNEL);
    int v2 = mode != 0 && vgpu_mode_is(mode, VGPU_MODE_CGROUPV2);
    int v1 = mode != 0 && vgpu_mode_is(mode, VGPU_MODE_CGROUPV1);
    if (!v2 && !v1 && !open_kernel)
        return 1; /* host mode: every process on the device (before vgpu_path: a getenv per PID) */
    /* One list holds either host PIDs (proprietary module) or our namespace's (open module): the
     * first rule that matches a PID is kept for the rest of the list, as the reference does, so a
     * host PID that happens to number one of our own processes is not counted twice over. */
    if ((v2 || v1) && m->rule != VGPU_RULE_NAMESPACES && in_our_cgroup(v2, pid)) {
        m->rule = VGPU_RULE_CGROUP;
        return 1;
    }
    if (open_kernel && m->rule != VGPU_RULE_CGROUP && in_our_namespaces(pid)) {
        m->rule = VGPU_RULE_NAMESPACES;
        return 1;
    }
    return 0;
}

/* --- usage ----------------------------------------------------------------------------------- */

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);

#define MAX_PROCS 1024

/* Σ usedGpuMemory of our PIDs over the compute and graphics lists (a PID in both once). */
static int nvml_sum(nvmlDevice_t dev, long mode, unsigned long long *sum)
{
    static void *slots[2];
    static const char *const names[2] = {"nvmlDeviceGetComputeRunningProcesses",
                                         "nvmlDeviceGetGraphicsRunningProcesses"};
    nvmlProcessInfo_v1_t *all = malloc(2 * MAX_PROCS * sizeof(*all));
    const char *pids = NULL; /* before any goto fail; pids_mu held while set */
    unsigned int total = 0;
    if (all == NULL)
        return -1;
    for (int k = 0; k < 2; k++) {
        list_fn fn = vgpu_real_cached(&slots[k], VGPU_LIB_NVML, names[k]);
        if (fn == NULL) {
            if (k == 0)
                goto fail;
            continue;
        }
        unsigned int count = MAX_PROCS;
        nvmlReturn_t r = fn(dev, &count, all + total);
        if (r == NVML_ERROR_NOT_SUPPORTED && k == 1)
            continue;
        if (r != NVML_SUCCESS)
            goto fail;
        total += count;
    }
    struct vgpu_membership membership = {mode, VGPU_RULE_NONE};
    /* Client mode: pids.config read once for the whole list. */
    if (vgpu_mode_is(mode, VGPU_MODE_CLIENT) && total > 0 && (pids = pids_acquire()) == NULL)
        goto fail;
    *sum = 0;
    for (unsigned int i = 0; i < total; i++) {
        int dup = 0;
        for (unsigned int j = 0; j < i && !dup; j++)
            dup = all[j].pid == all[i].pid;
        if (dup || all[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE)
            continue;
        int ours = pids != NULL ? pid_listed(pids, all[i].pid) : vgpu_pid_is_ours(&membership, all[i].pid);
        if (ours < 0)
            goto fail;
        if (ours)
            *sum += all[i].usedGpuMemory;
    }
    if (pids != NULL)
        pids_release();
    free(all);
    return 0;
fail:
    if (pids != NULL)
        pids_release();
    free(all);
    return -1;
}

int vgpu_usage(int host, unsigned long long *nvml_used, unsigned long long *ledger_used)
{
    nvmlDevice_t dev = vgpu_nvml_of_host(host);
    if (dev == NULL || nvml_sum(dev, vgpu_cfg()->mode, nvml_used) < 0)
        return -1;
    *ledger_used = vgpu_ledger_sum(host, 0);
    return 0;
}

int vgpu_mem_decide(int host, unsigned long long req)
{
    const struct vgpu_device_cfg *d = &vgpu_cfg()->dev[host];
    unsigned long long used, vmem;
    if (vgpu_usage(host, &used, &vmem) < 0) {
        vgpu_log(VGPU_LOG_ERROR, "cannot read the memory usage of device %d; refusing the allocation", host);
        return -1;
    }
    if (used + vmem + req > d->total_memory && vmem > 0)
        vmem = vgpu_ledger_sum(host, 1); /* the ledger may hold dead PIDs' charges: reap, look again */
    int fits = used + vmem + req <= d->total_memory;
    vgpu_log(fits ? VGPU_LOG_VERBOSE : VGPU_LOG_INFO,
             "device %d: %s %llu bytes: the container uses %llu (NVML %llu + ledger %llu) of %llu", host,
             fits ? "admitted" : "refused", req, used + vmem, used, vmem, d->total_memory);
    if (!fits)
        return -1;
    if (d->mem_ratio > 1.0 && used + req > d->real_memory)
        return 1;
    return 0;
}

void vgpu_limited_view(unsigned long long limit, int oversold, unsigned long long physical, unsigned long long used,
                       unsigned long long *total, unsigned long long *free_)
{
    unsigned long long t = limit == 0 ? physical : oversold ? limit : (limit < physical ? limit : physical);
    *total = t;
    *free_ = used >= t ? 0 : t - used;
}

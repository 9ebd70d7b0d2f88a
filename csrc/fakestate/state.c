/* The fakes' shared GPU state: see state.h. */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FS_MAGIC 0x46475331u /* "FGS1" */
#define FS_VERSION 4u /* 3: per-device health (XIDs, lost); 4: pending stream-ordered bytes */
#define FS_MAX_SLOTS 256
#define FS_SPANS 256            /* busy spans kept exactly per slot / device; adjacent ones merge */
#define FS_BUCKETS 2048         /* and busy time per 10 ms bucket, 20.48 s of them */
#define FS_BUCKET_NS 10000000ull

typedef struct {
    uint64_t start, end;
} fs_span;

/* Busy time as exact spans, newest FS_SPANS of them, and, for what is older than those (many short
 * kernels with gaps make a span each), per 10 ms bucket: `bucket_id` says which 10 ms a slot of
 * the ring holds now. */
typedef struct {
    uint32_t head, count; /* head: the newest span */
    fs_span span[FS_SPANS];
    uint64_t bucket_id[FS_BUCKETS];
    uint64_t bucket_busy[FS_BUCKETS];
} fs_timeline;

typedef struct {
    int32_t pid; /* 0: free */
    uint32_t dev;
    uint32_t flags;
    uint32_t pad;
    uint64_t bytes;
    /* Of `bytes`, those of stream-ordered allocations NVML does not show before `pending_until`
     * (when their stream's earlier work ends). Several overlapping ones merge conservatively: the
     * sum stays hidden until the latest of their times. */
    uint64_t pending, pending_until;
    fs_timeline busy;
} fs_slot;

typedef struct {
    char uuid[FAKE_STRING_MAX];
    uint64_t total;
    uint64_t busy_until;
    fs_timeline busy;
    /* health: written under the lock, peeked at without it (atomic loads) */
    uint32_t lost;     /* 1 while the device is lost */
    uint32_t pad;
    uint64_t lost_gen; /* times it became lost */
    uint64_t xid_seq;  /* XIDs raised so far; XID n (1-based) is in xid[(n - 1) % FS_XID_RING] */
    uint64_t xid[FS_XID_RING];
} fs_device;

typedef struct {
    uint32_t magic, version, size, count;
    fs_device dev[FAKE_MAX_GPUS];
    fs_slot slot[FS_MAX_SLOTS];
} fs_file;

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static fs_file *state;
static int state_fd = -1;
static char state_path[4096];
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
/* Kernel mode (fs_attach_kernel): this process's host pid, from the fake kernel; NULL: env mode. */
static int (*kernel_pid)(void);

/* fork: the child inherits the parent's open file description, and OFD locks held through one
 * description do not exclude each other, so the child opens the file anew: by its path, or in
 * kernel mode (the file may not be in this mount namespace) through /proc/self/fd. The mutex is
 * held across fork so that no other thread's critical section is cut in half in the child. */
static void before_fork(void) { pthread_mutex_lock(&mutex); }
static void after_fork_parent(void) { pthread_mutex_unlock(&mutex); }
static void after_fork_child(void) {
    if (state_fd >= 0) {
        char by_fd[64];
        snprintf(by_fd, sizeof by_fd, "/proc/self/fd/%d", state_fd);
        int fd = open(kernel_pid ? by_fd : state_path, O_RDWR | O_CLOEXEC);
        close(state_fd);
        state_fd = fd; /* -1 if the file is gone: then the child's accesses go unlocked */
    }
    pthread_mutex_unlock(&mutex);
}
static void register_atfork(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

uint64_t fs_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int file_lock(int type) {
    if (state_fd < 0) return 0;
    struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    while (fcntl(state_fd, F_OFD_SETLKW, &fl) < 0) {
        if (errno != EINTR) return -1;
    }
    return 0;
}

/* FAKE_GPU_HOST_PROC: a procfs of the host's PID namespace (a container's view of the host /proc):
 * pids are recorded and checked as the host sees them, as a real driver's kernel module records
 * them, also from a process in a PID namespace of its own. NULL: this process's own pid view. */
static const char *host_proc(void) {
    const char *p = getenv("FAKE_GPU_HOST_PROC");
    return p && p[0] ? p : NULL;
}

/* This process's pid as the state records it: in kernel mode the fake kernel's word; else
 * getpid(), or its pid in FAKE_GPU_HOST_PROC (the `self` link there names the reader's pid in that
 * procfs's namespace); remembered per getpid(), so a forked child looks its own up. Under the
 * mutex. 0: unknown (a kernel-mode fork child the kernel did not answer): nothing is charged. */
static int self_pid(void) {
    static int for_pid, recorded;
    if (kernel_pid) return kernel_pid();
    int pid = getpid();
    const char *hp = host_proc();
    if (hp == NULL) return pid;
    if (for_pid != pid) {
        char path[4096], link[32];
        snprintf(path, sizeof path, "%s/self", hp);
        ssize_t n = readlink(path, link, sizeof link - 1);
        link[n > 0 ? n : 0] = '\0';
        recorded = n > 0 ? atoi(link) : pid;
        for_pid = pid;
    }
    return recorded;
}

static int pid_dead(int pid) {
    char path[4160], buf[512];
    const char *hp = host_proc();
    if (hp == NULL && kill(pid, 0) < 0) return errno == ESRCH;
    snprintf(path, sizeof path, "%s/%d/stat", hp ? hp : "/proc", pid);
    FILE *f = fopen(path, "r");
    if (!f) return hp != NULL; /* not in the host's procfs: gone */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

/* Drop the slots of dead pids. The caller's own slots are skipped: a process that asks is alive, and
 * the liveness test (kill, then /proc/<pid>/stat for a zombie) costs microseconds per slot, which
 * a process reading its own device's lists on each allocation would otherwise pay every time.
 * Never in kernel mode: the caller may be in a PID namespace of its own, where no host pid can be
 * checked; the fake kernel drops a process's slots when its connection closes instead. */
static void reap(void) {
    if (kernel_pid) return;
    int self = self_pid();
    for (int i = 0; i < FS_MAX_SLOTS; i++) {
        fs_slot *s = &state->slot[i];
        if (s->pid != 0 && s->pid != self && pid_dead(s->pid)) memset(s, 0, sizeof *s);
    }
}

static void lock(void) {
    pthread_mutex_lock(&mutex);
    file_lock(F_WRLCK);
}

/* lock(), then drop dead pids: for what reads or charges memory, as a real driver frees a process's
 * memory when it dies. Not on the launch path: kill(2) per slot is too dear there. */
static void lock_reaped(void) {
    lock();
    reap();
}

static void unlock(void) {
    file_lock(F_UNLCK);
    pthread_mutex_unlock(&mutex);
}

/* Write the header and devices of a new state; the rest of a new file (or anonymous mapping) is
 * zeros already, and stays untouched (sparse) until used. */
static void fill(fs_file *f, const fake_profile *p) {
    f->version = FS_VERSION;
    f->size = sizeof *f;
    f->count = p->count;
    for (unsigned int i = 0; i < p->count; i++) {
        strcpy(f->dev[i].uuid, p->by_index[i]->uuid);
        f->dev[i].total = p->by_index[i]->memory;
    }
    __atomic_store_n(&f->magic, FS_MAGIC, __ATOMIC_RELEASE);
}

static int matches(const fs_file *f, const fake_profile *p) {
    if (f->magic != FS_MAGIC || f->version != FS_VERSION || f->size != sizeof *f || f->count != p->count)
        return 0;
    for (unsigned int i = 0; i < p->count; i++)
        if (strcmp(f->dev[i].uuid, p->by_index[i]->uuid) != 0 || f->dev[i].total != p->by_index[i]->memory)
            return 0;
    return 1;
}

/* Map the state file open on `fd` (state_fd) for `profile`, under its lock: an empty file is sized
 * and filled, an existing one must have been made for the same GPUs. `label` names it in *why.
 * 0 with *out set, or -1. */
static int map_file(int fd, const fake_profile *profile, const char *label, fs_file **out, char *why,
                    unsigned long why_size) {
    struct stat st;
    int rc = 0;
    if (file_lock(F_WRLCK) < 0 || fstat(fd, &st) < 0) {
        snprintf(why, why_size, "%s: lock: %s", label, strerror(errno));
        rc = -1;
    } else if (st.st_size != 0 && st.st_size != (off_t)sizeof(fs_file)) {
        snprintf(why, why_size, "%s: %lld bytes, not a state file of this version", label, (long long)st.st_size);
        rc = -1;
    } else if (st.st_size == 0 && ftruncate(fd, sizeof(fs_file)) < 0) {
        snprintf(why, why_size, "%s: ftruncate: %s", label, strerror(errno));
        rc = -1;
    }
    void *m = MAP_FAILED;
    if (rc == 0) {
        m = mmap(NULL, sizeof(fs_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(why, why_size, "%s: mmap: %s", label, strerror(errno));
            rc = -1;
        }
    }
    if (rc == 0) {
        fs_file *f = m;
        if (f->magic == 0) {
            fill(f, profile);
        } else if (!matches(f, profile)) {
            snprintf(why, why_size, "%s: was created for other GPUs than this profile's", label);
            munmap(m, sizeof(fs_file));
            rc = -1;
        }
    }
    file_lock(F_UNLCK);
    *out = rc == 0 ? m : NULL;
    return rc;
}

/* Map the file open on `fd` as this process's state (owning fd). Under the mutex. */
static int attach_fd(int fd, const fake_profile *profile, const char *label, char *why, unsigned long why_size) {
    state_fd = fd;
    if (map_file(fd, profile, label, &state, why, why_size) == 0) return 0;
    close(fd);
    state_fd = -1;
    return -1;
}

/* Open (creating it) and map the state file at `path`. Under the mutex. */
static int attach_path(const fake_profile *profile, const char *path, const char *what, char *why,
                       unsigned long why_size) {
    char label[300];
    snprintf(label, sizeof label, "%s %.200s", what, path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(why, why_size, "%s: %s", label, strerror(errno));
        return -1;
    }
    if (attach_fd(fd, profile, label, why, why_size) < 0) return -1;
    snprintf(state_path, sizeof state_path, "%s", path);
    return 0;
}

static int attach_private(const fake_profile *profile, char *why, unsigned long why_size) {
    void *m = mmap(NULL, sizeof(fs_file), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        snprintf(why, why_size, "private state: mmap: %s", strerror(errno));
        return -1;
    }
    fill(m, profile);
    state = m;
    return 0;
}

int fs_attach(const fake_profile *profile, char *why, unsigned long why_size) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&mutex);
    int rc = 0;
    if (state == NULL) {
        const char *path = getenv("FAKE_GPU_STATE");
        rc = path == NULL || path[0] == '\0' ? attach_private(profile, why, why_size)
                                              : attach_path(profile, path, "FAKE_GPU_STATE", why, why_size);
    }
    pthread_mutex_unlock(&mutex);
    return rc;
}

int fs_attach_file(const fake_profile *profile, const char *path, char *why, unsigned long why_size) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&mutex);
    int rc = state ? 0 : attach_path(profile, path, "state file", why, why_size);
    pthread_mutex_unlock(&mutex);
    return rc;
}

int fs_attach_kernel(const fake_profile *profile, int fd, int (*host_pid)(void), char *why,
                     unsigned long why_size) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&mutex);
    int rc = 0;
    if (state) {
        close(fd);
    } else if ((rc = attach_fd(fd, profile, "the fake kernel's state file", why, why_size)) == 0) {
        kernel_pid = host_pid;
        state_path[0] = '\0';
    }
    pthread_mutex_unlock(&mutex);
    return rc;
}

void fs_detach(void) {
    pthread_mutex_lock(&mutex);
    if (state) munmap(state, sizeof *state);
    if (state_fd >= 0) close(state_fd);
    state = NULL;
    state_fd = -1;
    kernel_pid = NULL;
    pthread_mutex_unlock(&mutex);
}

void fs_drop_pid(int pid) {
    if (state == NULL || pid <= 0) return;
    lock();
    for (int i = 0; i < FS_MAX_SLOTS; i++)
        if (state->slot[i].pid == pid) memset(&state->slot[i], 0, sizeof state->slot[i]);
    unlock();
}

void fs_reap_dead(void) {
    if (state == NULL) return;
    lock_reaped();
    unlock();
}

/* The slot of (dev, pid), made when `create`; NULL for an unknown pid (0 marks a free slot). */
static fs_slot *find_slot(unsigned int dev, int pid, int create) {
    if (pid <= 0) return NULL;
    fs_slot *free_slot = NULL;
    for (int i = 0; i < FS_MAX_SLOTS; i++) {
        fs_slot *s = &state->slot[i];
        if (s->pid == pid && s->dev == dev) return s;
        if (s->pid == 0 && free_slot == NULL) free_slot = s;
    }
    if (!create || free_slot == NULL) return NULL;
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->pid = pid;
    free_slot->dev = dev;
    return free_slot;
}

static void drop_if_idle(fs_slot *s) {
    if (s->bytes == 0 && s->flags == 0) memset(s, 0, sizeof *s);
}

static int valid_dev(unsigned int dev) { return state && dev < state->count; }

/* The bytes of slot `s` NVML shows at `now`: all but those still pending. */
static uint64_t visible_bytes(const fs_slot *s, uint64_t now) {
    return now < s->pending_until ? s->bytes - s->pending : s->bytes;
}

/* Bytes held on `dev`: as NVML shows them at `now`, or all of them (reserved) when now is 0. */
static uint64_t device_used(unsigned int dev, uint64_t now) {
    uint64_t used = 0;
    for (int i = 0; i < FS_MAX_SLOTS; i++) {
        const fs_slot *s = &state->slot[i];
        if (s->pid != 0 && s->dev == dev) used += now ? visible_bytes(s, now) : s->bytes;
    }
    return used;
}

/* A new pending charge of `bytes` until `until` merged into the slot's (see fs_slot). */
static void add_pending(fs_slot *s, uint64_t bytes, uint64_t until, uint64_t now) {
    if (now >= s->pending_until) s->pending = 0; /* the earlier ones are visible already */
    s->pending += bytes;
    if (until > s->pending_until) s->pending_until = until;
}

int fs_mem_alloc_at(unsigned int dev, uint64_t bytes, uint64_t visible_ns) {
    if (!valid_dev(dev)) return -1;
    lock_reaped();
    uint64_t used = device_used(dev, 0), now = fs_now_ns();
    int rc = -1;
    fs_slot *s;
    if (used <= state->dev[dev].total && bytes <= state->dev[dev].total - used &&
        (s = find_slot(dev, self_pid(), 1)) != NULL) {
        s->bytes += bytes;
        if (visible_ns > now) add_pending(s, bytes, visible_ns, now);
        rc = 0;
    }
    unlock();
    return rc;
}

int fs_mem_alloc(unsigned int dev, uint64_t bytes) { return fs_mem_alloc_at(dev, bytes, 0); }

void fs_mem_free(unsigned int dev, uint64_t bytes) {
    if (!valid_dev(dev)) return;
    lock();
    fs_slot *s = find_slot(dev, self_pid(), 0);
    if (s) {
        s->bytes = s->bytes > bytes ? s->bytes - bytes : 0;
        if (s->pending > s->bytes) s->pending = s->bytes;
        drop_if_idle(s);
    }
    unlock();
}

static uint64_t mem_used(unsigned int dev, int reserved) {
    if (!valid_dev(dev)) return 0;
    lock_reaped();
    uint64_t used = device_used(dev, reserved ? 0 : fs_now_ns());
    unlock();
    return used;
}

uint64_t fs_mem_used(unsigned int dev) { return mem_used(dev, 0); }
uint64_t fs_mem_reserved(unsigned int dev) { return mem_used(dev, 1); }

uint64_t fs_mem_total(unsigned int dev) { return valid_dev(dev) ? state->dev[dev].total : 0; }

void fs_context(unsigned int dev, int present) {
    if (!valid_dev(dev)) return;
    lock();
    fs_slot *s = find_slot(dev, self_pid(), present);
    if (s) {
        if (present) {
            const char *g = getenv("FAKE_GPU_GRAPHICS");
            s->flags |= FS_FLAG_CONTEXT | (g && strcmp(g, "1") == 0 ? FS_FLAG_GRAPHICS : 0u);
        } else {
            s->flags = 0;
            drop_if_idle(s);
        }
    }
    unlock();
}

unsigned int fs_processes(unsigned int dev, uint32_t flags, fs_proc *out, unsigned int max) {
    if (!valid_dev(dev)) return 0;
    unsigned int n = 0;
    uint64_t now = fs_now_ns();
    lock_reaped();
    for (int i = 0; i < FS_MAX_SLOTS; i++) {
        fs_slot *s = &state->slot[i];
        if (s->pid == 0 || s->dev != dev) continue;
        uint64_t bytes = visible_bytes(s, now);
        int listed = (s->flags & flags) != 0 || ((flags & FS_FLAG_CONTEXT) && bytes > 0);
        if (!listed) continue;
        if (n < max) out[n] = (fs_proc){s->pid, s->flags, bytes};
        n++;
    }
    unlock();
    return n;
}

static void add_buckets(fs_timeline *t, uint64_t start, uint64_t end) {
    if (end - start > (FS_BUCKETS / 2) * FS_BUCKET_NS) end = start + (FS_BUCKETS / 2) * FS_BUCKET_NS;
    for (uint64_t b = start / FS_BUCKET_NS; b * FS_BUCKET_NS < end; b++) {
        uint64_t *id = &t->bucket_id[b % FS_BUCKETS], *busy = &t->bucket_busy[b % FS_BUCKETS];
        if (*id != b) {
            *id = b;
            *busy = 0;
        }
        uint64_t lo = b * FS_BUCKET_NS > start ? b * FS_BUCKET_NS : start;
        uint64_t hi = (b + 1) * FS_BUCKET_NS < end ? (b + 1) * FS_BUCKET_NS : end;
        *busy += hi - lo;
    }
}

static void add_span(fs_timeline *t, uint64_t start, uint64_t end) {
    add_buckets(t, start, end);
    if (t->count > 0) {
        fs_span *last = &t->span[t->head];
        if (start <= last->end) {
            if (end > last->end) last->end = end;
            return;
        }
        t->head = (t->head + 1) % FS_SPANS;
    }
    t->span[t->head] = (fs_span){start, end};
    if (t->count < FS_SPANS) t->count++;
}

/* Busy time in [t0, t1) from the buckets, a partly covered bucket counted pro rata. */
static uint64_t bucket_overlap(const fs_timeline *t, uint64_t t0, uint64_t t1) {
    uint64_t sum = 0;
    for (uint64_t b = t0 / FS_BUCKET_NS; b * FS_BUCKET_NS < t1; b++) {
        if (t->bucket_id[b % FS_BUCKETS] != b) continue;
        uint64_t lo = b * FS_BUCKET_NS > t0 ? b * FS_BUCKET_NS : t0;
        uint64_t hi = (b + 1) * FS_BUCKET_NS < t1 ? (b + 1) * FS_BUCKET_NS : t1;
        sum += (uint64_t)((double)t->bucket_busy[b % FS_BUCKETS] * (double)(hi - lo) / (double)FS_BUCKET_NS);
    }
    return sum;
}

/* Busy time in [t0, t1): exact where the spans reach, from the buckets before the oldest kept span. */
static uint64_t overlap(const fs_timeline *t, uint64_t t0, uint64_t t1) {
    uint64_t sum = 0;
    for (uint32_t k = 0; k < t->count; k++) {
        const fs_span *s = &t->span[(t->head + FS_SPANS - k) % FS_SPANS];
        uint64_t a = s->start > t0 ? s->start : t0, b = s->end < t1 ? s->end : t1;
        if (b > a) sum += b - a;
        if (s->end <= t0) return sum; /* older spans end earlier still: the spans covered t0 */
    }
    if (t->count == FS_SPANS) { /* spans were dropped: what is older than the oldest kept one */
        uint64_t oldest = t->span[(t->head + 1) % FS_SPANS].start;
        if (t0 < oldest) sum += bucket_overlap(t, t0, oldest < t1 ? oldest : t1);
    }
    return sum;
}

uint64_t fs_launch(unsigned int dev, uint64_t cost_ns) {
    uint64_t now = fs_now_ns();
    if (!valid_dev(dev)) return now;
    lock();
    fs_device *d = &state->dev[dev];
    uint64_t start = d->busy_until > now ? d->busy_until : now, end = start + cost_ns;
    if (cost_ns > 0) {
        d->busy_until = end;
        add_span(&d->busy, start, end);
        fs_slot *s = find_slot(dev, self_pid(), 1);
        if (s) {
            s->flags |= FS_FLAG_CONTEXT;
            add_span(&s->busy, start, end);
        }
    }
    unlock();
    return end;
}

unsigned int fs_busy_by_pid(unsigned int dev, uint64_t t0, uint64_t t1, fs_busy *out, unsigned int max) {
    if (!valid_dev(dev)) return 0;
    unsigned int n = 0;
    lock_reaped();
    for (int i = 0; i < FS_MAX_SLOTS; i++) {
        fs_slot *s = &state->slot[i];
        if (s->pid == 0 || s->dev != dev) continue;
        uint64_t busy = overlap(&s->busy, t0, t1);
        if (busy == 0) continue;
        if (n < max) out[n] = (fs_busy){s->pid, busy};
        n++;
    }
    unlock();
    return n;
}

uint64_t fs_busy_device(unsigned int dev, uint64_t t0, uint64_t t1) {
    if (!valid_dev(dev)) return 0;
    lock();
    uint64_t busy = overlap(&state->dev[dev].busy, t0, t1);
    unlock();
    return busy;
}

/* ---- health ------------------------------------------------------------------------------ */

uint64_t fs_xid_seq(unsigned int dev) {
    return valid_dev(dev) ? __atomic_load_n(&state->dev[dev].xid_seq, __ATOMIC_ACQUIRE) : 0;
}

int fs_next_xid(unsigned int dev, uint64_t *seen, uint64_t *xid) {
    if (!valid_dev(dev) || fs_xid_seq(dev) == *seen) return 0; /* the common case: no lock taken */
    lock();
    fs_device *d = &state->dev[dev];
    int got = 0;
    if (d->xid_seq > *seen) {
        uint64_t next = d->xid_seq - *seen > FS_XID_RING ? d->xid_seq - FS_XID_RING + 1 : *seen + 1;
        *xid = d->xid[(next - 1) % FS_XID_RING];
        *seen = next;
        got = 1;
    } else {
        *seen = d->xid_seq;
    }
    unlock();
    return got;
}

int fs_lost(unsigned int dev) {
    return valid_dev(dev) && __atomic_load_n(&state->dev[dev].lost, __ATOMIC_ACQUIRE) != 0;
}

uint64_t fs_lost_gen(unsigned int dev) {
    return valid_dev(dev) ? __atomic_load_n(&state->dev[dev].lost_gen, __ATOMIC_ACQUIRE) : 0;
}

/* Map the state file at `path` for one change, locked; NULL with *why set when it is no state file
 * of this version or `dev` is not one of its devices. */
static fs_file *control_open(const char *path, unsigned int dev, int *fd, char *why, unsigned long why_size) {
    *fd = open(path, O_RDWR | O_CLOEXEC);
    if (*fd < 0) {
        snprintf(why, why_size, "state file %.200s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    void *m = MAP_FAILED;
    if (fstat(*fd, &st) < 0) {
        snprintf(why, why_size, "state file %.200s: fstat: %s", path, strerror(errno));
    } else if (st.st_size != (off_t)sizeof(fs_file)) {
        snprintf(why, why_size, "state file %.200s: not a state file of version %u (%lld bytes)", path,
                 FS_VERSION, (long long)st.st_size);
    } else if ((m = mmap(NULL, sizeof(fs_file), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0)) == MAP_FAILED) {
        snprintf(why, why_size, "state file %.200s: mmap: %s", path, strerror(errno));
    } else {
        while (fcntl(*fd, F_OFD_SETLKW, &fl) < 0 && errno == EINTR) {
        }
        fs_file *f = m;
        if (f->magic != FS_MAGIC || f->version != FS_VERSION || f->size != sizeof *f) {
            snprintf(why, why_size, "state file %.200s: not a state file of version %u", path, FS_VERSION);
        } else if (dev >= f->count) {
            snprintf(why, why_size, "state file %.200s: no GPU %u (it has %u)", path, dev, f->count);
        } else {
            return f;
        }
        munmap(m, sizeof(fs_file));
    }
    close(*fd);
    return NULL;
}

static void control_close(fs_file *f, int fd) {
    munmap(f, sizeof *f);
    close(fd); /* drops the OFD lock */
}

int fs_file_raise_xid(const char *path, unsigned int dev, uint64_t xid, char *why, unsigned long why_size) {
    int fd;
    fs_file *f = control_open(path, dev, &fd, why, why_size);
    if (f == NULL) return -1;
    fs_device *d = &f->dev[dev];
    uint64_t seq = d->xid_seq + 1;
    d->xid[(seq - 1) % FS_XID_RING] = xid;
    __atomic_store_n(&d->xid_seq, seq, __ATOMIC_RELEASE);
    control_close(f, fd);
    return 0;
}

int fs_file_set_lost(const char *path, unsigned int dev, int lost, char *why, unsigned long why_size) {
    int fd;
    fs_file *f = control_open(path, dev, &fd, why, why_size);
    if (f == NULL) return -1;
    fs_device *d = &f->dev[dev];
    if (lost && !d->lost) __atomic_store_n(&d->lost_gen, d->lost_gen + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&d->lost, lost ? 1u : 0u, __ATOMIC_RELEASE);
    control_close(f, fd);
    return 0;
}

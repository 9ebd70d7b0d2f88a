/* See ledger.h. */
#include "ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vgpu_files.h"
#include "vgpu_paths.h"

static int ledger_fd = -1;
static struct vgpu_vmem_node *node;
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
/* The byte locks are OFD locks on our one descriptor, which every thread shares: they exclude
 * other processes only, so threads of this process also take this mutex. */
static pthread_mutex_t update_lock = PTHREAD_MUTEX_INITIALIZER;

static int ofd_lock(int fd, short type, off_t start, off_t len)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    int rc;
    while ((rc = fcntl(fd, F_OFD_SETLKW, &fl)) < 0 && errno == EINTR)
        ;
    if (rc < 0 && errno == EINVAL) { /* kernel without OFD locks */
        while ((rc = fcntl(fd, F_SETLKW, &fl)) < 0 && errno == EINTR)
            ;
    }
    return rc;
}

static int header_ok(const struct vgpu_vmem_node *n)
{
    return n->magic == VGPU_VMEM_MAGIC && n->layout == VGPU_VMEM_LAYOUT && n->size == VGPU_VMEM_STRUCT_SIZE &&
           n->count == VGPU_MAX_DEVICES;
}

/* Open (creating if `create`) and map the ledger; a bad header is rebuilt in place. */
static struct vgpu_vmem_node *ledger(int create)
{
    struct vgpu_vmem_node *n = __atomic_load_n(&node, __ATOMIC_ACQUIRE);
    if (n != NULL)
        return n;
    pthread_mutex_lock(&open_lock);
    if (node != NULL) {
        pthread_mutex_unlock(&open_lock);
        return node;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/vmem_node.config", vgpu_path(VGPU_PATH_VMEM_NODE_DIR));
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0666);
    if (fd >= 0) {
        fchmod(fd, 0666);
        ofd_lock(fd, F_WRLCK, 0, VGPU_VMEM_DEVICES_OFFSET); /* the header */
        /* lseek, not fstat: no GLIBC_2.33 symbol (see glibc_compat.h). */
        off_t size = lseek(fd, 0, SEEK_END);
        if (size >= 0 && size < (off_t)VGPU_VMEM_FILE_SIZE)
            if (ftruncate(fd, VGPU_VMEM_FILE_SIZE) < 0) {
                close(fd);
                fd = -1;
            }
    }
    if (fd >= 0) {
        n = mmap(NULL, VGPU_VMEM_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (n == MAP_FAILED) {
            close(fd);
            fd = -1;
            n = NULL;
        } else if (!header_ok(n)) {
            memset(n, 0, VGPU_VMEM_STRUCT_SIZE);
            n->layout = VGPU_VMEM_LAYOUT;
            n->size = VGPU_VMEM_STRUCT_SIZE;
            n->count = VGPU_MAX_DEVICES;
            __atomic_store_n(&n->magic, VGPU_VMEM_MAGIC, __ATOMIC_RELEASE);
        }
        if (fd >= 0)
            ofd_lock(fd, F_UNLCK, 0, VGPU_VMEM_DEVICES_OFFSET);
    }
    ledger_fd = fd;
    __atomic_store_n(&node, n, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&open_lock);
    return n;
}

static int pid_alive(int pid)
{
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 0;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return 1;
    size_t r = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[r] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return !(close_paren != NULL && close_paren[1] == ' ' && close_paren[2] == 'Z');
}

/* Under the device's byte lock: apply `delta` to `pid` (signed), or drop its entry. `in_signal`:
 * called from a signal handler, so give up rather than wait for a lock the interrupted thread
 * may hold (a dead PID's entry is reaped later anyway). */
static void update(int host, int pid, long long delta, int drop, int in_signal)
{
    struct vgpu_vmem_node *n = in_signal ? __atomic_load_n(&node, __ATOMIC_ACQUIRE) : ledger(delta > 0);
    if (n == NULL || host < 0 || host >= VGPU_MAX_DEVICES)
        return;
    if (in_signal ? pthread_mutex_trylock(&update_lock) != 0 : pthread_mutex_lock(&update_lock) != 0)
        return;
    struct vgpu_vmem_device *d = &n->devices[host];
    ofd_lock(ledger_fd, F_WRLCK, (off_t)VGPU_VMEM_LOCK_OFFSET(host), 1);
    uint32_t size = d->processes_size <= VGPU_VMEM_MAX_PROCESSES ? d->processes_size : VGPU_VMEM_MAX_PROCESSES;
    uint32_t i;
    for (i = 0; i < size && d->processes[i].pid != pid; i++)
        ;
    if (i == size && delta > 0 && size < VGPU_VMEM_MAX_PROCESSES) {
        d->processes[size] = (struct vgpu_vmem_process){.pid = pid, .used = 0};
        d->processes_size = ++size;
    }
    if (i < size) {
        struct vgpu_vmem_process *p = &d->processes[i];
        if (drop || (delta < 0 && (unsigned long long)-delta >= p->used)) {
            d->processes[i] = d->processes[size - 1]; /* keep [0, size) compact */
            d->processes_size = size - 1;
        } else {
            p->used += (unsigned long long)delta;
        }
    }
    ofd_lock(ledger_fd, F_UNLCK, (off_t)VGPU_VMEM_LOCK_OFFSET(host), 1);
    pthread_mutex_unlock(&update_lock);
}

int vgpu_ledger_add(int host, unsigned long long bytes)
{
    if (ledger(1) == NULL)
        return -1;
    update(host, getpid(), (long long)bytes, 0, 0);
    return 0;
}

void vgpu_ledger_sub(int host, unsigned long long bytes) { update(host, getpid(), -(long long)bytes, 0, 0); }

unsigned long long vgpu_ledger_sum(int host, int reap)
{
    /* Created here if missing, so that it is mapped once rather than looked for on every call. */
    struct vgpu_vmem_node *n = ledger(1);
    if (n == NULL || host < 0 || host >= VGPU_MAX_DEVICES)
        return 0;
    struct vgpu_vmem_device *d = &n->devices[host];
    /* Nothing charged: no lock needed. Entries are added only under the device's allocation lock,
     * which the deciding caller holds, so an empty ledger cannot fill up behind its back. */
    if (__atomic_load_n(&d->processes_size, __ATOMIC_ACQUIRE) == 0)
        return 0;
    pthread_mutex_lock(&update_lock);
    ofd_lock(ledger_fd, F_WRLCK, (off_t)VGPU_VMEM_LOCK_OFFSET(host), 1);
    unsigned long long sum = 0;
    for (uint32_t i = 0; i < d->processes_size && i < VGPU_VMEM_MAX_PROCESSES;) {
        if (reap && !pid_alive(d->processes[i].pid)) {
            d->processes[i] = d->processes[d->processes_size - 1];
            d->processes_size--;
            continue;
        }
        sum += d->processes[i++].used;
    }
    ofd_lock(ledger_fd, F_UNLCK, (off_t)VGPU_VMEM_LOCK_OFFSET(host), 1);
    pthread_mutex_unlock(&update_lock);
    return sum;
}

/* --- this process's charged allocations ----------------------------------------------------- */

enum charge_kind { CHARGE_UVA, CHARGE_CAPTURE };

struct tracked {
    unsigned long long dptr, bytes;
    int host;
    enum charge_kind kind;
    unsigned long long capture; /* CHARGE_CAPTURE: the capture's id */
    struct tracked *next;
};
static struct tracked *tracked_list;
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;

static void track(struct tracked entry)
{
    struct tracked *t = malloc(sizeof(*t));
    if (t == NULL)
        return;
    *t = entry;
    pthread_mutex_lock(&track_lock);
    t->next = tracked_list;
    tracked_list = t;
    pthread_mutex_unlock(&track_lock);
}

void vgpu_ledger_track(unsigned long long dptr, unsigned long long bytes, int host)
{
    track((struct tracked){dptr, bytes, host, CHARGE_UVA, 0, NULL});
}

void vgpu_ledger_track_capture(unsigned long long dptr, unsigned long long bytes, int host,
                               unsigned long long capture)
{
    track((struct tracked){dptr, bytes, host, CHARGE_CAPTURE, capture, NULL});
}

void vgpu_ledger_retire_capture(unsigned long long capture)
{
    struct tracked *done = NULL;
    pthread_mutex_lock(&track_lock);
    for (struct tracked **pp = &tracked_list; *pp != NULL;) {
        struct tracked *t = *pp;
        if (t->kind == CHARGE_CAPTURE && t->capture == capture) {
            *pp = t->next;
            t->next = done;
            done = t;
        } else {
            pp = &t->next;
        }
    }
    pthread_mutex_unlock(&track_lock);
    while (done != NULL) { /* the file's lock is taken off track_lock */
        struct tracked *t = done;
        done = t->next;
        vgpu_ledger_sub(t->host, t->bytes);
        free(t);
    }
}

int vgpu_ledger_untrack(unsigned long long dptr, int *host, unsigned long long *bytes)
{
    pthread_mutex_lock(&track_lock);
    for (struct tracked **pp = &tracked_list; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->dptr == dptr) {
            struct tracked *t = *pp;
            *pp = t->next;
            pthread_mutex_unlock(&track_lock);
            *host = t->host;
            *bytes = t->bytes;
            free(t);
            return 1;
        }
    }
    pthread_mutex_unlock(&track_lock);
    return 0;
}

static void drop_self(int in_signal)
{
    if (__atomic_load_n(&node, __ATOMIC_ACQUIRE) == NULL)
        return; /* never charged anything */
    for (int h = 0; h < VGPU_MAX_DEVICES; h++)
        update(h, getpid(), 0, 1, in_signal);
}

void vgpu_ledger_drop_self(void) { drop_self(0); }

static struct sigaction old_term, old_int, old_abrt;

static void on_signal(int sig)
{
    drop_self(1);
    struct sigaction *old = sig == SIGTERM ? &old_term : sig == SIGINT ? &old_int : &old_abrt;
    if ((old->sa_flags & SA_SIGINFO) == 0 && old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
        old->sa_handler(sig);
        return;
    }
    if ((old->sa_flags & SA_SIGINFO) != 0) {
        old->sa_sigaction(sig, NULL, NULL);
        return;
    }
    if (old->sa_handler == SIG_IGN)
        return;
    /* Default action: restore it and re-raise so the process dies of this signal. */
    sigaction(sig, old, NULL);
    raise(sig);
}

static void chain(int sig, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(sig, NULL, old) == 0 && old->sa_handler != SIG_IGN)
        sigaction(sig, &sa, NULL);
}

void vgpu_ledger_install_exit_handlers(void)
{
    atexit(vgpu_ledger_drop_self);
    chain(SIGTERM, &old_term);
    chain(SIGINT, &old_int);
    chain(SIGABRT, &old_abrt);
}

void vgpu_ledger_after_fork(void)
{
    /* The child owns no ledger entries and no allocations of the parent. Its inherited descriptor
     * shares the parent's open file description, hence the parent's OFD locks: it must open its
     * own. The list nodes are leaked rather than freed: another parent thread may have been
     * mid-update when it forked, and so the mutexes start afresh. */
    tracked_list = NULL;
    pthread_mutex_init(&track_lock, NULL);
    pthread_mutex_init(&update_lock, NULL);
    pthread_mutex_init(&open_lock, NULL);
    if (node != NULL)
        munmap(node, VGPU_VMEM_FILE_SIZE);
    if (ledger_fd >= 0)
        close(ledger_fd);
    node = NULL;
    ledger_fd = -1;
}

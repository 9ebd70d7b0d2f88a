/* The shared bucket file (see core_shared.h). */
#include "core_shared.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core_bucket.h"

/* Whole-file (len 0) or one-byte OFD lock; F_SETLK(W) where the kernel lacks OFD locks (EINVAL). */
static int ofd_lock(int fd, short type, off_t start, off_t len, bool wait)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    int rc;
    do
        rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno == EINVAL) {
        fl.l_pid = 0;
        do
            rc = fcntl(fd, wait ? F_SETLKW : F_SETLK, &fl);
        while (rc < 0 && errno == EINTR);
    }
    return rc;
}

static bool header_ok(const struct vgpu_sm_node *n)
{
    return __atomic_load_n(&n->magic, __ATOMIC_ACQUIRE) == VGPU_SM_MAGIC && n->layout == VGPU_SM_LAYOUT &&
           n->size == VGPU_SM_STRUCT_SIZE && n->count == VGPU_MAX_DEVICES;
}

int core_shared_open(struct core_shared *s, const char *dir, char *err, size_t cap)
{
    *s = (struct core_shared){.fd = -1, .lock_fd = -1};
    char path[256];
    if (snprintf(path, sizeof(path), "%s/sm_node.config", dir) >= (int)sizeof(path) ||
        snprintf(s->lock_path, sizeof(s->lock_path), "%s/sm_node.lock", dir) >= (int)sizeof(s->lock_path)) {
        snprintf(err, cap, "sm_node directory path too long: %s", dir);
        return -1;
    }
    if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
        snprintf(err, cap, "mkdir %s: %s", dir, strerror(errno));
        return -1;
    }
    s->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (s->fd < 0) {
        snprintf(err, cap, "open %s: %s", path, strerror(errno));
        return -1;
    }
    if (ofd_lock(s->fd, F_WRLCK, 0, 1, true) < 0) {
        snprintf(err, cap, "lock %s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(s->fd, &st) < 0) {
        snprintf(err, cap, "stat %s: %s", path, strerror(errno));
        goto fail;
    }
    bool fresh = st.st_size != VGPU_SM_FILE_SIZE;
    if (fresh && (ftruncate(s->fd, 0) < 0 || ftruncate(s->fd, VGPU_SM_FILE_SIZE) < 0)) {
        snprintf(err, cap, "size %s: %s", path, strerror(errno));
        goto fail;
    }
    void *map = mmap(NULL, VGPU_SM_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (map == MAP_FAILED) {
        snprintf(err, cap, "mmap %s: %s", path, strerror(errno));
        goto fail;
    }
    s->node = map;
    if (!header_ok(s->node)) { /* rebuilt in place: zero everything, the header last */
        memset(s->node, 0, VGPU_SM_FILE_SIZE);
        s->node->layout = VGPU_SM_LAYOUT;
        s->node->size = VGPU_SM_STRUCT_SIZE;
        s->node->count = VGPU_MAX_DEVICES;
        __atomic_store_n(&s->node->magic, VGPU_SM_MAGIC, __ATOMIC_RELEASE);
    }
    ofd_lock(s->fd, F_UNLCK, 0, 1, false);
    return 0;
fail:
    close(s->fd);
    s->fd = -1;
    return -1;
}

void core_shared_close(struct core_shared *s)
{
    if (s->node)
        munmap(s->node, VGPU_SM_FILE_SIZE);
    if (s->fd >= 0)
        close(s->fd);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    *s = (struct core_shared){.fd = -1, .lock_fd = -1};
}

struct vgpu_sm_device *core_shared_device(struct core_shared *s, int d, int64_t ceiling, int hard, int soft,
                                          int64_t first_share)
{
    if (d < 0 || d >= VGPU_MAX_DEVICES)
        return NULL;
    struct vgpu_sm_device *dev = &s->node->devices[d];
    int32_t inactive = 0;
    /* active: 0 never used, 2 being set up by one process, 1 ready. The loser of the CAS waits for 1;
     * if the winner died half-way (2 for over a second), the waiter sets the device up itself. */
    bool mine = __atomic_compare_exchange_n(&dev->active, &inactive, 2, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    for (int waited = 0; !mine && __atomic_load_n(&dev->active, __ATOMIC_ACQUIRE) != 1; waited++) {
        if (waited == 10000)
            mine = true;
        else
            usleep(100);
    }
    if (mine) {
        __atomic_store_n(&dev->ceiling, ceiling, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->hard_core, hard, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->soft_core, soft, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->limit, hard, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->share, first_share, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->tokens, first_share < ceiling ? first_share : ceiling, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->active, 1, __ATOMIC_RELEASE);
    }
    return dev;
}

bool core_shared_try_sampler(struct core_shared *s)
{
    if (s->lock_fd >= 0)
        return true;
    int fd = open(s->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return false;
    if (ofd_lock(fd, F_WRLCK, 0, 0, false) < 0) {
        close(fd);
        return false;
    }
    s->lock_fd = fd;
    return true;
}

void core_shared_heartbeat(struct core_shared *s, uint64_t now_ns)
{
    __atomic_store_n(&s->node->sampler_pid, (int32_t)getpid(), __ATOMIC_RELAXED);
    __atomic_store_n(&s->node->sampler_heartbeat_ns, now_ns, __ATOMIC_RELEASE);
}

bool core_shared_sampler_stale(const struct core_shared *s, uint64_t now_ns, uint64_t stale_ns)
{
    uint64_t beat = __atomic_load_n(&s->node->sampler_heartbeat_ns, __ATOMIC_ACQUIRE);
    return beat == 0 || now_ns - beat > stale_ns;
}

bool core_shared_refill(struct vgpu_sm_device *dev, uint64_t now_ns, int64_t add, int64_t cap, int64_t *after)
{
    uint64_t last = __atomic_load_n(&dev->last_refill_ns, __ATOMIC_ACQUIRE);
    if (last != 0 && (now_ns < last || now_ns - last < VGPU_SM_REFILL_PERIOD_NS))
        return false;
    if (!__atomic_compare_exchange_n(&dev->last_refill_ns, &last, now_ns, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return false;
    int64_t ceiling = __atomic_load_n(&dev->ceiling, __ATOMIC_RELAXED);
    int64_t level = core_bucket_refill(&dev->tokens, add, cap < ceiling ? cap : ceiling);
    if (after)
        *after = level;
    return true;
}

void core_shared_after_fork(struct core_shared *s)
{
    if (s->lock_fd >= 0) {
        close(s->lock_fd);
        s->lock_fd = -1;
    }
}

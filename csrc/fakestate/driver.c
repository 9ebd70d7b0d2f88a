/* How a fake library finds its GPUs, its state and its caller: see driver.h. */
#include "driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>

#include "kernel.h"
#include "state.h"

#define NVIDIA_MAJOR 195
#define KERNEL_TIMEOUT_S 10 /* a kernel that accepts but never answers must not hang its caller */

/* The NVIDIA container toolkit's library directories. Longest first: "/usr/lib" must win over "/lib". */
static const char *const lib_dirs[] = {
    "/usr/lib/x86_64-linux-gnu/nvidia/current", "/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib", NULL,
};

static struct {
    int kernel;                 /* kernel mode */
    char root[PATH_MAX];        /* the driver root, "" for / */
    char socket[PATH_MAX + 64]; /* the fake kernel's */
    int conn;                   /* this process's connection (its open device file), or -1 */
    int host_pid;               /* what the kernel says this process is (0: unknown) */
    pid_t asked_as;             /* getpid() when it said so */
} drv = {.conn = -1};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A fork child must not hold its parent's device file open: the kernel frees the parent's memory
 * when the parent's connections close. It asks for its own pid when it needs one (kernel_pid). */
static void after_fork_child(void) {
    if (drv.conn >= 0) close(drv.conn);
    drv.conn = -1;
}
static void register_atfork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* ---- the driver root ---------------------------------------------------------------------- */

/* The directory of the file this code was loaded from. */
static int own_directory(char *dir, size_t size) {
    Dl_info info;
    if (dladdr((void *)own_directory, &info) == 0 || info.dli_fname == NULL) return -1;
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash == NULL) return -1;
    snprintf(dir, size, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
    return 0;
}

/* The driver root of a library in `dir`: 0 with *root set, or -1 (not a toolkit library directory). */
static int root_of(const char *dir, char *root, size_t size) {
    size_t n = strlen(dir);
    for (int i = 0; lib_dirs[i]; i++) {
        size_t k = strlen(lib_dirs[i]);
        if (n >= k && strcmp(dir + n - k, lib_dirs[i]) == 0) {
            snprintf(root, size, "%.*s", (int)(n - k), dir);
            return 0;
        }
    }
    return -1;
}

/* The driver root of this library, as loaded, else as its directory resolves (a relative name, a
 * directory reached through links). 0, or -1 with *dir saying where the library is. */
static int find_root(char *dir, size_t dir_size, char *root, size_t root_size) {
    if (own_directory(dir, dir_size) < 0) {
        snprintf(dir, dir_size, "(unknown: dladdr failed)");
        return -1;
    }
    if (dir[0] == '/' && root_of(dir, root, root_size) == 0) return 0;
    char real[PATH_MAX];
    if (realpath(dir, real) == NULL) return -1;
    snprintf(dir, dir_size, "%s", real);
    return root_of(real, root, root_size);
}

/* ---- the handshake ------------------------------------------------------------------------ */

/* recvmsg the reply and the fds sent with it: the bytes read (or -1), *nfds the fds kept in fds[]
 * (more than FK_FDS are closed). */
static ssize_t receive(int fd, fk_reply *reply, int fds[FK_FDS], int *nfds) {
    union {
        char buf[CMSG_SPACE(FK_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {reply, sizeof *reply};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    *nfds = 0;
    for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
            if (*nfds < FK_FDS)
                fds[(*nfds)++] = got;
            else
                close(got);
        }
    }
    if (n > 0 && (size_t)n < sizeof *reply) { /* a stream may split it; the fds came with the first byte */
        ssize_t rest = recv(fd, (char *)reply + n, sizeof *reply - (size_t)n, MSG_WAITALL);
        n = rest < 0 ? -1 : n + rest;
    }
    return n;
}

/* Say hello on `fd` and take the reply: 0 with *pid and fds[] set, or -1 with *why set. */
static int handshake(int fd, int *pid, int fds[FK_FDS], char *why, size_t why_size) {
    fk_hello hello = {.version = FK_VERSION};
    memcpy(hello.magic, FK_HELLO_MAGIC, sizeof hello.magic);
    if (send(fd, &hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) {
        snprintf(why, why_size, "send: %s", strerror(errno));
        return -1;
    }
    fk_reply reply;
    int nfds;
    ssize_t n = receive(fd, &reply, fds, &nfds);
    int err = errno;
    if (n < 0)
        snprintf(why, why_size, "no answer: %s", strerror(err));
    else if ((size_t)n < sizeof reply)
        snprintf(why, why_size, "it closed the connection without an answer");
    else if (memcmp(reply.magic, FK_REPLY_MAGIC, sizeof reply.magic) != 0)
        snprintf(why, why_size, "the answer is not a fake kernel's");
    else if (reply.version != FK_VERSION)
        snprintf(why, why_size, "it speaks protocol version %u, this library %u", reply.version, FK_VERSION);
    else if (nfds != FK_FDS || reply.host_pid <= 0)
        snprintf(why, why_size, "it sent %d fds and pid %d", nfds, reply.host_pid);
    else {
        *pid = reply.host_pid;
        return 0;
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    return -1;
}

/* Connect to the kernel at drv.socket and shake hands: the connection, with *pid and fds[] set, or
 * -1 with *why set. */
static int kernel_connect(int *pid, int fds[FK_FDS], char *why, size_t why_size) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_size, "socket: %s", strerror(errno));
        return -1;
    }
    struct timeval timeout = {KERNEL_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    struct sockaddr_un addr;
    int dirfd, rc = fk_address(drv.socket, &addr, &dirfd);
    if (rc == 0) {
        rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
        int err = errno;
        if (dirfd >= 0) close(dirfd);
        errno = err;
    }
    if (rc < 0) {
        snprintf(why, why_size, "connect: %s", strerror(errno));
    } else if (handshake(fd, pid, fds, why, why_size) == 0) {
        return fd;
    }
    close(fd);
    return -1;
}

/* This process's host pid, for the state (called under its mutex). A fork child asks the kernel on
 * a connection of its own: what it does must never be charged to its parent's pid. */
static int kernel_pid(void) {
    if (drv.asked_as != getpid()) {
        char why[300];
        int pid = 0, fds[FK_FDS];
        int conn = kernel_connect(&pid, fds, why, sizeof why);
        if (conn >= 0) {
            close(fds[0]);
            close(fds[1]);
            drv.conn = conn;
        } else {
            fprintf(stderr, "fakestate: pid %d: the fake kernel at %s: %s: nothing is charged to this process\n",
                    (int)getpid(), drv.socket, why);
        }
        drv.host_pid = conn >= 0 ? pid : 0;
        drv.asked_as = getpid();
    }
    return drv.host_pid;
}

/* ---- the two modes ------------------------------------------------------------------------- */

static int open_kernel(fake_profile *profile, char *why, size_t why_size) {
    char dir[PATH_MAX], err[300];
    if (find_root(dir, sizeof dir, drv.root, sizeof drv.root) < 0) {
        snprintf(why, why_size,
                 "FAKE_NVML_PROFILE is not set: it needs FAKE_NVML_PROFILE or a driver root with a running fake "
                 "kernel at <root>" FK_SOCKET " (this library, in %.300s, is in no driver root's library directory "
                 "such as <root>/usr/lib/x86_64-linux-gnu)",
                 dir);
        return -1;
    }
    snprintf(drv.socket, sizeof drv.socket, "%s%s", drv.root, FK_SOCKET);
    int pid, fds[FK_FDS];
    int conn = kernel_connect(&pid, fds, err, sizeof err);
    if (conn < 0) {
        snprintf(why, why_size,
                 "FAKE_NVML_PROFILE is not set: it needs FAKE_NVML_PROFILE or a driver root with a running fake "
                 "kernel at %.300s (no answer there: %s)",
                 drv.socket, err);
        return -1;
    }
    char name[PATH_MAX + 64];
    snprintf(name, sizeof name, "(from the fake kernel at %.300s)", drv.socket);
    if (fake_profile_load_fd(fds[0], name, profile, why, why_size) < 0) {
        close(fds[1]);
        close(conn);
        return -1;
    }
    pthread_once(&atfork_once, register_atfork);
    drv.conn = conn;
    drv.host_pid = pid;
    drv.asked_as = getpid();
    drv.kernel = 1;
    if (fs_attach_kernel(profile, fds[1], kernel_pid, why, why_size) == 0) return 0;
    close(conn);
    drv.conn = -1;
    drv.kernel = 0;
    return -1;
}

int fs_driver_open(fake_profile *profile, char *why, size_t why_size) {
    const char *path = getenv("FAKE_NVML_PROFILE");
    if (path && path[0] != '\0') {
        drv.kernel = 0;
        if (fake_profile_load(path, profile, why, why_size) < 0) return -1;
        return fs_attach(profile, why, why_size);
    }
    return open_kernel(profile, why, why_size);
}

void fs_driver_close(void) {
    fs_detach();
    if (drv.conn >= 0) close(drv.conn);
    drv.conn = -1;
    drv.kernel = 0;
}

int fs_driver_kernel_mode(void) { return drv.kernel; }

int fs_gpu_present(const fake_gpu *g) {
    if (!drv.kernel) return 1;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/dev/nvidia%u", drv.root, g->minor);
    struct stat st; /* lstat, never open: no driver is behind the node */
    return lstat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == NVIDIA_MAJOR &&
           minor(st.st_rdev) == g->minor;
}

/*
 * fakegpu-kernel: the fake GPUs' kernel module (test support only).
 *
 *   fakegpu-kernel --socket PATH --profile FILE --state FILE
 *
 * A real driver learns its GPUs, and who uses them, in the kernel. The fakes in kernel mode
 * (csrc/fakestate/driver.h) learn them from this daemon, over the socket at PATH (a driver root's
 * run/nvidia-persistenced/socket), with the protocol of csrc/fakestate/kernel.h: each connection
 * gets the profile, the state file (created for the profile if missing, as a fake's first attach
 * creates it) and its process's host pid (SO_PEERCRED, numbered by this daemon's PID namespace:
 * run it in the host's).
 *
 * A connection is its process's open device file. When a process's last connection closes (it
 * exited, or the fake NVML shut down), its slots (memory, contexts, busy time) are dropped from the
 * state, as a real driver frees a dead process's memory. At start, the slots of pids already dead
 * are dropped.
 *
 * One thread, one poll loop. SIGTERM / SIGINT: the socket is removed, exit 0. stderr: one line at
 * start and one per refused or malformed connection; nothing per normal connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernel.h"
#include "profile.h"
#include "state.h"

#define EXIT_USAGE 2

typedef struct {
    int fd;
    int pid;    /* SO_PEERCRED's, at accept */
    int joined; /* the handshake was answered */
    size_t got; /* bytes of the hello so far */
    fk_hello hello;
} conn;

static struct {
    const char *socket, *profile, *state;
    int profile_fd, state_fd; /* reopened for each connection, through /proc/self/fd */
    conn *conns;
    size_t count, cap;
} k;

static volatile sig_atomic_t stopping;
static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakegpu-kernel: %s\n", line);
}

/* ---- start ------------------------------------------------------------------------------- */

static void parse_args(int argc, char **argv) {
    static const struct option options[] = {
        {"socket", required_argument, NULL, 's'},
        {"profile", required_argument, NULL, 'p'},
        {"state", required_argument, NULL, 'S'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
        if (c == 's') k.socket = optarg;
        else if (c == 'p') k.profile = optarg;
        else if (c == 'S') k.state = optarg;
        else exit(EXIT_USAGE);
    }
    if (optind != argc || !k.socket || !k.socket[0] || !k.profile || !k.state) {
        fprintf(stderr, "usage: fakegpu-kernel --socket PATH --profile FILE --state FILE\n");
        exit(EXIT_USAGE);
    }
}

/* Load the profile, create or check the state file, and keep both open to hand out. */
static int open_inputs(fake_profile *profile) {
    char why[700];
    if (fake_profile_load(k.profile, profile, why, sizeof why) < 0 ||
        fs_attach_file(profile, k.state, why, sizeof why) < 0) {
        say("%s", why);
        return -1;
    }
    fs_reap_dead();
    k.profile_fd = open(k.profile, O_RDONLY | O_CLOEXEC);
    k.state_fd = open(k.state, O_RDWR | O_CLOEXEC);
    if (k.profile_fd < 0 || k.state_fd < 0) {
        say("%s: %s", k.profile_fd < 0 ? k.profile : k.state, strerror(errno));
        return -1;
    }
    return 0;
}

/* mkdir -p of the directory `path` is in. */
static int make_parents(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = strchr(dir + 1, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
            say("mkdir %s: %s", dir, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    return 0;
}

/* Remove a stale socket at k.socket; -1 if a kernel still serves it or something else is there. */
static int clear_socket(const struct sockaddr_un *addr) {
    struct stat st;
    if (lstat(addr->sun_path, &st) < 0) {
        if (errno == ENOENT) return 0;
        say("%s: %s", k.socket, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        say("%s exists and is not a socket", k.socket);
        return -1;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int live = probe >= 0 && connect(probe, (const struct sockaddr *)addr, sizeof *addr) == 0;
    if (probe >= 0) close(probe);
    if (live) {
        say("another kernel serves %s", k.socket);
        return -1;
    }
    if (unlink(addr->sun_path) == 0) return 0;
    say("remove the stale %s: %s", k.socket, strerror(errno));
    return -1;
}

static int bind_listen(const struct sockaddr_un *addr) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && bind(fd, (const struct sockaddr *)addr, sizeof *addr) == 0 && chmod(addr->sun_path, 0666) == 0 &&
        listen(fd, 128) == 0)
        return fd;
    say("listen on %s: %s", k.socket, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
}

/* The socket at k.socket, mode 0666 (any container user may open the device), its parents made. */
static int listen_socket(void) {
    struct sockaddr_un addr;
    int dirfd;
    if (make_parents(k.socket) < 0) return -1;
    if (fk_address(k.socket, &addr, &dirfd) < 0) {
        say("%s: %s", k.socket, strerror(errno));
        return -1;
    }
    int fd = clear_socket(&addr) == 0 ? bind_listen(&addr) : -1;
    if (dirfd >= 0) close(dirfd);
    return fd;
}

static void remove_socket(void) {
    struct sockaddr_un addr;
    int dirfd;
    if (fk_address(k.socket, &addr, &dirfd) < 0) return;
    unlink(addr.sun_path);
    if (dirfd >= 0) close(dirfd);
}

/* ---- connections ------------------------------------------------------------------------- */

/* A new open file description of `fd`'s file, for one client. */
static int reopen(int fd, int flags) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, flags | O_CLOEXEC);
}

static int send_reply(int fd, int pid, const int *fds, int nfds) {
    fk_reply reply = {.version = FK_VERSION, .host_pid = pid};
    memcpy(reply.magic, FK_REPLY_MAGIC, sizeof reply.magic);
    union {
        char buf[CMSG_SPACE(FK_FDS * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {&reply, sizeof reply};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    return sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof reply ? 0 : -1;
}

/* The hello is complete: answer it, or refuse it. 0 keeps the connection, -1 closes it. */
static int answer(conn *c) {
    if (memcmp(c->hello.magic, FK_HELLO_MAGIC, sizeof c->hello.magic) != 0) {
        say("pid %d: refused: not a handshake", c->pid);
        return -1;
    }
    if (c->hello.version != FK_VERSION) {
        send_reply(c->fd, 0, NULL, 0);
        say("pid %d: refused: protocol version %u, this kernel speaks %u", c->pid, c->hello.version, FK_VERSION);
        return -1;
    }
    int fds[FK_FDS] = {reopen(k.profile_fd, O_RDONLY), reopen(k.state_fd, O_RDWR)};
    int rc = fds[0] >= 0 && fds[1] >= 0 ? send_reply(c->fd, c->pid, fds, FK_FDS) : -1;
    int err = errno;
    for (int i = 0; i < FK_FDS; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (rc < 0) {
        say("pid %d: cannot answer: %s", c->pid, strerror(err));
        return -1;
    }
    c->joined = 1;
    return 0;
}

/* The connection is readable (or hung up). 0 keeps it, -1 closes it. */
static int on_readable(conn *c) {
    char extra;
    char *into = c->joined ? &extra : (char *)&c->hello + c->got;
    size_t want = c->joined ? 1 : sizeof c->hello - c->got;
    ssize_t n = recv(c->fd, into, want, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (c->joined) {
        if (n > 0) say("pid %d: bytes after the handshake: connection closed", c->pid);
        return -1; /* else EOF or an error: the process closed its device file */
    }
    if (n <= 0) {
        if (n < 0 || c->got > 0) /* EOF before any byte: a probe for the socket, not an error */
            say("pid %d: closed during the handshake (%zu of %zu bytes)", c->pid, c->got, sizeof c->hello);
        return -1;
    }
    c->got += (size_t)n;
    return c->got < sizeof c->hello ? 0 : answer(c);
}

static void accept_one(int listener) {
    int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return; /* EAGAIN, or a client gone before it was accepted */
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0) {
        say("refused a connection: SO_PEERCRED gives no pid (a peer outside this PID namespace?)");
        close(fd);
        return;
    }
    if (k.count == k.cap) {
        size_t cap = k.cap ? 2 * k.cap : 16;
        conn *grown = realloc(k.conns, cap * sizeof *grown);
        if (grown == NULL) {
            say("pid %d: refused: out of memory", cred.pid);
            close(fd);
            return;
        }
        k.conns = grown;
        k.cap = cap;
    }
    k.conns[k.count++] = (conn){.fd = fd, .pid = cred.pid};
}

/* Close connection i; the last of its pid frees what that process held, as its exit would. */
static void close_conn(size_t i) {
    int pid = k.conns[i].pid;
    close(k.conns[i].fd);
    k.conns[i] = k.conns[--k.count];
    for (size_t j = 0; j < k.count; j++)
        if (k.conns[j].pid == pid) return;
    fs_drop_pid(pid);
}

/* Until SIGTERM / SIGINT (unblocked only inside ppoll, so none is missed). 0, or -1 on a poll error. */
static int serve(int listener, const sigset_t *unblocked) {
    struct pollfd *pfd = NULL;
    size_t pfd_cap = 0;
    while (!stopping) {
        if (pfd_cap < k.count + 1) {
            pfd_cap = k.cap + 1;
            free(pfd);
            if ((pfd = malloc(pfd_cap * sizeof *pfd)) == NULL) {
                say("out of memory");
                return -1;
            }
        }
        pfd[0] = (struct pollfd){.fd = listener, .events = POLLIN};
        for (size_t i = 0; i < k.count; i++) pfd[i + 1] = (struct pollfd){.fd = k.conns[i].fd, .events = POLLIN};
        if (ppoll(pfd, k.count + 1, NULL, unblocked) < 0) {
            if (errno == EINTR) continue;
            say("poll: %s", strerror(errno));
            free(pfd);
            return -1;
        }
        /* from the last: close_conn moves the last connection into the closed one's place */
        for (size_t i = k.count; i-- > 0;)
            if (pfd[i + 1].revents && on_readable(&k.conns[i]) < 0) close_conn(i);
        if (pfd[0].revents & POLLIN) accept_one(listener);
    }
    free(pfd);
    return 0;
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    static fake_profile profile;
    if (open_inputs(&profile) < 0) return 1;

    sigset_t stop, unblocked;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigprocmask(SIG_BLOCK, &stop, &unblocked);
    sigdelset(&unblocked, SIGTERM);
    sigdelset(&unblocked, SIGINT);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int listener = listen_socket();
    if (listener < 0) return 1;
    say("serving %s (%u GPUs, driver %s) with state %s on %s", k.profile, profile.count, profile.driver, k.state,
        k.socket);
    int rc = serve(listener, &unblocked);
    close(listener);
    remove_socket();
    return rc == 0 ? 0 : 1;
}

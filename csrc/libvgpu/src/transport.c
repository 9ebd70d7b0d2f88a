/* The I/O half of the call: a unix stream socket, poll(2) and one monotonic deadline. */
#include "transport.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "grpc_internal.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void set_result(struct grpc_result *r, enum grpc_outcome outcome, int code, const char *fmt, ...)
    GU_PRINTF(4, 5);

static void set_result(struct grpc_result *r, enum grpc_outcome outcome, int code, const char *fmt, ...)
{
    r->outcome = outcome;
    r->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
}

/* A blocking connect bounded by SO_SNDTIMEO: on a unix socket connect only waits when the
 * listener's backlog is full, and Linux bounds that wait by the send timeout. */
static int connect_unix(const char *path, uint64_t timeout_ms, struct grpc_result *r)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        set_result(r, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "socket path %s is too long", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        set_result(r, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "socket: %s", strerror(errno));
        return -1;
    }
    struct timeval tv = {.tv_sec = (time_t)(timeout_ms / 1000), .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EISCONN) {
        int e = errno;
        close(fd);
        if (e == EAGAIN || e == EINPROGRESS)
            set_result(r, CALL_DEADLINE, GRPC_DEADLINE_EXCEEDED, "deadline exceeded while connecting to %s (backlog full)",
                       path);
        else
            set_result(r, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "cannot connect to %s: %s", path, strerror(e));
        return -1;
    }
    struct timeval zero = {0, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof(zero));
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

/* One best-effort write of whatever is queued (a GOAWAY or RST_STREAM) before closing. */
static void flush_once(int fd, struct grpc_unary *c)
{
    const uint8_t *p;
    size_t n;
    grpc_unary_pending(c, &p, &n);
    if (n > 0)
        (void)!send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void run(int fd, struct grpc_unary *c, uint64_t deadline, uint64_t timeout_ms)
{
    int write_closed = 0;
    int write_errno = 0;
    uint8_t buf[16384];
    while (c->result.outcome == CALL_PENDING) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            char why[96];
            snprintf(why, sizeof(why), "no answer within %llu ms", (unsigned long long)timeout_ms);
            grpc_unary_expire(c, why);
            break;
        }
        const uint8_t *out;
        size_t out_len;
        grpc_unary_pending(c, &out, &out_len);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (out_len > 0 && !write_closed)
            pfd.events |= POLLOUT;
        uint64_t wait = deadline - now;
        int r = poll(&pfd, 1, wait > 60000 ? 60000 : (int)wait);
        if (r < 0 && errno != EINTR) {
            gu_fail(c, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "poll: %s", strerror(errno));
            break;
        }
        if (r <= 0)
            continue;
        if (pfd.revents & POLLOUT) {
            ssize_t w = send(fd, out, out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                grpc_unary_consumed(c, (size_t)w);
            } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                /* The server hung up (EPIPE). It may still have answered (a GOAWAY, a status),
                 * so keep reading until EOF before concluding. */
                write_closed = 1;
                write_errno = errno;
            }
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(fd, buf, sizeof(buf), 0);
            if (n > 0) {
                grpc_unary_feed(c, buf, (size_t)n);
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                grpc_unary_eof(c);
                if (write_errno && c->result.outcome == CALL_UNAVAILABLE) {
                    size_t len = strlen(c->result.message);
                    snprintf(c->result.message + len, sizeof(c->result.message) - len, " (write: %s)",
                             strerror(write_errno));
                }
            }
        }
    }
    flush_once(fd, c);
}

void grpc_call_unix(const char *path, const struct grpc_call_spec *spec, uint64_t timeout_ms, grpc_trace_fn trace,
                    void *trace_ctx, struct grpc_result *result)
{
    uint64_t deadline = now_ms() + timeout_ms;
    memset(result, 0, sizeof(*result));
    int fd = connect_unix(path, timeout_ms, result);
    if (fd < 0)
        return;

    /* The server gets what is left of our deadline, so it can give up when we do. */
    uint64_t now = now_ms();
    char timeout[16];
    grpc_timeout_format(deadline > now ? deadline - now : 1, timeout);
    struct grpc_call_spec s = *spec;
    s.timeout = timeout;

    struct grpc_unary c;
    if (grpc_unary_start(&c, &s, trace, trace_ctx) == 0)
        run(fd, &c, deadline, timeout_ms);
    *result = c.result;
    grpc_unary_free(&c);
    close(fd);
}

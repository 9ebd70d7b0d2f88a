/* The loader's real side effects and its production entry point. */
#include "loader.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

const struct loader_paths vgpu_default_paths = {
    .config_dir = "/etc/vgpu-manager/config",
    .pids_config = "/etc/vgpu-manager/config/pids.config",
    .vgpu_lock_dir = "/tmp/.vgpu_lock",
    .vmem_node_dir = "/tmp/.vmem_node",
    .sm_node_dir = "/tmp/.sm_node",
    .register_client = "/etc/vgpu-manager/registry/vgpu-register",
    .registry_socket = "/etc/vgpu-manager/registry/socket.sock",
};

#define PIDS_MAX_BYTES (1 << 20)

/* posix_spawn rather than fork: the library runs inside arbitrary, possibly large and
 * multi-threaded processes, and glibc's posix_spawn (clone + exec) neither copies the address
 * space nor runs atfork handlers, and reports exec failures as its return value. The client is
 * static, so the inherited LD_PRELOAD cannot pull the library into it. */
static int spawn_and_wait(void *ctx, char *const argv[], int *exit_status, char *err, size_t cap)
{
    (void)ctx;
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc != 0) {
        snprintf(err, cap, "%s", strerror(rc));
        return -1;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            /* ECHILD: the application set SIGCHLD to SIG_IGN, so the status is gone. */
            snprintf(err, cap, "waitpid: %s", strerror(errno));
            return -1;
        }
    }
    if (WIFSIGNALED(st)) {
        snprintf(err, cap, "killed by signal %d", WTERMSIG(st));
        return -1;
    }
    *exit_status = WEXITSTATUS(st);
    return 0;
}

int vgpu_parse_pids(const char *buf, size_t n, size_t *count, char *err, size_t cap)
{
    size_t lines = 0, start = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != '\n') {
            if (buf[i] < '0' || buf[i] > '9') {
                snprintf(err, cap, "line %zu is not a decimal PID", lines + 1);
                return -1;
            }
            continue;
        }
        if (i == start) {
            snprintf(err, cap, "line %zu is empty", lines + 1);
            return -1;
        }
        lines++;
        start = i + 1;
    }
    if (start != n) {
        snprintf(err, cap, "line %zu is not newline-terminated", lines + 1);
        return -1;
    }
    *count = lines;
    return 0;
}

/* pids.config is rewritten in place under LOCK_EX (contract "Registry"), so read it under
 * LOCK_SH to never see a half-written list. */
static int read_pids(void *ctx, const char *path, size_t *count, char *err, size_t cap)
{
    (void)ctx;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, cap, "%s", strerror(errno));
        return -1;
    }
    while (flock(fd, LOCK_SH) < 0 && errno == EINTR)
        ;
    char *buf = malloc(PIDS_MAX_BYTES);
    size_t n = 0;
    ssize_t r = 0;
    while (buf != NULL && n < PIDS_MAX_BYTES) {
        r = read(fd, buf + n, PIDS_MAX_BYTES - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    int saved = errno;
    close(fd); /* drops the lock */
    int rc = -1;
    if (buf == NULL)
        snprintf(err, cap, "out of memory");
    else if (r < 0)
        snprintf(err, cap, "%s", strerror(saved));
    else if (n == PIDS_MAX_BYTES)
        snprintf(err, cap, "larger than %d bytes", PIDS_MAX_BYTES);
    else
        rc = vgpu_parse_pids(buf, n, count, err, cap);
    free(buf);
    return rc;
}

static int is_dir(const char *path, int *exists, char *err, size_t cap)
{
    /* O_PATH | O_NOFOLLOW | O_DIRECTORY answers like lstat + S_ISDIR (a symlink planted in
     * world-writable /tmp must not redirect the lock files: it is "not a directory"), needs no
     * read permission, and keeps the control library off the GLIBC_2.33 stat symbols so that it
     * loads into containers with an older glibc. */
    int fd = open(path, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        *exists = 1;
        return 0;
    }
    if (errno == ENOENT) {
        *exists = 0;
        return 0;
    }
    *exists = 1;
    if (errno == ENOTDIR || errno == ELOOP)
        snprintf(err, cap, "exists and is not a directory");
    else
        snprintf(err, cap, "%s", strerror(errno));
    return -1;
}

/* mkdir -p. The directory itself gets mode 0777 regardless of umask: every process of the
 * container, whatever its uid, takes the per-device locks in them, as in the mounted ones. */
static int ensure_dir(void *ctx, const char *path, int *created, char *err, size_t cap)
{
    (void)ctx;
    int exists;
    *created = 0;
    if (is_dir(path, &exists, err, cap) < 0)
        return -1;
    if (exists)
        return 0;
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
        snprintf(err, cap, "path too long");
        return -1;
    }
    for (char *p = tmp + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(tmp, 0777) == 0) {
            if (saved == '\0')
                chmod(tmp, 0777); /* the leaf only: parents keep the umask */
            *created = 1;
        } else if (errno != EEXIST) {
            snprintf(err, cap, "mkdir %s: %s", tmp, strerror(errno));
            return -1;
        }
        *p = saved;
        if (saved == '\0')
            break;
    }
    /* Someone else may have raced us to it; what matters is that it is a directory now. */
    return is_dir(path, &exists, err, cap);
}

static void log_stderr(void *ctx, int level, const char *line)
{
    (void)ctx;
    (void)level;
    fprintf(stderr, "%s\n", line);
}

const struct loader_ops vgpu_default_ops = {
    .run_register = spawn_and_wait,
    .read_pids = read_pids,
    .ensure_dir = ensure_dir,
    .log = log_stderr,
    .ctx = NULL,
};

static const char *real_getenv(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

void vgpu_loader_boot(void)
{
    struct loader_env env = {.getenv = real_getenv, .getenv_ctx = NULL, .paths = vgpu_default_paths};
    struct loader_result r;
    if (vgpu_loader_init(&env, &vgpu_default_ops, &r) != VGPU_LOADER_OK)
        abort(); /* the FATAL line is already on stderr */
}

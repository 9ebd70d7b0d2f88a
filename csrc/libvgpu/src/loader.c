/* The loader's decisions; side effects go through struct loader_ops (loader_ops.c has the real
 * ones). See loader.h for the contract this follows. */
#include "loader.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int vgpu_mode_is(long mode, long bit)
{
    /* Bit-wise, not equality: client mode is 236 = 200 | 100 | ..., and 236 & 200 == 200. */
    return (mode & bit) == bit;
}

static int copy_env(char *dst, const char *name, vgpu_getenv_fn getenv_fn, void *ctx, char *err, size_t cap)
{
    const char *v = getenv_fn(ctx, name);
    if (v == NULL)
        v = "";
    if (strlen(v) > VGPU_ID_MAX) {
        snprintf(err, cap, "%s is longer than %d bytes", name, VGPU_ID_MAX);
        return -1;
    }
    strcpy(dst, v);
    return 0;
}

int vgpu_identity_from_env(struct vgpu_identity *id, vgpu_getenv_fn getenv_fn, void *ctx, char *err, size_t cap)
{
    memset(id, 0, sizeof(*id));
    if (copy_env(id->pod_uid, "VGPU_POD_UID", getenv_fn, ctx, err, cap) < 0 ||
        copy_env(id->container_name, "VGPU_CONTAINER_NAME", getenv_fn, ctx, err, cap) < 0 ||
        copy_env(id->register_uuid, "MANAGER_CLIENT_REGISTER_UUID", getenv_fn, ctx, err, cap) < 0)
        return -1;
    const char *mode = getenv_fn(ctx, "MANAGER_COMPATIBILITY_MODE");
    if (mode == NULL || mode[0] == '\0')
        return 0; /* host mode */
    /* A mode we cannot read is a node misconfiguration; guessing could silently skip the
     * registration a client-mode node relies on, so refuse instead. */
    char *end;
    errno = 0;
    long v = strtol(mode, &end, 10);
    if (mode[0] < '0' || mode[0] > '9' || *end != '\0' || errno == ERANGE) {
        snprintf(err, cap, "MANAGER_COMPATIBILITY_MODE=%.64s is not a non-negative integer", mode);
        return -1;
    }
    id->mode = v;
    return 0;
}

static int fatal(const struct loader_ops *ops, struct loader_result *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fatal(const struct loader_ops *ops, struct loader_result *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->message, sizeof(r->message), fmt, ap);
    va_end(ap);
    char line[sizeof(r->message) + 16];
    snprintf(line, sizeof(line), "vgpu: FATAL: %s", r->message);
    ops->log(ops->ctx, VGPU_LOG_FATAL, line);
    return VGPU_LOADER_FATAL;
}

/* What a register client exit code means (cli.h REGISTER_EXIT_*), for the FATAL line; the client
 * has already printed its own line with the gRPC status. */
static const char *register_exit_meaning(int status)
{
    switch (status) {
    case 2: return "usage error";
    case 3: return "registry unavailable";
    case 4: return "deadline exceeded";
    case 5: return "registry answered with an error";
    case 6: return "protocol error";
    default: return "failed";
    }
}

struct dir_spec {
    const char *path;
    unsigned bit;
    int required; /* enforcement needs it; otherwise only host-side monitoring does */
};

/* Create whichever partition directories were not mounted. The lock and ledger directories are
 * required: memory and core limits are enforced through them. The config directory only feeds
 * host-side monitoring in these modes, and /etc may be read-only for a non-root container, so
 * failing to create it is a warning: the §12.13.6 safe degradation must not become a crash. */
static int ensure_dirs(const struct loader_env *env, const struct loader_ops *ops, struct loader_result *r,
                       int with_config)
{
    const struct dir_spec dirs[] = {
        {env->paths.config_dir, VGPU_DIR_CONFIG, 0},
        {env->paths.vgpu_lock_dir, VGPU_DIR_VGPU_LOCK, 1},
        {env->paths.vmem_node_dir, VGPU_DIR_VMEM_NODE, 1},
        {env->paths.sm_node_dir, VGPU_DIR_SM_NODE, 1},
    };
    char created[512] = "";
    for (size_t i = with_config ? 0 : 1; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        char err[256], line[512];
        int made = 0;
        if (ops->ensure_dir(ops->ctx, dirs[i].path, &made, err, sizeof(err)) < 0) {
            if (dirs[i].required)
                return fatal(ops, r, "partition directory %s is not mounted and cannot be created: %s", dirs[i].path,
                             err);
            snprintf(line, sizeof(line), "vgpu: warning: %s is not mounted and cannot be created (%s); continuing",
                     dirs[i].path, err);
            ops->log(ops->ctx, VGPU_LOG_WARNING, line);
            continue;
        }
        if (made) {
            r->created_dirs |= dirs[i].bit;
            size_t len = strlen(created);
            snprintf(created + len, sizeof(created) - len, "%s%s", len ? ", " : "", dirs[i].path);
        }
    }
    if (created[0]) {
        char line[768];
        snprintf(line, sizeof(line),
                 "vgpu: warning: partition directories were not mounted, created private ones (%s): limits "
                 "still apply, host-side monitoring of this container is lost",
                 created);
        ops->log(ops->ctx, VGPU_LOG_WARNING, line);
    }
    return VGPU_LOADER_OK;
}

static int client_register(const struct loader_env *env, const struct loader_ops *ops, struct loader_result *r)
{
    const struct vgpu_identity *id = &r->id;
    if (id->register_uuid[0] == '\0' && (id->pod_uid[0] == '\0' || id->container_name[0] == '\0'))
        return fatal(ops, r,
                     "client registration mode (MANAGER_COMPATIBILITY_MODE=%ld) needs MANAGER_CLIENT_REGISTER_UUID, "
                     "or VGPU_POD_UID and VGPU_CONTAINER_NAME",
                     id->mode);

    /* All four flags, empty values included: the server picks the UUID path when it is set,
     * else the pod-UID path (seed §12.7), so the client forwards rather than decides. */
    char *argv[] = {
        (char *)env->paths.register_client, "--address",         (char *)env->paths.registry_socket,
        "--pod-uid",                        (char *)id->pod_uid, "--container-name",
        (char *)id->container_name,         "--register-uuid",   (char *)id->register_uuid,
        NULL,
    };
    char err[256];
    int status = -1;
    if (ops->run_register(ops->ctx, argv, &status, err, sizeof(err)) < 0)
        return fatal(ops, r, "client registration failed: cannot run %s: %s", env->paths.register_client, err);
    if (status != 0)
        return fatal(ops, r, "client registration failed: %s exited with status %d (%s)", env->paths.register_client,
                     status, register_exit_meaning(status));
    r->registered = 1;

    size_t count = 0;
    if (ops->read_pids(ops->ctx, env->paths.pids_config, &count, err, sizeof(err)) < 0)
        return fatal(ops, r, "client registration: cannot read %s: %s (is the partition mounted?)",
                     env->paths.pids_config, err);
    if (count == 0)
        return fatal(ops, r, "client registration: %s lists no PIDs, so usage of this container cannot be accounted",
                     env->paths.pids_config);
    r->pid_count = count;
    /* The registry needs the config mount (pids.config lives there); the lock dirs degrade as in
     * cgroup mode. */
    return ensure_dirs(env, ops, r, 0);
}

static int run_loader(const struct loader_env *env, const struct loader_ops *ops, struct loader_result *r)
{
    char err[256];
    memset(r, 0, sizeof(*r));
    if (vgpu_identity_from_env(&r->id, env->getenv, env->getenv_ctx, err, sizeof(err)) < 0)
        return fatal(ops, r, "%s", err);
    r->client_mode = vgpu_mode_is(r->id.mode, VGPU_MODE_CLIENT);
    if (r->client_mode)
        return client_register(env, ops, r);
    return ensure_dirs(env, ops, r, 1);
}

/* Once per process. The lock is held across fork (atfork handlers), so a child never inherits it
 * locked mid-init; the pid check makes a forked child, a new process, run the loader itself.
 * The register client is started with posix_spawn, which runs no atfork handlers: an init that
 * holds the lock cannot deadlock on its own spawn. */
static pthread_mutex_t once_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static pid_t once_pid;
static int once_rc;
static struct loader_result once_result;

static void fork_prepare(void) { pthread_mutex_lock(&once_lock); }
static void fork_release(void) { pthread_mutex_unlock(&once_lock); }
static void install_atfork(void) { pthread_atfork(fork_prepare, fork_release, fork_release); }

int vgpu_loader_init(const struct loader_env *env, const struct loader_ops *ops, struct loader_result *res)
{
    pthread_once(&atfork_once, install_atfork);
    pthread_mutex_lock(&once_lock);
    if (once_pid != getpid()) {
        once_rc = run_loader(env, ops, &once_result);
        once_pid = getpid();
    }
    int rc = once_rc;
    *res = once_result;
    pthread_mutex_unlock(&once_lock);
    return rc;
}

void vgpu_loader_reset_once(void)
{
    pthread_mutex_lock(&once_lock);
    once_pid = 0;
    pthread_mutex_unlock(&once_lock);
}

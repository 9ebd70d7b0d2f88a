/* The vGPU library's loader logic, as a module with its side effects behind `struct loader_ops`
 * so that it is unit-testable without a registry, a container or /etc.
 *
 * What it decides (contract "Library", seed §12.7, §12.11, §12.13.6):
 *   - identity from VGPU_POD_UID, VGPU_CONTAINER_NAME, MANAGER_CLIENT_REGISTER_UUID; the mode
 *     from MANAGER_COMPATIBILITY_MODE, tested bit-wise as (mode & X) == X;
 *   - client mode (bit 200): register once per process by exec'ing the register client with
 *     --address --pod-uid --container-name --register-uuid, then read pids.config; a failed
 *     register or an empty pids.config is FATAL (fail-closed, visible);
 *   - otherwise (cgroup/host): no registration; partition directories that are not mounted are
 *     created privately and the library continues: limits still hold, host monitoring is lost. */
#ifndef VGPU_LOADER_H
#define VGPU_LOADER_H

#include <stddef.h>

#include "log_level.h"

/* MANAGER_COMPATIBILITY_MODE bit values, combined by OR: client 236, cgroup v2 102, v1 101. */
#define VGPU_MODE_HOST 0L
#define VGPU_MODE_CGROUPV1 1L
#define VGPU_MODE_CGROUPV2 2L
#define VGPU_MODE_OPEN_KERNEL 100L
#define VGPU_MODE_CLIENT 200L

/* The reference library's test: every bit of `bit` is set in `mode`. */
int vgpu_mode_is(long mode, long bit);

typedef const char *(*vgpu_getenv_fn)(void *ctx, const char *name);

#define VGPU_ID_MAX 1024

struct vgpu_identity {
    char pod_uid[VGPU_ID_MAX + 1];
    char container_name[VGPU_ID_MAX + 1];
    char register_uuid[VGPU_ID_MAX + 1];
    long mode; /* MANAGER_COMPATIBILITY_MODE; 0 (host) when unset or empty */
};

/* 0, or -1 with err set (a value too long, a mode that is not a non-negative integer). */
int vgpu_identity_from_env(struct vgpu_identity *id, vgpu_getenv_fn getenv_fn, void *ctx, char *err, size_t cap);

/* Container paths; every one configurable so tests can point them at a temp dir. */
struct loader_paths {
    const char *config_dir;      /* /etc/vgpu-manager/config (partition mount) */
    const char *pids_config;     /* /etc/vgpu-manager/config/pids.config (read-only file mount) */
    const char *vgpu_lock_dir;   /* /tmp/.vgpu_lock */
    const char *vmem_node_dir;   /* /tmp/.vmem_node */
    const char *sm_node_dir;     /* /tmp/.sm_node */
    const char *register_client; /* /etc/vgpu-manager/registry/vgpu-register */
    const char *registry_socket; /* /etc/vgpu-manager/registry/socket.sock */
};

extern const struct loader_paths vgpu_default_paths;

struct loader_env {
    vgpu_getenv_fn getenv;
    void *getenv_ctx;
    struct loader_paths paths;
};

/* The side effects. Each returns 0 on success or -1 with err filled. */
struct loader_ops {
    /* Run the register client (argv[0] is its path) and wait: *exit_status is its exit code. */
    int (*run_register)(void *ctx, char *const argv[], int *exit_status, char *err, size_t cap);
    /* Count the PIDs listed in pids.config (a missing file is an error). */
    int (*read_pids)(void *ctx, const char *path, size_t *count, char *err, size_t cap);
    /* Make sure `path` is a directory; *created tells whether this call made it. */
    int (*ensure_dir)(void *ctx, const char *path, int *created, char *err, size_t cap);
    /* One line of diagnostics at `level` (log_level.h; the real one writes to stderr). */
    void (*log)(void *ctx, int level, const char *line);
    void *ctx;
};

/* posix_spawn + waitpid, a LOCK_SH reader of pids.config, mkdir -p, stderr. */
extern const struct loader_ops vgpu_default_ops;

/* pids.config content: one decimal PID per line, each line '\n'-terminated (contract
 * "Registry"). Returns 0 with *count set, or -1 with err naming the bad line. */
int vgpu_parse_pids(const char *buf, size_t n, size_t *count, char *err, size_t cap);

/* Bits of loader_result.created_dirs. */
#define VGPU_DIR_CONFIG 0x1
#define VGPU_DIR_VGPU_LOCK 0x2
#define VGPU_DIR_VMEM_NODE 0x4
#define VGPU_DIR_SM_NODE 0x8

struct loader_result {
    struct vgpu_identity id;
    int client_mode;
    int registered;        /* this call ran the register client successfully */
    size_t pid_count;      /* client mode: PIDs in pids.config */
    unsigned created_dirs; /* VGPU_DIR_* made because they were not mounted */
    char message[512];     /* the FATAL reason, or "" */
};

#define VGPU_LOADER_OK 0
#define VGPU_LOADER_FATAL (-1)

/* Run the loader logic once per process: a second call in the same process returns the first
 * call's return value and result without side effects; a forked child runs it afresh.
 * VGPU_LOADER_FATAL: the message is logged through ops->log as "vgpu: FATAL: ..." and the caller
 * must not continue (vgpu_loader_boot aborts). */
int vgpu_loader_init(const struct loader_env *env, const struct loader_ops *ops, struct loader_result *res);

/* The library constructor's entry: real environment, default paths and ops; abort() on FATAL. */
void vgpu_loader_boot(void);

/* Tests only: forget that this process already ran the loader. */
void vgpu_loader_reset_once(void);

#endif

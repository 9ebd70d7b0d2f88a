/* The loader logic: the (mode & X) == X rule, identity from the environment, client mode
 * (register once per process, FATAL on a failed register / missing or empty pids.config) and
 * cgroup mode (no register, missing partition directories created). Fake ops stand in for the
 * register client; the real ops are exercised on temp dirs, a script and the built vgpu-register. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "loader.h"

/* ---- a fake environment ---- */

struct env_kv {
    const char *kv[16]; /* name, value, ..., NULL */
};

static const char *fake_getenv(void *ctx, const char *name)
{
    const struct env_kv *e = ctx;
    for (size_t i = 0; e->kv[i]; i += 2)
        if (strcmp(e->kv[i], name) == 0)
            return e->kv[i + 1];
    return NULL;
}

/* ---- fake ops: record, delegate dirs and pids to the real ones ---- */

struct fake {
    int register_calls;
    int register_exit;     /* what the "client" exits with */
    int spawn_fails;       /* run_register cannot start it */
    char argv[10][64];
    int argc;
    char log[4096];
};

static int fake_run(void *ctx, char *const argv[], int *exit_status, char *err, size_t cap)
{
    struct fake *f = ctx;
    f->register_calls++;
    for (f->argc = 0; argv[f->argc] && f->argc < 10; f->argc++)
        snprintf(f->argv[f->argc], sizeof(f->argv[0]), "%s", argv[f->argc]);
    if (f->spawn_fails) {
        snprintf(err, cap, "No such file or directory");
        return -1;
    }
    *exit_status = f->register_exit;
    return 0;
}

static int real_read_pids(void *ctx, const char *path, size_t *count, char *err, size_t cap)
{
    (void)ctx;
    return vgpu_default_ops.read_pids(NULL, path, count, err, cap);
}

static int real_ensure_dir(void *ctx, const char *path, int *created, char *err, size_t cap)
{
    (void)ctx;
    return vgpu_default_ops.ensure_dir(NULL, path, created, err, cap);
}

static void fake_log(void *ctx, int level, const char *line)
{
    (void)level;
    struct fake *f = ctx;
    size_t len = strlen(f->log);
    snprintf(f->log + len, sizeof(f->log) - len, "%s\n", line);
}

/* ---- a temp root standing in for the container filesystem ---- */

static char root[64];
static char p_config[128], p_pids[160], p_lock[128], p_vmem[128], p_sm[128];

static void fresh_root(void)
{
    if (root[0]) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
        CHECK_INT(system(cmd), 0);
    }
    snprintf(root, sizeof(root), "/tmp/vgl.XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    snprintf(p_config, sizeof(p_config), "%s/etc/vgpu-manager/config", root);
    snprintf(p_pids, sizeof(p_pids), "%s/pids.config", p_config);
    snprintf(p_lock, sizeof(p_lock), "%s/tmp/.vgpu_lock", root);
    snprintf(p_vmem, sizeof(p_vmem), "%s/tmp/.vmem_node", root);
    snprintf(p_sm, sizeof(p_sm), "%s/tmp/.sm_node", root);
    vgpu_loader_reset_once();
}

static void mount_partition(const char *pids)
{
    char cmd[640];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s %s %s %s", p_config, p_lock, p_vmem, p_sm);
    CHECK_INT(system(cmd), 0);
    if (pids) {
        FILE *f = fopen(p_pids, "w");
        fputs(pids, f);
        fclose(f);
    }
}

static struct loader_env make_env(struct env_kv *kv)
{
    struct loader_env env = {fake_getenv, kv, vgpu_default_paths};
    env.paths.config_dir = p_config;
    env.paths.pids_config = p_pids;
    env.paths.vgpu_lock_dir = p_lock;
    env.paths.vmem_node_dir = p_vmem;
    env.paths.sm_node_dir = p_sm;
    env.paths.register_client = "/fake/vgpu-register";
    env.paths.registry_socket = "/fake/socket.sock";
    return env;
}

static struct loader_ops make_ops(struct fake *f)
{
    memset(f, 0, sizeof(*f));
    return (struct loader_ops){fake_run, real_read_pids, real_ensure_dir, fake_log, f};
}

static struct env_kv CLIENT_ENV = {{"MANAGER_COMPATIBILITY_MODE", "236", "VGPU_POD_UID", "pod-1", "VGPU_CONTAINER_NAME",
                                    "main", "MANAGER_CLIENT_REGISTER_UUID", "", NULL}};

/* ---- tests ---- */

static void mode_bits(void)
{
    /* The documented combinations, checked numerically. */
    CHECK_INT(VGPU_MODE_CLIENT | VGPU_MODE_OPEN_KERNEL, 236);
    CHECK_INT(VGPU_MODE_CGROUPV2 | VGPU_MODE_OPEN_KERNEL, 102);
    CHECK_INT(VGPU_MODE_CGROUPV1 | VGPU_MODE_OPEN_KERNEL, 101);
    CHECK(vgpu_mode_is(236, VGPU_MODE_CLIENT));     /* 236 & 200 == 200 */
    CHECK(vgpu_mode_is(236, VGPU_MODE_OPEN_KERNEL)); /* 236 & 100 == 100 */
    CHECK(!vgpu_mode_is(236, VGPU_MODE_CGROUPV2));   /* 236 & 2 == 0 */
    CHECK(!vgpu_mode_is(236, VGPU_MODE_CGROUPV1));
    CHECK(vgpu_mode_is(200, VGPU_MODE_CLIENT));
    CHECK(!vgpu_mode_is(102, VGPU_MODE_CLIENT)); /* 102 & 200 == 64: shares a bit, not all of them */
    CHECK(!vgpu_mode_is(101, VGPU_MODE_CLIENT));
    CHECK(vgpu_mode_is(102, VGPU_MODE_CGROUPV2));
    CHECK(!vgpu_mode_is(102, VGPU_MODE_CGROUPV1));
    CHECK(vgpu_mode_is(101, VGPU_MODE_CGROUPV1));
    CHECK(vgpu_mode_is(102, VGPU_MODE_OPEN_KERNEL));
    CHECK(!vgpu_mode_is(0, VGPU_MODE_CLIENT));
    CHECK(vgpu_mode_is(0, VGPU_MODE_HOST)); /* host is 0: every mode "is" host under this rule */
    CHECK(!vgpu_mode_is(64, VGPU_MODE_CLIENT));
}

static void identity(void)
{
    struct vgpu_identity id;
    char err[256];
    CHECK_INT(vgpu_identity_from_env(&id, fake_getenv, &CLIENT_ENV, err, sizeof(err)), 0);
    CHECK_STR(id.pod_uid, "pod-1");
    CHECK_STR(id.container_name, "main");
    CHECK_STR(id.register_uuid, "");
    CHECK_INT(id.mode, 236);
    struct env_kv none = {{NULL}};
    CHECK_INT(vgpu_identity_from_env(&id, fake_getenv, &none, err, sizeof(err)), 0);
    CHECK_INT(id.mode, 0);
    CHECK_STR(id.pod_uid, "");
    struct env_kv empty = {{"MANAGER_COMPATIBILITY_MODE", "", NULL}};
    CHECK_INT(vgpu_identity_from_env(&id, fake_getenv, &empty, err, sizeof(err)), 0);
    CHECK_INT(id.mode, 0);
    static const char *const bad_modes[] = {"abc", "-1", "12x", " 200", "99999999999999999999999", "+200"};
    for (size_t i = 0; i < sizeof(bad_modes) / sizeof(bad_modes[0]); i++) {
        struct env_kv bad = {{"MANAGER_COMPATIBILITY_MODE", bad_modes[i], NULL}};
        CHECK_INT(vgpu_identity_from_env(&id, fake_getenv, &bad, err, sizeof(err)), -1);
        CHECK(strstr(err, "MANAGER_COMPATIBILITY_MODE") != NULL);
    }
    static char long_value[VGPU_ID_MAX + 2];
    memset(long_value, 'u', VGPU_ID_MAX + 1);
    struct env_kv too_long = {{"VGPU_POD_UID", long_value, NULL}};
    CHECK_INT(vgpu_identity_from_env(&id, fake_getenv, &too_long, err, sizeof(err)), -1);
    CHECK(strstr(err, "VGPU_POD_UID") != NULL);
}

static void client_mode_registers_once(void)
{
    fresh_root();
    mount_partition("101\n202\n303\n");
    struct fake f;
    struct loader_ops ops = make_ops(&f);
    struct loader_env env = make_env(&CLIENT_ENV);
    struct loader_result r;
    CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_OK);
    CHECK_INT(f.register_calls, 1);
    CHECK(r.client_mode && r.registered);
    CHECK_INT(r.pid_count, 3);
    CHECK_INT(r.created_dirs, 0);
    CHECK_STR(f.log, "");
    /* Exactly the contract's four flags, empty UUID passed through. */
    static const char *const want[] = {"/fake/vgpu-register", "--address", "/fake/socket.sock", "--pod-uid", "pod-1",
                                       "--container-name", "main", "--register-uuid", ""};
    CHECK_INT(f.argc, 9);
    for (int i = 0; i < 9 && i < f.argc; i++)
        CHECK_STR(f.argv[i], want[i]);
    /* Again in the same process: no second registration, same answer. */
    struct loader_result again;
    CHECK_INT(vgpu_loader_init(&env, &ops, &again), VGPU_LOADER_OK);
    CHECK_INT(f.register_calls, 1);
    CHECK_INT(again.pid_count, 3);
    /* Concurrent first calls from several threads also register once: covered by the mutex;
     * a forked child is a new process and registers itself. */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        struct loader_result cr;
        int rc = vgpu_loader_init(&env, &ops, &cr);
        _exit(rc == VGPU_LOADER_OK ? f.register_calls : 100);
    }
    int st;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), 2); /* inherited 1 + its own */
    CHECK_INT(f.register_calls, 1); /* the parent did not register again */
}

static void client_mode_uuid_only(void)
{
    fresh_root();
    mount_partition("7\n");
    struct fake f;
    struct loader_ops ops = make_ops(&f);
    struct env_kv kv = {{"MANAGER_COMPATIBILITY_MODE", "200", "MANAGER_CLIENT_REGISTER_UUID", "u-1", NULL}};
    struct loader_env env = make_env(&kv);
    struct loader_result r;
    CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_OK);
    CHECK_STR(f.argv[4], "");
    CHECK_STR(f.argv[6], "");
    CHECK_STR(f.argv[8], "u-1");
}

/* Client mode failures: each FATAL, with the reason in the result and on the log. */
static void client_mode_fatal(void)
{
    static const struct {
        const char *name;
        const char *pids; /* NULL: no pids.config */
        int mount;
        int register_exit;
        int spawn_fails;
        const char *mode;
        const char *uuid;
        const char *needle;
        int registered;
    } cases[] = {
        {"register NOT_FOUND", "1\n", 1, 5, 0, "236", "", "exited with status 5 (registry answered with an error)", 0},
        {"registry gone", "1\n", 1, 3, 0, "236", "", "exited with status 3 (registry unavailable)", 0},
        {"deadline", "1\n", 1, 4, 0, "236", "", "status 4 (deadline exceeded)", 0},
        {"no client", "1\n", 1, 0, 1, "236", "", "cannot run /fake/vgpu-register: No such file", 0},
        {"empty pids", "", 1, 0, 0, "236", "", "lists no PIDs", 1},
        {"no pids.config", NULL, 1, 0, 0, "236", "", "No such file or directory (is the partition mounted?)", 1},
        {"not mounted", NULL, 0, 0, 0, "200", "", "cannot read", 1},
        {"malformed pids", "12\nabc\n", 1, 0, 0, "236", "", "line 2 is not a decimal PID", 1},
        {"unterminated", "12", 1, 0, 0, "236", "", "not newline-terminated", 1},
        {"no identity", "1\n", 1, 0, 0, "236", NULL, "needs MANAGER_CLIENT_REGISTER_UUID", 0},
        {"bad mode", "1\n", 1, 0, 0, "client", "", "MANAGER_COMPATIBILITY_MODE=client", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fresh_root();
        if (cases[i].mount)
            mount_partition(cases[i].pids);
        struct fake f;
        struct loader_ops ops = make_ops(&f);
        f.register_exit = cases[i].register_exit;
        f.spawn_fails = cases[i].spawn_fails;
        struct env_kv kv = {{"MANAGER_COMPATIBILITY_MODE", cases[i].mode, "VGPU_POD_UID",
                             cases[i].uuid ? "pod-1" : "", "VGPU_CONTAINER_NAME", "main",
                             "MANAGER_CLIENT_REGISTER_UUID", cases[i].uuid ? cases[i].uuid : "", NULL}};
        struct loader_env env = make_env(&kv);
        struct loader_result r;
        int rc = vgpu_loader_init(&env, &ops, &r);
        int ok = rc == VGPU_LOADER_FATAL && strstr(r.message, cases[i].needle) && r.registered == cases[i].registered &&
                 strncmp(f.log, "vgpu: FATAL: ", 13) == 0 && strstr(f.log, r.message);
        if (!ok)
            fprintf(stderr, "  case \"%s\": rc %d message \"%s\" log \"%s\"\n", cases[i].name, rc, r.message, f.log);
        CHECK(ok);
        /* FATAL is cached too: the caller aborts, but a second call must not re-register. */
        int calls = f.register_calls;
        CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_FATAL);
        CHECK_INT(f.register_calls, calls);
    }
}

static void cgroup_mode_creates_missing_dirs(void)
{
    static const char *const modes[] = {"102", "101", "0", NULL};
    for (size_t i = 0; i < 4; i++) {
        fresh_root();
        struct fake f;
        struct loader_ops ops = make_ops(&f);
        struct env_kv kv = {{"MANAGER_COMPATIBILITY_MODE", modes[i], NULL}};
        struct loader_env env = make_env(&kv);
        struct loader_result r;
        CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_OK);
        CHECK_INT(f.register_calls, 0);
        CHECK(!r.client_mode && !r.registered);
        CHECK_INT(r.created_dirs, VGPU_DIR_CONFIG | VGPU_DIR_VGPU_LOCK | VGPU_DIR_VMEM_NODE | VGPU_DIR_SM_NODE);
        struct stat st;
        CHECK(stat(p_lock, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0777);
        CHECK(stat(p_sm, &st) == 0 && S_ISDIR(st.st_mode));
        CHECK(stat(p_config, &st) == 0 && S_ISDIR(st.st_mode));
        CHECK(strstr(f.log, "vgpu: warning: partition directories were not mounted") != NULL);
        CHECK(strstr(f.log, "limits still apply") != NULL);
        CHECK(strstr(f.log, p_vmem) != NULL);
    }
    /* All mounted: nothing created, nothing logged. */
    fresh_root();
    mount_partition(NULL);
    struct fake f;
    struct loader_ops ops = make_ops(&f);
    struct env_kv kv = {{"MANAGER_COMPATIBILITY_MODE", "102", NULL}};
    struct loader_env env = make_env(&kv);
    struct loader_result r;
    CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_OK);
    CHECK_INT(r.created_dirs, 0);
    CHECK_STR(f.log, "");
}

static void cgroup_mode_degrades_or_fails(void)
{
    struct fake f;
    struct loader_result r;
    struct env_kv kv = {{"MANAGER_COMPATIBILITY_MODE", "102", NULL}};
    /* The config dir cannot be created (its parent is a file): a warning, the library goes on. */
    fresh_root();
    char parent[160];
    snprintf(parent, sizeof(parent), "%s/etc", root);
    close(open(parent, O_CREAT | O_WRONLY, 0644));
    struct loader_ops ops = make_ops(&f);
    struct loader_env env = make_env(&kv);
    CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_OK);
    CHECK(strstr(f.log, "vgpu: warning: ") && strstr(f.log, "cannot be created"));
    CHECK_INT(r.created_dirs, VGPU_DIR_VGPU_LOCK | VGPU_DIR_VMEM_NODE | VGPU_DIR_SM_NODE);
    /* A lock dir path taken by a symlink: enforcement cannot use it, FATAL. */
    fresh_root();
    mount_partition(NULL);
    rmdir(p_lock);
    CHECK_INT(symlink("/tmp", p_lock), 0);
    ops = make_ops(&f);
    CHECK_INT(vgpu_loader_init(&env, &ops, &r), VGPU_LOADER_FATAL);
    CHECK(strstr(r.message, "not a directory") != NULL);
    CHECK(strstr(f.log, "vgpu: FATAL: partition directory") != NULL);
}

static void pids_format(void)
{
    size_t n;
    char err[128];
    CHECK_INT(vgpu_parse_pids("", 0, &n, err, sizeof(err)), 0);
    CHECK_INT(n, 0);
    CHECK_INT(vgpu_parse_pids("1\n22\n333\n", 9, &n, err, sizeof(err)), 0);
    CHECK_INT(n, 3);
    CHECK_INT(vgpu_parse_pids("1\n\n2\n", 5, &n, err, sizeof(err)), -1);
    CHECK(strstr(err, "line 2 is empty") != NULL);
    CHECK_INT(vgpu_parse_pids("1\n-2\n", 5, &n, err, sizeof(err)), -1);
    CHECK_INT(vgpu_parse_pids("1 \n", 3, &n, err, sizeof(err)), -1);
    CHECK_INT(vgpu_parse_pids("1\n2", 3, &n, err, sizeof(err)), -1);
    /* The real reader refuses a symlink in place of the file (O_NOFOLLOW). */
    fresh_root();
    mount_partition("5\n");
    char link[200];
    snprintf(link, sizeof(link), "%s/link", root);
    CHECK_INT(symlink(p_pids, link), 0);
    CHECK_INT(vgpu_default_ops.read_pids(NULL, p_pids, &n, err, sizeof(err)), 0);
    CHECK_INT(n, 1);
    CHECK_INT(vgpu_default_ops.read_pids(NULL, link, &n, err, sizeof(err)), -1);
}

static void real_spawn(void)
{
    fresh_root();
    char script[128], out[160];
    snprintf(script, sizeof(script), "%s/client.sh", root);
    snprintf(out, sizeof(out), "%s/args", root);
    FILE *f = fopen(script, "w");
    fprintf(f, "#!/bin/sh\nprintf '[%%s]\\n' \"$@\" > %s\nexit 7\n", out);
    fclose(f);
    chmod(script, 0755);
    char *argv[] = {script, "--address", "/s", "--pod-uid", "", "--container-name", "c d", "--register-uuid", "u", NULL};
    int status = -1;
    char err[256];
    CHECK_INT(vgpu_default_ops.run_register(NULL, argv, &status, err, sizeof(err)), 0);
    CHECK_INT(status, 7);
    char got[256] = "";
    f = fopen(out, "r");
    if (f) {
        size_t n = fread(got, 1, sizeof(got) - 1, f);
        got[n] = '\0';
        fclose(f);
    }
    CHECK_STR(got, "[--address]\n[/s]\n[--pod-uid]\n[]\n[--container-name]\n[c d]\n[--register-uuid]\n[u]\n");
    /* Killed by a signal: an error, not an exit status. */
    f = fopen(script, "w");
    fprintf(f, "#!/bin/sh\nkill -KILL $$\n");
    fclose(f);
    CHECK_INT(vgpu_default_ops.run_register(NULL, argv, &status, err, sizeof(err)), -1);
    CHECK(strstr(err, "killed by signal 9") != NULL);
    /* Missing binary: posix_spawn reports the exec failure. */
    char *missing[] = {"/nonexistent/vgpu-register", NULL};
    CHECK_INT(vgpu_default_ops.run_register(NULL, missing, &status, err, sizeof(err)), -1);
    CHECK(strstr(err, "No such file") != NULL);
}

/* The loader with the real ops and the real, static vgpu-register built next to this test, against
 * a socket nobody listens on: FATAL with the client's exit class, the client's own line on stderr. */
static void real_register_client(void)
{
    char self[512], client[600];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    CHECK(n > 0);
    if (n <= 0)
        return;
    self[n] = '\0';
    *strrchr(self, '/') = '\0'; /* .../libvgpu/tests */
    snprintf(client, sizeof(client), "%s/../vgpu-register", self);
    if (access(client, X_OK) != 0) {
        fprintf(stderr, "  %s not built\n", client);
        CHECK(0);
        return;
    }
    fresh_root();
    mount_partition("1\n");
    char sock[160];
    snprintf(sock, sizeof(sock), "%s/nobody.sock", root);
    struct fake f;
    struct loader_ops ops = make_ops(&f);
    ops.run_register = vgpu_default_ops.run_register;
    struct loader_env env = make_env(&CLIENT_ENV);
    env.paths.register_client = client;
    env.paths.registry_socket = sock;
    struct loader_result r;
    int err_pipe[2];
    CHECK_INT(pipe(err_pipe), 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(err_pipe[1], 2);
    close(err_pipe[1]);
    int rc = vgpu_loader_init(&env, &ops, &r);
    dup2(saved, 2);
    close(saved);
    char text[1024] = "";
    ssize_t got = read(err_pipe[0], text, sizeof(text) - 1);
    text[got > 0 ? got : 0] = '\0';
    close(err_pipe[0]);
    CHECK_INT(rc, VGPU_LOADER_FATAL);
    CHECK(strstr(r.message, "exited with status 3 (registry unavailable)") != NULL);
    CHECK(strstr(text, "vgpu-register: RegisterContainerDevice failed: UNAVAILABLE: cannot connect to") != NULL);
    if (!strstr(text, "UNAVAILABLE"))
        fprintf(stderr, "  client stderr: %s\n", text);
}

/* The production entry point aborts on FATAL after logging; run it in a child. */
static void boot_aborts_on_fatal(void)
{
    if (access(vgpu_default_paths.register_client, F_OK) == 0) {
        printf("  (skipped: %s exists on this machine)\n", vgpu_default_paths.register_client);
        return;
    }
    int err_pipe[2];
    CHECK_INT(pipe(err_pipe), 0);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        dup2(err_pipe[1], 2);
        setenv("MANAGER_COMPATIBILITY_MODE", "236", 1);
        setenv("VGPU_POD_UID", "pod-1", 1);
        setenv("VGPU_CONTAINER_NAME", "main", 1);
        signal(SIGABRT, SIG_DFL);
        vgpu_loader_boot();
        _exit(0);
    }
    close(err_pipe[1]);
    char text[1024] = "";
    ssize_t got = read(err_pipe[0], text, sizeof(text) - 1);
    text[got > 0 ? got : 0] = '\0';
    close(err_pipe[0]);
    int st;
    waitpid(child, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(text, "vgpu: FATAL: client registration failed: cannot run /etc/vgpu-manager/registry/vgpu-register")
          != NULL);
}

int main(void)
{
    RUN(mode_bits);
    RUN(identity);
    RUN(client_mode_registers_once);
    RUN(client_mode_uuid_only);
    RUN(client_mode_fatal);
    RUN(cgroup_mode_creates_missing_dirs);
    RUN(cgroup_mode_degrades_or_fails);
    RUN(pids_format);
    RUN(real_spawn);
    RUN(real_register_client);
    RUN(boot_aborts_on_fatal);
    fresh_root(); /* leaves an empty dir; remove it */
    rmdir(root);
    return check_summary("test_loader");
}

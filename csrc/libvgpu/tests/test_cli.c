/* vgpu-register's flags, Go-style durations, and the exit code + one-line report per outcome. */
#include "check.h"
#include "cli.h"
#include "grpc_status.h"

static int parse(struct cli_args *a, char *err, const char *const *argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    return cli_parse(argc, (char *const *)argv, a, err, 256);
}

static void flags(void)
{
    struct cli_args a;
    char err[256];
    /* What the library passes: all four, empty UUID. */
    const char *lib[] = {"vgpu-register", "--address", "/r/socket.sock", "--pod-uid", "p-1", "--container-name", "c",
                         "--register-uuid", "", NULL};
    CHECK_INT(parse(&a, err, lib), CLI_OK);
    CHECK_STR(a.address, "/r/socket.sock");
    CHECK_STR(a.pod_uid, "p-1");
    CHECK_STR(a.container_name, "c");
    CHECK_STR(a.register_uuid, "");
    CHECK_INT(a.timeout_ms, 12000);
    CHECK_INT(a.verbose, 0);
    /* Go flag spellings: single dash, name=value; defaults. */
    const char *go[] = {"x", "-register-uuid=u-1", "-timeout=1.5s", "-v", NULL};
    CHECK_INT(parse(&a, err, go), CLI_OK);
    CHECK_STR(a.address, CLI_DEFAULT_ADDRESS);
    CHECK_STR(a.register_uuid, "u-1");
    CHECK_INT(a.timeout_ms, 1500);
    CHECK_INT(a.verbose, 1);
    const char *help[] = {"x", "--help", NULL};
    CHECK_INT(parse(&a, err, help), CLI_HELP);

    static const struct {
        const char *argv[6];
        const char *needle;
    } bad[] = {
        {{"x", NULL}, "nothing to register"},
        {{"x", "--pod-uid", "p", NULL}, "nothing to register"},
        {{"x", "--container-name", "c", NULL}, "nothing to register"},
        {{"x", "--register-uuid", NULL}, "missing value"},
        {{"x", "--bogus", "1", NULL}, "unknown flag"},
        {{"x", "stray", NULL}, "unexpected argument"},
        {{"x", "--register-uuid", "u", "--timeout", "12", NULL}, "--timeout"},
        {{"x", "--register-uuid", "u", "--timeout", "0s", NULL}, "--timeout"},
        {{"x", "--register-uuid", "u", "--timeout", "2h", NULL}, "--timeout"},
        {{"x", "--register-uuid", "u", "--address", "", NULL}, "--address"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        CHECK_INT(parse(&a, err, bad[i].argv), CLI_ERROR);
        if (!strstr(err, bad[i].needle))
            fprintf(stderr, "  case %zu: \"%s\"\n", i, err);
        CHECK(strstr(err, bad[i].needle) != NULL);
    }
    /* Over-long values and socket paths. */
    static char long_value[CLI_MAX_FIELD + 2];
    memset(long_value, 'x', CLI_MAX_FIELD + 1);
    const char *too_long[] = {"x", "--register-uuid", long_value, NULL};
    CHECK_INT(parse(&a, err, too_long), CLI_ERROR);
    static char long_path[120];
    memset(long_path, 'p', sizeof(long_path) - 1);
    const char *path[] = {"x", "--register-uuid", "u", "--address", long_path, NULL};
    CHECK_INT(parse(&a, err, path), CLI_ERROR);
}

static void durations(void)
{
    static const struct {
        const char *text;
        long long ms; /* -1: invalid */
    } cases[] = {
        {"12s", 12000}, {"500ms", 500}, {"1m", 60000},  {"1m30s", 90000}, {"1.5s", 1500}, {"0.0001s", 1},
        {"1h", 3600000}, {"250us", 1},  {"0", 0},        {"", -1},         {"12", -1},     {"s", -1},
        {"1x", -1},     {"-1s", -1},    {"1.s", 1000},   {"1e3s", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t ms = 0;
        int rc = cli_parse_duration(cases[i].text, &ms);
        if (cases[i].ms < 0) {
            CHECK_INT(rc, -1);
        } else {
            CHECK_INT(rc, 0);
            CHECK_INT(ms, cases[i].ms);
        }
    }
}

static void report(void)
{
    static const struct {
        enum grpc_outcome outcome;
        int code;
        const char *message;
        int exit_code;
        const char *line;
    } cases[] = {
        {CALL_STATUS, GRPC_OK, "", 0, ""},
        {CALL_STATUS, GRPC_NOT_FOUND, "pod p not found", 5,
         "vgpu-register: RegisterContainerDevice failed: NOT_FOUND: pod p not found"},
        {CALL_STATUS, GRPC_RESOURCE_EXHAUSTED, "", 5, "vgpu-register: RegisterContainerDevice failed: RESOURCE_EXHAUSTED"},
        {CALL_STATUS, GRPC_DEADLINE_EXCEEDED, "Deadline Exceeded", 4,
         "vgpu-register: RegisterContainerDevice failed: DEADLINE_EXCEEDED: Deadline Exceeded"},
        {CALL_DEADLINE, GRPC_DEADLINE_EXCEEDED, "no answer within 12000 ms", 4,
         "vgpu-register: RegisterContainerDevice failed: DEADLINE_EXCEEDED: no answer within 12000 ms"},
        {CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "cannot connect to /s: Connection refused", 3,
         "vgpu-register: RegisterContainerDevice failed: UNAVAILABLE: cannot connect to /s: Connection refused"},
        {CALL_PROTOCOL, GRPC_INTERNAL, "HPACK: integer overflow", 6,
         "vgpu-register: RegisterContainerDevice failed: INTERNAL: protocol error: HPACK: integer overflow"},
        {CALL_STATUS, 42, "odd", 5, "vgpu-register: RegisterContainerDevice failed: code 42: odd"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct grpc_result r = {cases[i].outcome, cases[i].code, ""};
        snprintf(r.message, sizeof(r.message), "%s", cases[i].message);
        char line[2048];
        CHECK_INT(register_report(&r, line, sizeof(line)), cases[i].exit_code);
        CHECK_STR(line, cases[i].line);
    }
}

int main(void)
{
    RUN(flags);
    RUN(durations);
    RUN(report);
    return check_summary("test_cli");
}

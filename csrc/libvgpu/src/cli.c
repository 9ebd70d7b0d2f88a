/* Command-line parsing for vgpu-register. The library execs it with
 * `--address --pod-uid --container-name --register-uuid`, passing empty values for what it does
 * not have, so empty values are legal here and only "nothing to register" is an error. */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <sys/un.h>

const char cli_usage[] =
    "usage: vgpu-register [--address SOCKET] [--pod-uid UID --container-name NAME] [--register-uuid UUID]\n"
    "                     [--timeout DURATION] [--verbose]\n"
    "Registers the calling container with vgpud's VDeviceRegistry (unary gRPC over HTTP/2 on a unix socket).\n"
    "  --address         registry socket (default " CLI_DEFAULT_ADDRESS ")\n"
    "  --pod-uid         pod UID (with --container-name; the NRI-mode identity)\n"
    "  --container-name  container name\n"
    "  --register-uuid   partition UUID (client-registration mode)\n"
    "  --timeout         deadline for the whole call, Go duration syntax (default 12s)\n"
    "  --verbose         trace HTTP/2 frames and headers on stderr\n"
    "exit: 0 registered; 2 usage; 3 server unavailable; 4 deadline exceeded; 5 gRPC error status;\n"
    "      6 protocol error\n";

int cli_parse_duration(const char *s, uint64_t *ms)
{
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ms", 1}, {"us", 1e-3}, {"ns", 1e-6}, {"s", 1e3}, {"m", 6e4}, {"h", 3.6e6}};
    double total = 0;
    const char *p = s;
    if (strcmp(s, "0") == 0) {
        *ms = 0;
        return 0;
    }
    if (*p == '\0')
        return -1;
    while (*p) {
        double v = 0, scale = 1;
        int digits = 0;
        for (; *p >= '0' && *p <= '9'; p++, digits++)
            v = v * 10 + (*p - '0');
        if (*p == '.')
            for (p++; *p >= '0' && *p <= '9'; p++, digits++)
                v += (*p - '0') * (scale /= 10);
        if (digits == 0)
            return -1;
        size_t i, n = 0;
        for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            n = strlen(units[i].unit);
            /* "ms" before "m" and "s" so the longest unit wins. */
            if (strncmp(p, units[i].unit, n) == 0)
                break;
        }
        if (i == sizeof(units) / sizeof(units[0]))
            return -1;
        total += v * units[i].ms;
        p += n;
        if (total > 1e12)
            return -1;
    }
    uint64_t whole = (uint64_t)total;
    *ms = whole + (total > (double)whole ? 1 : 0);
    return 0;
}

static int fail(char *err, size_t cap, const char *what, const char *arg)
{
    snprintf(err, cap, "%s%s%s", what, arg ? " " : "", arg ? arg : "");
    return CLI_ERROR;
}

int cli_parse(int argc, char *const argv[], struct cli_args *a, char *err, size_t cap)
{
    static const char *const names[] = {"address", "pod-uid", "container-name", "register-uuid", "timeout"};
    const char *values[5] = {CLI_DEFAULT_ADDRESS, "", "", "", NULL};
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-')
            return fail(err, cap, "unexpected argument", arg);
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        if (strcmp(name, "h") == 0 || strcmp(name, "help") == 0)
            return CLI_HELP;
        if (strcmp(name, "v") == 0 || strcmp(name, "verbose") == 0) {
            a->verbose = 1;
            continue;
        }
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        size_t k;
        for (k = 0; k < sizeof(names) / sizeof(names[0]); k++)
            if (strlen(names[k]) == len && strncmp(names[k], name, len) == 0)
                break;
        if (k == sizeof(names) / sizeof(names[0]))
            return fail(err, cap, "unknown flag", arg);
        if (eq) {
            values[k] = eq + 1;
        } else {
            if (i + 1 >= argc)
                return fail(err, cap, "missing value for", arg);
            values[k] = argv[++i];
        }
    }
    a->address = values[0];
    a->pod_uid = values[1];
    a->container_name = values[2];
    a->register_uuid = values[3];
    a->timeout_ms = CLI_DEFAULT_TIMEOUT_MS;
    if (values[4] && (cli_parse_duration(values[4], &a->timeout_ms) < 0 || a->timeout_ms == 0 ||
                      a->timeout_ms > CLI_MAX_TIMEOUT_MS))
        return fail(err, cap, "--timeout wants a duration between 1ms and 1h, not", values[4]);

    if (a->address[0] == '\0' || strlen(a->address) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return fail(err, cap, "--address must be a unix socket path of at most 107 bytes", NULL);
    const char *fields[] = {a->pod_uid, a->container_name, a->register_uuid};
    for (size_t k = 0; k < 3; k++)
        if (strlen(fields[k]) > CLI_MAX_FIELD)
            return fail(err, cap, "a value is longer than 1024 bytes:", names[k + 1]);
    /* The server resolves by register_uuid when set, else by pod UID and container name. */
    if (a->register_uuid[0] == '\0' && (a->pod_uid[0] == '\0' || a->container_name[0] == '\0'))
        return fail(err, cap, "nothing to register: give --register-uuid, or --pod-uid and --container-name", NULL);
    return CLI_OK;
}

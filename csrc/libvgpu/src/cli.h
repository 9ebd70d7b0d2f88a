/* vgpu-register's command line and its exit-code/one-line-report contract. */
#ifndef VGPU_CLI_H
#define VGPU_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "grpc_unary.h"

#define CLI_DEFAULT_ADDRESS "/etc/vgpu-manager/registry/socket.sock"
#define CLI_DEFAULT_TIMEOUT_MS 12000u /* the reference client's 12 s */
#define CLI_MAX_TIMEOUT_MS 3600000u
#define CLI_MAX_FIELD 1024 /* UIDs and names are far shorter; keeps the request in one frame */

/* Exit codes: one per failure class, so the library (and a human) can tell them apart. */
enum register_exit {
    REGISTER_EXIT_OK = 0,
    REGISTER_EXIT_USAGE = 2,       /* bad flags */
    REGISTER_EXIT_UNAVAILABLE = 3, /* cannot connect, connection closed, GOAWAY: server gone */
    REGISTER_EXIT_DEADLINE = 4,    /* our deadline, or the server's DEADLINE_EXCEEDED */
    REGISTER_EXIT_STATUS = 5,      /* any other non-OK gRPC status (incl. mapped stream resets) */
    REGISTER_EXIT_PROTOCOL = 6,    /* the server broke HTTP/2, HPACK or gRPC framing */
};

struct cli_args {
    const char *address;
    const char *pod_uid;
    const char *container_name;
    const char *register_uuid;
    uint64_t timeout_ms;
    int verbose;
};

enum { CLI_OK = 0, CLI_HELP = 1, CLI_ERROR = -1 };

/* Flags as Go's flag package takes them: -name or --name, value as the next argument or after
 * '='. On CLI_ERROR, err holds the reason. */
int cli_parse(int argc, char *const argv[], struct cli_args *a, char *err, size_t cap);

/* A Go-style duration ("12s", "500ms", "1m30s", "1.5s") in whole milliseconds, rounded up. */
int cli_parse_duration(const char *s, uint64_t *ms);

extern const char cli_usage[];

/* Exit code for a finished call, and the one stderr line to print (empty on success). */
int register_report(const struct grpc_result *r, char *line, size_t cap);

#endif

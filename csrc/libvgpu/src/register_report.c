/* Turning a call's outcome into vgpu-register's exit code and its single stderr line. Every
 * failure names a gRPC status, the server's or the one gRPC assigns to the local failure
 * (UNAVAILABLE for a vanished server, DEADLINE_EXCEEDED, INTERNAL for protocol errors), so the
 * container log reads the same whichever side failed. */
#include "cli.h"
#include "grpc_status.h"

#include <stdio.h>

int register_report(const struct grpc_result *r, char *line, size_t cap)
{
    int exit_code;
    switch (r->outcome) {
    case CALL_STATUS:
        if (r->code == GRPC_OK) {
            if (cap)
                line[0] = '\0';
            return REGISTER_EXIT_OK;
        }
        /* The server's own DEADLINE_EXCEEDED races ours (it got our grpc-timeout): same class. */
        exit_code = r->code == GRPC_DEADLINE_EXCEEDED ? REGISTER_EXIT_DEADLINE : REGISTER_EXIT_STATUS;
        break;
    case CALL_DEADLINE: exit_code = REGISTER_EXIT_DEADLINE; break;
    case CALL_UNAVAILABLE: exit_code = REGISTER_EXIT_UNAVAILABLE; break;
    case CALL_PROTOCOL:
    case CALL_PENDING:
    default: exit_code = REGISTER_EXIT_PROTOCOL; break;
    }
    const char *name = grpc_code_name(r->code);
    char unknown[24];
    if (name == NULL) {
        snprintf(unknown, sizeof(unknown), "code %d", r->code);
        name = unknown;
    }
    snprintf(line, cap, "vgpu-register: RegisterContainerDevice failed: %s%s%s%s", name,
             r->outcome == CALL_PROTOCOL ? ": protocol error" : "", r->message[0] ? ": " : "", r->message);
    return exit_code;
}

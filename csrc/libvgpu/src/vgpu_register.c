/* vgpu-register: the register client the vGPU library execs in client-registration mode.
 * It is linked statically and uses nothing beyond libc so it runs in any container image, and so
 * that the LD_PRELOAD (or /etc/ld.so.preload) that brought the library in does not load the
 * library into its own register client. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "pbwire.h"
#include "transport.h"

#define METHOD "/registry.VDeviceRegistry/RegisterContainerDevice"

static void trace_stderr(void *ctx, const char *line)
{
    (void)ctx;
    fprintf(stderr, "vgpu-register: %s\n", line);
}

/* registry.ContainerDeviceRequest{pod_uid=1, container_name=2, register_uuid=3}. */
static ptrdiff_t encode_request(const struct cli_args *a, uint8_t *dst, size_t cap)
{
    const char *fields[] = {a->pod_uid, a->container_name, a->register_uuid};
    size_t pos = 0;
    for (uint32_t i = 0; i < 3; i++) {
        ptrdiff_t k = pb_put_string(dst + pos, cap - pos, i + 1, fields[i], strlen(fields[i]));
        if (k < 0)
            return -1;
        pos += (size_t)k;
    }
    return (ptrdiff_t)pos;
}

int main(int argc, char **argv)
{
    struct cli_args a;
    char err[256];
    switch (cli_parse(argc, argv, &a, err, sizeof(err))) {
    case CLI_HELP: fputs(cli_usage, stdout); return REGISTER_EXIT_OK;
    case CLI_ERROR: fprintf(stderr, "vgpu-register: %s (see --help)\n", err); return REGISTER_EXIT_USAGE;
    default: break;
    }

    uint8_t request[3 * (CLI_MAX_FIELD + 8)];
    ptrdiff_t len = encode_request(&a, request, sizeof(request));
    if (len < 0) {
        fprintf(stderr, "vgpu-register: request too large\n");
        return REGISTER_EXIT_USAGE;
    }
    struct grpc_call_spec spec = {
        .path = METHOD,
        .authority = "localhost", /* no host on a unix socket; grpc-go sends "localhost" too */
        .message = request,
        .message_len = (size_t)len,
    };
    struct grpc_result result;
    grpc_call_unix(a.address, &spec, a.timeout_ms, a.verbose ? trace_stderr : NULL, NULL, &result);

    char line[GRPC_MESSAGE_MAX + 128];
    int code = register_report(&result, line, sizeof(line));
    if (line[0])
        fprintf(stderr, "%s\n", line);
    else if (a.verbose)
        fprintf(stderr, "vgpu-register: registered\n");
    return code;
}

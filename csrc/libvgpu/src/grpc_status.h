/* gRPC status vocabulary (grpc/doc/statuscodes.md, PROTOCOL-HTTP2.md): names, the mappings from
 * HTTP/2 stream resets and non-200 HTTP statuses, grpc-message percent-decoding and the
 * grpc-timeout header format. */
#ifndef VGPU_GRPC_STATUS_H
#define VGPU_GRPC_STATUS_H

#include <stddef.h>
#include <stdint.h>

enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_ALREADY_EXISTS = 6,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_ABORTED = 10,
    GRPC_OUT_OF_RANGE = 11,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_DATA_LOSS = 15,
    GRPC_UNAUTHENTICATED = 16,
};

/* "NOT_FOUND" etc.; NULL for a code outside 0..16. */
const char *grpc_code_name(int code);

/* PROTOCOL-HTTP2.md "Errors": RST_STREAM code -> status. */
int grpc_code_from_rst(uint32_t h2_error);

/* http-grpc-status-mapping.md: a non-200 :status without grpc-status -> status. */
int grpc_code_from_http(int http_status);

/* Percent-decode a grpc-message (%XX; malformed escapes are kept verbatim, as the spec asks).
 * Writes at most cap-1 octets plus NUL; returns the length written. */
size_t grpc_percent_decode(const char *src, size_t n, char *dst, size_t cap);

/* grpc-timeout value for a deadline ms away: at most 8 digits and a unit (m, S, M, H), rounded up
 * so the server never gets less time than we wait. */
void grpc_timeout_format(uint64_t ms, char out[16]);

#endif

/* gRPC status helpers; see grpc_status.h for the documents each mapping follows. */
#include "grpc_status.h"

#include <stdio.h>

const char *grpc_code_name(int code)
{
    static const char *const names[] = {
        "OK",           "CANCELLED",         "UNKNOWN",   "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND",    "ALREADY_EXISTS",    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
        "UNAVAILABLE",  "DATA_LOSS",         "UNAUTHENTICATED",
    };
    if (code < 0 || code >= (int)(sizeof(names) / sizeof(names[0])))
        return NULL;
    return names[code];
}

int grpc_code_from_rst(uint32_t h2_error)
{
    switch (h2_error) {
    case 0x7: return GRPC_UNAVAILABLE;       /* REFUSED_STREAM: not processed, safe to retry */
    case 0x8: return GRPC_CANCELLED;         /* CANCEL */
    case 0xb: return GRPC_RESOURCE_EXHAUSTED; /* ENHANCE_YOUR_CALM */
    case 0xc: return GRPC_PERMISSION_DENIED; /* INADEQUATE_SECURITY */
    default: return GRPC_INTERNAL;
    }
}

int grpc_code_from_http(int http_status)
{
    switch (http_status) {
    case 400: return GRPC_INTERNAL;
    case 401: return GRPC_UNAUTHENTICATED;
    case 403: return GRPC_PERMISSION_DENIED;
    case 404: return GRPC_UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504: return GRPC_UNAVAILABLE;
    default: return GRPC_UNKNOWN;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t grpc_percent_decode(const char *src, size_t n, char *dst, size_t cap)
{
    size_t out = 0;
    if (cap == 0)
        return 0;
    for (size_t i = 0; i < n && out + 1 < cap; i++) {
        int hi, lo;
        if (src[i] == '%' && i + 2 < n && (hi = hexval(src[i + 1])) >= 0 && (lo = hexval(src[i + 2])) >= 0) {
            dst[out++] = (char)(hi << 4 | lo);
            i += 2;
        } else {
            dst[out++] = src[i];
        }
    }
    dst[out] = '\0';
    return out;
}

void grpc_timeout_format(uint64_t ms, char out[16])
{
    /* TimeoutValue is at most 8 digits (PROTOCOL-HTTP2.md); move to a coarser unit when needed. */
    static const struct {
        char unit;
        uint64_t ms;
    } units[] = {{'m', 1}, {'S', 1000}, {'M', 60000}, {'H', 3600000}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        uint64_t v = (ms + units[i].ms - 1) / units[i].ms;
        if (v <= 99999999u) {
            snprintf(out, 16, "%llu%c", (unsigned long long)v, units[i].unit);
            return;
        }
    }
    snprintf(out, 16, "99999999H");
}

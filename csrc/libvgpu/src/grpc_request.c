/* Starting the call: everything the client sends up front. The request is tiny, so it goes out in
 * one burst without waiting for the server's SETTINGS (RFC 9113 §3.4 allows that): the defaults
 * (16 KiB frames, 64 KiB window) already admit it. */
#include "grpc_internal.h"

#include <stdlib.h>
#include <string.h>

#define USER_AGENT "vgpu-register/1 (vgpud)"

static int put_setting(uint8_t *p, uint16_t id, uint32_t value)
{
    p[0] = (uint8_t)(id >> 8);
    p[1] = (uint8_t)id;
    p[2] = (uint8_t)(value >> 24);
    p[3] = (uint8_t)(value >> 16);
    p[4] = (uint8_t)(value >> 8);
    p[5] = (uint8_t)value;
    return 6;
}

/* Request headers (gRPC PROTOCOL-HTTP2.md "Requests"): pseudo-headers first, te: trailers is
 * mandatory (servers use it to tell gRPC from proxied HTTP), grpc-timeout carries our deadline. */
static ptrdiff_t encode_headers(uint8_t *dst, size_t cap, const struct grpc_call_spec *spec)
{
    const char *fields[][2] = {
        {":method", "POST"},
        {":scheme", "http"},
        {":path", spec->path},
        {":authority", spec->authority},
        {"content-type", "application/grpc"},
        {"te", "trailers"},
        {"user-agent", USER_AGENT},
        {"grpc-timeout", spec->timeout},
    };
    size_t pos = 0;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i][1] == NULL)
            continue;
        ptrdiff_t k = hpack_encode_field(dst + pos, cap - pos, fields[i][0], fields[i][1], 0);
        if (k < 0)
            return -1;
        pos += (size_t)k;
    }
    return (ptrdiff_t)pos;
}

int grpc_unary_start(struct grpc_unary *c, const struct grpc_call_spec *spec, grpc_trace_fn trace,
                     void *trace_ctx)
{
    memset(c, 0, sizeof(*c));
    c->trace = trace;
    c->trace_ctx = trace_ctx;
    if (hpack_dtable_init(&c->dtable, HPACK_DEFAULT_TABLE) != HPACK_OK) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "out of memory");
        return -1;
    }
    if (spec->message_len > GRPC_MAX_MESSAGE) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "request of %zu octets exceeds the 16 KiB limit",
                spec->message_len);
        return -1;
    }

    uint8_t settings[18];
    size_t sl = 0;
    sl += put_setting(settings + sl, H2_SETTINGS_ENABLE_PUSH, 0);
    sl += put_setting(settings + sl, H2_SETTINGS_MAX_CONCURRENT_STREAMS, 0); /* the server opens none */
    sl += put_setting(settings + sl, H2_SETTINGS_MAX_HEADER_LIST_SIZE, GRPC_MAX_HEADER_BLOCK);

    uint8_t block[H2_DEFAULT_MAX_FRAME];
    ptrdiff_t bl = encode_headers(block, sizeof(block), spec);
    if (bl < 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "request headers exceed one HTTP/2 frame");
        return -1;
    }

    /* DATA: the gRPC Length-Prefixed-Message, compressed flag 0 and a big-endian length. */
    uint8_t data[GRPC_MAX_MESSAGE + 5];
    data[0] = 0;
    data[1] = (uint8_t)(spec->message_len >> 24);
    data[2] = (uint8_t)(spec->message_len >> 16);
    data[3] = (uint8_t)(spec->message_len >> 8);
    data[4] = (uint8_t)spec->message_len;
    if (spec->message_len)
        memcpy(data + 5, spec->message, spec->message_len);
    size_t dl = spec->message_len + 5;

    int rc = gu_queue(c, H2_PREFACE, H2_PREFACE_LEN);
    rc |= gu_queue_frame(c, H2_SETTINGS, 0, 0, settings, sl);
    rc |= gu_queue_frame(c, H2_HEADERS, H2_FLAG_END_HEADERS, GRPC_STREAM_ID, block, (size_t)bl);
    /* A DATA frame holds at most 16384 octets (the default SETTINGS_MAX_FRAME_SIZE). */
    for (size_t off = 0; off < dl; off += H2_DEFAULT_MAX_FRAME) {
        size_t n = dl - off < H2_DEFAULT_MAX_FRAME ? dl - off : H2_DEFAULT_MAX_FRAME;
        uint8_t flags = off + n == dl ? H2_FLAG_END_STREAM : 0;
        rc |= gu_queue_frame(c, H2_DATA, flags, GRPC_STREAM_ID, data + off, n);
    }
    if (rc != 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "out of memory");
        return -1;
    }
    gu_tracef(c, "> HEADERS stream=1 %s %s (%td octets HPACK), DATA %zu octets END_STREAM", spec->path,
              spec->timeout ? spec->timeout : "(no timeout)", bl, dl);
    return 0;
}

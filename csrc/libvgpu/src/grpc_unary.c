/* The client side of one HTTP/2 connection carrying one gRPC call: frame reassembly and the
 * connection-level frames (SETTINGS, PING, GOAWAY, RST_STREAM, WINDOW_UPDATE). What the response
 * means for the call is grpc_response.c's job. */
#include "grpc_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1024;
    while (n < need)
        n *= 2;
    uint8_t *p = realloc(*buf, n);
    if (p == NULL)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

int gu_queue(struct grpc_unary *c, const void *p, size_t n)
{
    if (reserve(&c->out, &c->out_cap, c->out_len + n) < 0)
        return -1;
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 0;
}

int gu_queue_frame(struct grpc_unary *c, uint8_t type, uint8_t flags, uint32_t stream_id, const void *payload,
                   size_t n)
{
    uint8_t head[H2_FRAME_HEADER_LEN];
    h2_frame_header_write(head, (uint32_t)n, type, flags, stream_id);
    if (gu_queue(c, head, sizeof(head)) < 0)
        return -1;
    return n ? gu_queue(c, payload, n) : 0;
}

void gu_tracef(struct grpc_unary *c, const char *fmt, ...)
{
    if (c->trace == NULL)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    c->trace(c->trace_ctx, line);
}

static void vfail(struct grpc_unary *c, enum grpc_outcome outcome, int code, const char *fmt, va_list ap)
{
    if (c->result.outcome != CALL_PENDING)
        return;
    c->result.outcome = outcome;
    c->result.code = code;
    vsnprintf(c->result.message, sizeof(c->result.message), fmt, ap);
}

void gu_fail(struct grpc_unary *c, enum grpc_outcome outcome, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, outcome, code, fmt, ap);
    va_end(ap);
}

void gu_conn_error(struct grpc_unary *c, enum h2_error err, const char *fmt, ...)
{
    if (c->result.outcome != CALL_PENDING)
        return;
    /* GOAWAY: last-stream-id 0 (we accept no server streams), then the error code. Best effort:
     * the transport flushes it once and closes. */
    uint8_t goaway[8] = {0, 0, 0, 0, (uint8_t)(err >> 24), (uint8_t)(err >> 16), (uint8_t)(err >> 8), (uint8_t)err};
    gu_queue_frame(c, H2_GOAWAY, 0, 0, goaway, sizeof(goaway));
    va_list ap;
    va_start(ap, fmt);
    vfail(c, CALL_PROTOCOL, GRPC_INTERNAL, fmt, ap);
    va_end(ap);
    gu_tracef(c, "> GOAWAY %s: %s", h2_error_name(err), c->result.message);
}

void gu_printable(char *dst, size_t cap, const char *s, size_t n)
{
    size_t out = 0;
    for (size_t i = 0; i < n && out + 1 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        dst[out++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (cap)
        dst[out] = '\0';
}

static void on_settings(struct grpc_unary *c, const struct h2_frame *f)
{
    if (f->flags & H2_FLAG_ACK)
        return; /* our SETTINGS took effect; nothing waits on it */
    for (size_t i = 0; i < f->length / 6; i++) {
        struct h2_setting s = h2_setting_at(f, i);
        gu_tracef(c, "<   setting 0x%x = %u", s.id, s.value);
        if (s.id == H2_SETTINGS_ENABLE_PUSH && s.value > 1) {
            gu_conn_error(c, H2_PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH %u", s.value);
            return;
        }
        if (s.id == H2_SETTINGS_INITIAL_WINDOW_SIZE && s.value > 0x7fffffffu) {
            gu_conn_error(c, H2_FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE %u", s.value);
            return;
        }
        if (s.id == H2_SETTINGS_MAX_FRAME_SIZE && (s.value < H2_DEFAULT_MAX_FRAME || s.value > H2_MAX_MAX_FRAME)) {
            gu_conn_error(c, H2_PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE %u", s.value);
            return;
        }
        /* Nothing else needs acting on: HEADER_TABLE_SIZE bounds the table of *our* encoder,
         * which never indexes; window and frame limits concern data we no longer send; unknown
         * ids are ignored (§6.5.2). */
    }
    c->seen_settings = 1;
    gu_queue_frame(c, H2_SETTINGS, H2_FLAG_ACK, 0, NULL, 0);
}

static void on_goaway(struct grpc_unary *c, const struct h2_frame *f)
{
    uint32_t last = h2_get_u32(f->payload) & 0x7fffffffu;
    uint32_t code = h2_get_u32(f->payload + 4);
    char debug[128];
    gu_printable(debug, sizeof(debug), (const char *)f->payload + 8, f->length - 8);
    if (last < GRPC_STREAM_ID) {
        /* Our stream was never processed: the server is going away, so the call is UNAVAILABLE. */
        gu_fail(c, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "server sent GOAWAY (%s%s%s) before handling the call",
                h2_error_name(code), debug[0] ? ": " : "", debug);
        return;
    }
    /* Streams up to `last` may still complete (§6.8): keep reading. */
    c->goaway = 1;
    c->goaway_code = code;
}

static void on_rst_stream(struct grpc_unary *c, const struct h2_frame *f)
{
    uint32_t code = h2_get_u32(f->payload);
    if (f->stream_id != GRPC_STREAM_ID)
        gu_conn_error(c, H2_PROTOCOL_ERROR, "RST_STREAM on idle stream %u", f->stream_id);
    else
        gu_fail(c, CALL_STATUS, grpc_code_from_rst(code), "stream reset by the server (%s)", h2_error_name(code));
}

static void block_append(struct grpc_unary *c, const uint8_t *p, size_t n, int end_headers)
{
    if (n > GRPC_MAX_HEADER_BLOCK - c->block_len) {
        gu_conn_error(c, H2_PROTOCOL_ERROR, "header block larger than %d octets", GRPC_MAX_HEADER_BLOCK);
        return;
    }
    memcpy(c->block + c->block_len, p, n);
    c->block_len += n;
    if (end_headers) {
        c->block_open = 0;
        gu_header_block(c);
    }
}

static void on_headers(struct grpc_unary *c, const struct h2_frame *f)
{
    if (f->stream_id != GRPC_STREAM_ID) {
        gu_conn_error(c, H2_PROTOCOL_ERROR, "HEADERS on stream %u, which we did not open", f->stream_id);
        return;
    }
    if (c->block == NULL && (c->block = malloc(GRPC_MAX_HEADER_BLOCK)) == NULL) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "out of memory");
        return;
    }
    const uint8_t *body;
    size_t len;
    h2_frame_body(f, &body, &len);
    c->block_len = 0;
    c->block_open = 1;
    c->block_end_stream = (f->flags & H2_FLAG_END_STREAM) != 0;
    block_append(c, body, len, f->flags & H2_FLAG_END_HEADERS);
}

static void trace_frame(struct grpc_unary *c, const struct h2_frame *f)
{
    if (c->trace == NULL)
        return;
    char flags[64] = "";
    int data_or_headers = f->type == H2_DATA || f->type == H2_HEADERS;
    if ((f->type == H2_SETTINGS || f->type == H2_PING) && (f->flags & H2_FLAG_ACK))
        strcat(flags, " ACK");
    if (data_or_headers && (f->flags & H2_FLAG_END_STREAM))
        strcat(flags, " END_STREAM");
    if ((f->type == H2_HEADERS || f->type == H2_CONTINUATION) && (f->flags & H2_FLAG_END_HEADERS))
        strcat(flags, " END_HEADERS");
    if (data_or_headers && (f->flags & H2_FLAG_PADDED))
        strcat(flags, " PADDED");
    if (f->type == H2_HEADERS && (f->flags & H2_FLAG_PRIORITY))
        strcat(flags, " PRIORITY");
    gu_tracef(c, "< %s stream=%u length=%u%s", h2_type_name(f->type), f->stream_id, f->length, flags);
}

/* Frame rules that depend on connection state rather than on the frame alone; 0 if it may go on. */
static int sequencing_ok(struct grpc_unary *c, const struct h2_frame *f)
{
    /* §6.10: a header block is contiguous; anything but its CONTINUATION is a PROTOCOL_ERROR. */
    if (c->block_open && (f->type != H2_CONTINUATION || f->stream_id != GRPC_STREAM_ID)) {
        gu_conn_error(c, H2_PROTOCOL_ERROR, "%s inside a header block", h2_type_name(f->type));
        return 0;
    }
    if (!c->block_open && f->type == H2_CONTINUATION) {
        gu_conn_error(c, H2_PROTOCOL_ERROR, "CONTINUATION without an open header block");
        return 0;
    }
    /* §3.4: the server preface is a SETTINGS frame (not an ACK). */
    if (!c->seen_settings && (f->type != H2_SETTINGS || (f->flags & H2_FLAG_ACK))) {
        gu_conn_error(c, H2_PROTOCOL_ERROR, "server did not start with SETTINGS (got %s)", h2_type_name(f->type));
        return 0;
    }
    return 1;
}

static void on_frame(struct grpc_unary *c, const struct h2_frame *f)
{
    trace_frame(c, f);
    enum h2_error err = h2_frame_check(f);
    if (err != H2_NO_ERROR) {
        gu_conn_error(c, err, "malformed %s frame", h2_type_name(f->type));
        return;
    }
    if (!sequencing_ok(c, f))
        return;
    switch (f->type) {
    case H2_SETTINGS:
        on_settings(c, f);
        break;
    case H2_PING:
        if (!(f->flags & H2_FLAG_ACK))
            gu_queue_frame(c, H2_PING, H2_FLAG_ACK, 0, f->payload, 8);
        break;
    case H2_GOAWAY:
        on_goaway(c, f);
        break;
    case H2_RST_STREAM:
        on_rst_stream(c, f);
        break;
    case H2_HEADERS:
        on_headers(c, f);
        break;
    case H2_CONTINUATION:
        block_append(c, f->payload, f->length, f->flags & H2_FLAG_END_HEADERS);
        break;
    case H2_DATA:
        if (f->stream_id != GRPC_STREAM_ID)
            gu_conn_error(c, H2_PROTOCOL_ERROR, "DATA on stream %u", f->stream_id);
        else
            gu_data(c, f);
        break;
    default:
        /* WINDOW_UPDATE: we send nothing after the request, so credit is irrelevant.
         * PRIORITY: advisory. Unknown types: ignored, as §4.1 requires. */
        break;
    }
}

enum grpc_outcome grpc_unary_feed(struct grpc_unary *c, const uint8_t *p, size_t n)
{
    if (c->result.outcome != CALL_PENDING)
        return c->result.outcome;
    if (reserve(&c->in, &c->in_cap, c->in_len + n) < 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "out of memory");
        return c->result.outcome;
    }
    memcpy(c->in + c->in_len, p, n);
    c->in_len += n;

    size_t pos = 0;
    while (c->result.outcome == CALL_PENDING) {
        /* An HTTP/1 server answers our preface with a status line; say so instead of reporting a
         * 4 MiB frame. */
        if (!c->seen_settings && c->in_len - pos >= 5 && memcmp(c->in + pos, "HTTP/", 5) == 0) {
            gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "the server speaks HTTP/1, not HTTP/2");
            break;
        }
        struct h2_frame f;
        ptrdiff_t r = h2_frame_parse(c->in + pos, c->in_len - pos, H2_DEFAULT_MAX_FRAME, &f);
        if (r == H2_PARSE_TOO_BIG) {
            gu_conn_error(c, H2_FRAME_SIZE_ERROR, "frame larger than %u octets", H2_DEFAULT_MAX_FRAME);
            break;
        }
        if (r == 0)
            break;
        on_frame(c, &f);
        pos += (size_t)r;
    }
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
    return c->result.outcome;
}

enum grpc_outcome grpc_unary_eof(struct grpc_unary *c)
{
    if (c->goaway)
        gu_fail(c, CALL_UNAVAILABLE, GRPC_UNAVAILABLE,
                "connection closed after GOAWAY (%s) before the response was complete",
                h2_error_name(c->goaway_code));
    else if (!c->seen_settings)
        gu_fail(c, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "connection closed by the server before its HTTP/2 preface");
    else
        gu_fail(c, CALL_UNAVAILABLE, GRPC_UNAVAILABLE, "connection closed by the server before the response was complete");
    return c->result.outcome;
}

void grpc_unary_expire(struct grpc_unary *c, const char *why)
{
    if (c->result.outcome != CALL_PENDING)
        return;
    uint8_t code[4] = {0, 0, 0, H2_CANCEL};
    gu_queue_frame(c, H2_RST_STREAM, 0, GRPC_STREAM_ID, code, sizeof(code));
    gu_fail(c, CALL_DEADLINE, GRPC_DEADLINE_EXCEEDED, "%s", why);
}

void grpc_unary_pending(const struct grpc_unary *c, const uint8_t **p, size_t *n)
{
    *p = c->out;
    *n = c->out_len;
}

void grpc_unary_consumed(struct grpc_unary *c, size_t n)
{
    memmove(c->out, c->out + n, c->out_len - n);
    c->out_len -= n;
}

void grpc_unary_free(struct grpc_unary *c)
{
    hpack_dtable_free(&c->dtable);
    free(c->out);
    free(c->in);
    free(c->block);
    c->out = c->in = c->block = NULL;
}

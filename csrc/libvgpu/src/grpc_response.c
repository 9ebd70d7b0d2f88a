/* What the server's header blocks and DATA mean for the call (gRPC PROTOCOL-HTTP2.md):
 *   Response      -> (Response-Headers *Length-Prefixed-Message Trailers) / Trailers-Only
 *   Trailers-Only -> HTTP-Status Content-Type Trailers, in one HEADERS with END_STREAM
 * Servers answer errors raised before the first message (NOT_FOUND, RESOURCE_EXHAUSTED) with
 * Trailers-Only, so the first header block may already hold grpc-status. */
#include "grpc_internal.h"
#include "pbwire.h"

#include <stdlib.h>
#include <string.h>

struct block {
    struct grpc_unary *c;
    int trailers;        /* decoding the second block */
    int http_status;     /* -1: absent */
    int content_type_ok;
    int grpc_status;     /* -1: absent */
    char grpc_message[GRPC_MESSAGE_MAX];
    const char *malformed; /* first reason the block is unacceptable */
};

static int is_grpc_content_type(const char *v, size_t n)
{
    /* "application/grpc" optionally followed by "+proto", "+json", ";charset=..." */
    static const char base[] = "application/grpc";
    size_t bl = sizeof(base) - 1;
    return n >= bl && strncmp(v, base, bl) == 0 && (n == bl || v[bl] == '+' || v[bl] == ';');
}

/* Non-negative decimal of at most `digits` digits, or -1. */
static int parse_decimal(const char *v, size_t n, size_t digits)
{
    if (n == 0 || n > digits)
        return -1;
    int x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (v[i] - '0');
    }
    return x;
}

static int on_field(void *ctx, const struct hpack_field *f)
{
    struct block *b = ctx;
    if (b->c->trace) {
        char value[160];
        gu_printable(value, sizeof(value), f->value, f->value_len);
        /* The representation too: interop bugs hide in which one a server picks. */
        gu_tracef(b->c, "<   %s: %s%s%s%s", f->name, value,
                  (f->flags & (HPACK_F_NAME_HUFFMAN | HPACK_F_VALUE_HUFFMAN)) ? " [huffman]" : "",
                  (f->flags & HPACK_F_INDEXED) ? " [indexed]" : "", (f->flags & HPACK_F_ADDED) ? " [+table]" : "");
    }
    if (f->name_len > 0 && f->name[0] == ':') {
        /* RFC 9113 §8.3: a response has only :status, and trailers carry no pseudo-headers. */
        if (b->trailers || strcmp(f->name, ":status") != 0)
            b->malformed = b->malformed ? b->malformed : "unexpected pseudo-header";
        else
            b->http_status = parse_decimal(f->value, f->value_len, 3);
    } else if (strcmp(f->name, "content-type") == 0) {
        b->content_type_ok = is_grpc_content_type(f->value, f->value_len);
    } else if (strcmp(f->name, "grpc-status") == 0) {
        b->grpc_status = parse_decimal(f->value, f->value_len, 3);
        if (b->grpc_status < 0)
            b->malformed = b->malformed ? b->malformed : "grpc-status is not a number";
    } else if (strcmp(f->name, "grpc-message") == 0) {
        char decoded[GRPC_MESSAGE_MAX];
        grpc_percent_decode(f->value, f->value_len, decoded, sizeof(decoded));
        /* Percent-decoding may yield control octets; the message ends up on one stderr line. */
        gu_printable(b->grpc_message, sizeof(b->grpc_message), decoded, strlen(decoded));
    }
    return 0;
}

/* An OK status needs exactly one well-formed, uncompressed response message. */
static void finish_ok(struct grpc_unary *c, const char *grpc_message)
{
    if (c->msg_len < 5) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "status OK without a response message");
        return;
    }
    uint32_t len = h2_get_u32(c->msg + 1);
    if (c->msg[0] != 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "compressed response message, but we offered no encoding");
        return;
    }
    if (len != c->msg_len - 5) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "response is not exactly one message");
        return;
    }
    if (pb_wellformed(c->msg + 5, len) < 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "response message is not valid protobuf");
        return;
    }
    gu_fail(c, CALL_STATUS, GRPC_OK, "%s", grpc_message);
}

static void finish(struct grpc_unary *c, const struct block *b)
{
    if (b->grpc_status < 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "%s without grpc-status", b->trailers ? "trailers" : "trailers-only response");
        return;
    }
    if (b->grpc_status == GRPC_OK)
        finish_ok(c, b->grpc_message);
    else
        gu_fail(c, CALL_STATUS, b->grpc_status, "%s", b->grpc_message);
}

void gu_header_block(struct grpc_unary *c)
{
    struct block b = {.c = c, .trailers = c->got_headers, .http_status = -1, .grpc_status = -1};
    /* Decode even a block we will reject: the dynamic table must stay in step with the server's. */
    int rc = hpack_decode_block(&c->dtable, c->block, c->block_len, on_field, &b);
    if (rc != HPACK_OK) {
        gu_conn_error(c, H2_COMPRESSION_ERROR, "HPACK: %s", hpack_strerror(rc));
        return;
    }
    if (b.malformed) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "malformed %s: %s", b.trailers ? "trailers" : "response headers",
                b.malformed);
        return;
    }
    if (b.trailers) {
        if (!c->block_end_stream) {
            gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "trailers without END_STREAM");
            return;
        }
        finish(c, &b);
        return;
    }
    c->got_headers = 1;
    if (b.http_status < 0) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "response without :status");
        return;
    }
    if (b.http_status != 200) {
        /* Not a gRPC answer (a proxy, a wrong endpoint): the spec maps the HTTP status. */
        gu_fail(c, CALL_STATUS, grpc_code_from_http(b.http_status), "HTTP status %d%s%s", b.http_status,
                b.grpc_message[0] ? ": " : "", b.grpc_message);
        return;
    }
    if (c->block_end_stream) {
        finish(c, &b); /* Trailers-Only */
        return;
    }
    if (!b.content_type_ok)
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "response content-type is not application/grpc");
}

void gu_data(struct grpc_unary *c, const struct h2_frame *f)
{
    if (!c->got_headers) {
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "DATA before the response headers");
        return;
    }
    /* We never send WINDOW_UPDATE: a reply this small fits the initial 65535-octet window, and a
     * server overrunning it breaks flow control (§6.9.1), padding included. */
    if (f->length > H2_DEFAULT_WINDOW - c->data_received) {
        gu_conn_error(c, H2_FLOW_CONTROL_ERROR, "server overran the flow-control window");
        return;
    }
    c->data_received += f->length;
    const uint8_t *body;
    size_t len;
    h2_frame_body(f, &body, &len);
    if (len > sizeof(c->msg) - c->msg_len) {
        gu_fail(c, CALL_PROTOCOL, GRPC_RESOURCE_EXHAUSTED, "response message larger than %d octets",
                GRPC_MAX_MESSAGE);
        return;
    }
    memcpy(c->msg + c->msg_len, body, len);
    c->msg_len += len;
    if (f->flags & H2_FLAG_END_STREAM)
        gu_fail(c, CALL_PROTOCOL, GRPC_INTERNAL, "stream ended without trailers");
}

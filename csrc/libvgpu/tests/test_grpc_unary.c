/* The unary call engine fed canned server octets: the request it sends, complete responses,
 * Trailers-Only, CONTINUATION, padding, PING, GOAWAY, RST_STREAM, the dynamic table across header
 * blocks, and every protocol violation it must refuse. Also gRPC status helpers and pbwire. */
#include <stdlib.h>

#include "check.h"
#include "grpc_status.h"
#include "grpc_unary.h"
#include "h2.h"
#include "pbwire.h"

#define PATH "/registry.VDeviceRegistry/RegisterContainerDevice"

/* ---- building server output ---- */

struct srv {
    uint8_t buf[1 << 20];
    size_t n;
};

static struct srv S;

static void frame(uint8_t type, uint8_t flags, uint32_t sid, const void *payload, size_t len)
{
    h2_frame_header_write(S.buf + S.n, (uint32_t)len, type, flags, sid);
    memcpy(S.buf + S.n + 9, payload, len);
    S.n += 9 + len;
}

/* fields: "name", "value", ..., NULL */
static size_t block(uint8_t *out, size_t cap, const char *const *fields)
{
    size_t pos = 0;
    for (size_t i = 0; fields[i]; i += 2) {
        ptrdiff_t k = hpack_encode_field(out + pos, cap - pos, fields[i], fields[i + 1], 0);
        if (k < 0)
            abort();
        pos += (size_t)k;
    }
    return pos;
}

static void headers(uint8_t flags, const char *const *fields)
{
    uint8_t b[4096];
    frame(H2_HEADERS, flags | H2_FLAG_END_HEADERS, 1, b, block(b, sizeof(b), fields));
}

static void server_settings(void)
{
    static const uint8_t s[] = {0, 4, 0, 0, 0xff, 0xff, 0, 5, 0, 0, 0x40, 0}; /* window 65535, frame 16384 */
    frame(H2_SETTINGS, 0, 0, s, sizeof(s));
}

static const char *const OK_HEADERS[] = {":status", "200", "content-type", "application/grpc", NULL};
static const char *const OK_TRAILERS[] = {"grpc-status", "0", NULL};

static void empty_message(void) { frame(H2_DATA, 0, 1, "\0\0\0\0\0", 5); }

/* ---- driving the engine ---- */

static char trace_text[16384];
static void trace_cb(void *ctx, const char *line)
{
    (void)ctx;
    size_t len = strlen(trace_text);
    snprintf(trace_text + len, sizeof(trace_text) - len, "%s\n", line);
}

static void start(struct grpc_unary *c)
{
    static const uint8_t msg[] = {0x0a, 0x03, 'u', 'i', 'd'};
    struct grpc_call_spec spec = {PATH, "localhost", "1000m", msg, sizeof(msg)};
    trace_text[0] = '\0';
    S.n = 0;
    CHECK_INT(grpc_unary_start(c, &spec, trace_cb, NULL), 0);
    const uint8_t *p;
    size_t n;
    grpc_unary_pending(c, &p, &n);
    grpc_unary_consumed(c, n); /* the request is checked in request_bytes */
}

/* Feed all of S (in pieces of `chunk` octets) and return the outcome. */
static enum grpc_outcome run_chunked(struct grpc_unary *c, size_t chunk)
{
    enum grpc_outcome o = CALL_PENDING;
    for (size_t off = 0; off < S.n && o == CALL_PENDING; off += chunk)
        o = grpc_unary_feed(c, S.buf + off, S.n - off < chunk ? S.n - off : chunk);
    return o;
}

static enum grpc_outcome run(struct grpc_unary *c) { return run_chunked(c, S.n ? S.n : 1); }

/* Did the engine queue a frame of this type (e.g. a GOAWAY, a PING ACK)? Returns its payload. */
static const uint8_t *queued(struct grpc_unary *c, uint8_t type, uint8_t flags, size_t *len)
{
    const uint8_t *p;
    size_t n;
    grpc_unary_pending(c, &p, &n);
    struct h2_frame f;
    ptrdiff_t r;
    for (size_t off = 0; (r = h2_frame_parse(p + off, n - off, 1 << 20, &f)) > 0; off += (size_t)r)
        if (f.type == type && f.flags == flags) {
            if (len)
                *len = f.length;
            return f.payload;
        }
    return NULL;
}

/* ---- tests ---- */

struct seen {
    char text[1024];
};
static int seen_cb(void *ctx, const struct hpack_field *f)
{
    struct seen *s = ctx;
    size_t len = strlen(s->text);
    snprintf(s->text + len, sizeof(s->text) - len, "%s: %s\n", f->name, f->value);
    return 0;
}

static void request_bytes(void)
{
    static const uint8_t msg[] = {0x0a, 0x03, 'u', 'i', 'd'};
    struct grpc_call_spec spec = {PATH, "localhost", "12000m", msg, sizeof(msg)};
    struct grpc_unary c;
    CHECK_INT(grpc_unary_start(&c, &spec, NULL, NULL), 0);
    const uint8_t *p;
    size_t n;
    grpc_unary_pending(&c, &p, &n);
    CHECK(n > H2_PREFACE_LEN);
    CHECK_MEM(p, H2_PREFACE_LEN, H2_PREFACE, H2_PREFACE_LEN);
    size_t off = H2_PREFACE_LEN;
    struct h2_frame f;
    ptrdiff_t r = h2_frame_parse(p + off, n - off, H2_DEFAULT_MAX_FRAME, &f);
    CHECK_INT(f.type, H2_SETTINGS);
    CHECK_INT(f.flags, 0);
    CHECK_INT(f.length % 6, 0);
    int push_off = 0;
    for (size_t i = 0; i < f.length / 6; i++) {
        struct h2_setting s = h2_setting_at(&f, i);
        push_off |= s.id == H2_SETTINGS_ENABLE_PUSH && s.value == 0;
    }
    CHECK(push_off);
    off += (size_t)r;
    r = h2_frame_parse(p + off, n - off, H2_DEFAULT_MAX_FRAME, &f);
    CHECK_INT(f.type, H2_HEADERS);
    CHECK_INT(f.flags, H2_FLAG_END_HEADERS); /* END_STREAM comes with the DATA */
    CHECK_INT(f.stream_id, 1);
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    struct seen s = {""};
    CHECK_INT(hpack_decode_block(&t, f.payload, f.length, seen_cb, &s), HPACK_OK);
    CHECK_STR(s.text, ":method: POST\n:scheme: http\n:path: " PATH "\n:authority: localhost\n"
                      "content-type: application/grpc\nte: trailers\nuser-agent: vgpu-register/1 (vgpud)\n"
                      "grpc-timeout: 12000m\n");
    hpack_dtable_free(&t);
    off += (size_t)r;
    r = h2_frame_parse(p + off, n - off, H2_DEFAULT_MAX_FRAME, &f);
    CHECK_INT(f.type, H2_DATA);
    CHECK_INT(f.flags, H2_FLAG_END_STREAM);
    CHECK_MEM(f.payload, f.length, "\0\0\0\0\x05\x0a\x03uid", 10);
    CHECK_INT(off + (size_t)r, n);
    grpc_unary_free(&c);

    /* Too large a request is refused up front. */
    static uint8_t big[GRPC_MAX_MESSAGE + 1];
    spec.message = big;
    spec.message_len = sizeof(big);
    CHECK_INT(grpc_unary_start(&c, &spec, NULL, NULL), -1);
    CHECK_INT(c.result.outcome, CALL_PROTOCOL);
    grpc_unary_free(&c);
}

static void full_response_ok(void)
{
    for (size_t chunk = 1; chunk <= 4096; chunk *= 8) {
        struct grpc_unary c;
        start(&c);
        server_settings();
        frame(H2_SETTINGS, H2_FLAG_ACK, 0, "", 0);
        frame(H2_WINDOW_UPDATE, 0, 0, "\0\0\x10\0", 4);
        headers(0, OK_HEADERS);
        empty_message();
        headers(H2_FLAG_END_STREAM, OK_TRAILERS);
        CHECK_INT(run_chunked(&c, chunk), CALL_STATUS);
        CHECK_INT(c.result.code, GRPC_OK);
        CHECK(queued(&c, H2_SETTINGS, H2_FLAG_ACK, NULL) != NULL); /* we acknowledged theirs */
        grpc_unary_free(&c);
    }
}

static void trailers_only_with_percent_message(void)
{
    struct grpc_unary c;
    start(&c);
    server_settings();
    static const char *const t[] = {":status", "200", "content-type", "application/grpc", "grpc-status", "5",
                                    "grpc-message", "pod%20abc%20not%20found%3A%20%C3%BC%zz%", NULL};
    headers(H2_FLAG_END_STREAM, t);
    CHECK_INT(run(&c), CALL_STATUS);
    CHECK_INT(c.result.code, GRPC_NOT_FOUND);
    CHECK_STR(c.result.message, "pod abc not found: \xc3\xbc%zz%");
    CHECK(strstr(trace_text, "HEADERS stream=1 length=") && strstr(trace_text, "END_STREAM END_HEADERS"));
    grpc_unary_free(&c);
}

static void continuation_padding_priority(void)
{
    struct grpc_unary c;
    start(&c);
    server_settings();
    /* Response headers split over HEADERS(PADDED|PRIORITY) + two CONTINUATIONs. */
    uint8_t b[256];
    size_t bl = block(b, sizeof(b), OK_HEADERS);
    uint8_t first[64] = {3, 0, 0, 0, 0, 16}; /* pad 3, priority 5 octets */
    memcpy(first + 6, b, 2);
    memset(first + 8, 0, 3);
    frame(H2_HEADERS, H2_FLAG_PADDED | H2_FLAG_PRIORITY, 1, first, 11);
    frame(H2_CONTINUATION, 0, 1, b + 2, 1);
    frame(H2_CONTINUATION, H2_FLAG_END_HEADERS, 1, b + 3, bl - 3);
    /* The message over two DATA frames, the first padded. */
    frame(H2_DATA, H2_FLAG_PADDED, 1, "\x02\0\0\0\xff\xff", 6);
    frame(H2_DATA, 0, 1, "\0\0", 2);
    /* Trailers over HEADERS + CONTINUATION; END_STREAM sits on the HEADERS (§8.1). */
    uint8_t tb[64];
    size_t tl = block(tb, sizeof(tb), OK_TRAILERS);
    frame(H2_HEADERS, H2_FLAG_END_STREAM, 1, tb, 1);
    frame(H2_CONTINUATION, H2_FLAG_END_HEADERS, 1, tb + 1, tl - 1);
    CHECK_INT(run(&c), CALL_STATUS);
    CHECK_INT(c.result.code, GRPC_OK);
    grpc_unary_free(&c);
}

static void ping_is_answered(void)
{
    struct grpc_unary c;
    start(&c);
    server_settings();
    frame(H2_PING, 0, 0, "12345678", 8);
    frame(H2_PING, H2_FLAG_ACK, 0, "ignored!", 8);
    CHECK_INT(run(&c), CALL_PENDING);
    size_t len = 0;
    const uint8_t *p = queued(&c, H2_PING, H2_FLAG_ACK, &len);
    CHECK(p != NULL);
    if (p)
        CHECK_MEM(p, len, "12345678", 8);
    grpc_unary_free(&c);
}

static void goaway_cases(void)
{
    struct grpc_unary c;
    /* last-stream-id 0: our call was not processed. */
    start(&c);
    server_settings();
    frame(H2_GOAWAY, 0, 0, "\0\0\0\0\0\0\0\0shutting down", 21);
    CHECK_INT(run(&c), CALL_UNAVAILABLE);
    CHECK_INT(c.result.code, GRPC_UNAVAILABLE);
    CHECK(strstr(c.result.message, "GOAWAY (NO_ERROR: shutting down)") != NULL);
    grpc_unary_free(&c);
    /* last-stream-id 1: the call completes normally. */
    start(&c);
    server_settings();
    frame(H2_GOAWAY, 0, 0, "\0\0\0\1\0\0\0\0", 8);
    headers(0, OK_HEADERS);
    empty_message();
    headers(H2_FLAG_END_STREAM, OK_TRAILERS);
    CHECK_INT(run(&c), CALL_STATUS);
    CHECK_INT(c.result.code, GRPC_OK);
    grpc_unary_free(&c);
    /* ... or the connection closes before it does. */
    start(&c);
    server_settings();
    frame(H2_GOAWAY, 0, 0, "\0\0\0\1\0\0\0\2", 8);
    headers(0, OK_HEADERS);
    CHECK_INT(run(&c), CALL_PENDING);
    CHECK_INT(grpc_unary_eof(&c), CALL_UNAVAILABLE);
    CHECK(strstr(c.result.message, "after GOAWAY (INTERNAL_ERROR)") != NULL);
    grpc_unary_free(&c);
}

static void rst_stream_maps_to_status(void)
{
    static const struct {
        uint8_t code;
        int status;
    } cases[] = {{H2_REFUSED_STREAM, GRPC_UNAVAILABLE},      {H2_CANCEL, GRPC_CANCELLED},
                 {H2_ENHANCE_YOUR_CALM, GRPC_RESOURCE_EXHAUSTED}, {H2_INADEQUATE_SECURITY, GRPC_PERMISSION_DENIED},
                 {H2_PROTOCOL_ERROR, GRPC_INTERNAL},          {H2_NO_ERROR, GRPC_INTERNAL}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct grpc_unary c;
        start(&c);
        server_settings();
        uint8_t code[4] = {0, 0, 0, cases[i].code};
        frame(H2_RST_STREAM, 0, 1, code, 4);
        CHECK_INT(run(&c), CALL_STATUS);
        CHECK_INT(c.result.code, cases[i].status);
        grpc_unary_free(&c);
    }
}

static void dynamic_table_across_blocks(void)
{
    /* Like grpcio: index a field in the response headers, refer to it from the trailers. */
    struct grpc_unary c;
    start(&c);
    server_settings();
    uint8_t b[256];
    size_t n = 0;
    b[n++] = 0x88; /* :status 200 */
    n += hpack_int_encode(b + n, sizeof(b) - n, 6, 0x40, 31); /* content-type, incremental */
    b[n++] = 16;
    memcpy(b + n, "application/grpc", 16);
    n += 16;
    b[n++] = 0x40; /* new name, incremental: grpc-status: 0 */
    b[n++] = 11;
    memcpy(b + n, "grpc-status", 11);
    n += 11;
    b[n++] = 1;
    b[n++] = '0';
    /* The headers carry grpc-status too (harmless); the trailers reuse it by index 62. */
    frame(H2_HEADERS, H2_FLAG_END_HEADERS, 1, b, n);
    empty_message();
    frame(H2_HEADERS, H2_FLAG_END_HEADERS | H2_FLAG_END_STREAM, 1, "\xbe", 1);
    CHECK_INT(run(&c), CALL_STATUS);
    CHECK_INT(c.result.code, GRPC_OK);
    CHECK_INT(c.dtable.count, 2);
    grpc_unary_free(&c);
}

static void huffman_is_traced(void)
{
    struct grpc_unary c;
    start(&c);
    server_settings();
    static const char *const t[] = {":status", "200", "content-type", "application/grpc", "grpc-status", "8",
                                    "grpc-message", "too many requests in flight for this caller", NULL};
    headers(H2_FLAG_END_STREAM, t);
    CHECK_INT(run(&c), CALL_STATUS);
    CHECK_INT(c.result.code, GRPC_RESOURCE_EXHAUSTED);
    CHECK_STR(c.result.message, "too many requests in flight for this caller");
    CHECK(strstr(trace_text, "grpc-message: too many requests in flight for this caller [huffman]") != NULL);
    grpc_unary_free(&c);
}

/* A response the call must refuse: its outcome, status, a phrase of the message, and whether it is
 * a connection error (so a GOAWAY is queued). */
struct bad_case {
    const char *name;
    void (*build)(void);
    enum grpc_outcome outcome;
    int code;
    const char *needle;
    int goaway;
};

static void b_no_settings_first(void) { headers(0, OK_HEADERS); }
static void b_settings_ack_first(void) { frame(H2_SETTINGS, H2_FLAG_ACK, 0, "", 0); }
static void b_http1(void) { memcpy(S.buf, "HTTP/1.1 400 Bad Request\r\n\r\n", 28), S.n = 28; }
static void b_data_before_headers(void) { server_settings(), empty_message(); }
static void b_no_grpc_status(void)
{
    server_settings();
    headers(0, OK_HEADERS);
    empty_message();
    static const char *const t[] = {"grpc-message", "x", NULL};
    headers(H2_FLAG_END_STREAM, t);
}
static void b_ok_without_message(void) { server_settings(), headers(0, OK_HEADERS), headers(H2_FLAG_END_STREAM, OK_TRAILERS); }
static void b_two_messages(void)
{
    server_settings(), headers(0, OK_HEADERS), empty_message(), empty_message();
    headers(H2_FLAG_END_STREAM, OK_TRAILERS);
}
static void b_compressed(void)
{
    server_settings(), headers(0, OK_HEADERS);
    frame(H2_DATA, 0, 1, "\1\0\0\0\0", 5);
    headers(H2_FLAG_END_STREAM, OK_TRAILERS);
}
static void b_bad_protobuf(void)
{
    server_settings(), headers(0, OK_HEADERS);
    frame(H2_DATA, 0, 1, "\0\0\0\0\2\x0a\x05", 7); /* field 1, length 5, no bytes */
    headers(H2_FLAG_END_STREAM, OK_TRAILERS);
}
static void b_http_503(void)
{
    static const char *const h[] = {":status", "503", "content-type", "text/plain", NULL};
    server_settings(), headers(H2_FLAG_END_STREAM, h);
}
static void b_wrong_content_type(void)
{
    static const char *const h[] = {":status", "200", "content-type", "text/html", NULL};
    server_settings(), headers(0, h);
}
static void b_ping_inside_block(void)
{
    uint8_t b[64];
    size_t n = block(b, sizeof(b), OK_HEADERS);
    server_settings();
    frame(H2_HEADERS, 0, 1, b, 1);
    frame(H2_PING, 0, 0, "12345678", 8);
    frame(H2_CONTINUATION, H2_FLAG_END_HEADERS, 1, b + 1, n - 1);
}
static void b_stray_continuation(void) { server_settings(), frame(H2_CONTINUATION, H2_FLAG_END_HEADERS, 1, "\x88", 1); }
static void b_hpack_garbage(void) { server_settings(), frame(H2_HEADERS, H2_FLAG_END_HEADERS, 1, "\xff\xff\xff\xff\xff\x0f", 6); }
static void b_too_big(void)
{
    server_settings();
    h2_frame_header_write(S.buf + S.n, H2_DEFAULT_MAX_FRAME + 1, H2_DATA, 0, 1);
    S.n += 9;
}
static void b_headers_stream3(void) { server_settings(), frame(H2_HEADERS, H2_FLAG_END_HEADERS, 3, "\x88", 1); }
static void b_push_promise(void) { server_settings(), frame(H2_PUSH_PROMISE, H2_FLAG_END_HEADERS, 1, "\0\0\0\2\x88", 5); }
static void b_data_end_stream(void) { server_settings(), headers(0, OK_HEADERS), frame(H2_DATA, H2_FLAG_END_STREAM, 1, "\0\0\0\0\0", 5); }
static void b_trailers_no_end_stream(void)
{
    server_settings(), headers(0, OK_HEADERS), empty_message(), headers(0, OK_TRAILERS);
}
static void b_pseudo_in_trailers(void)
{
    static const char *const t[] = {":status", "200", "grpc-status", "0", NULL};
    server_settings(), headers(0, OK_HEADERS), empty_message(), headers(H2_FLAG_END_STREAM, t);
}
static void b_bad_grpc_status(void)
{
    static const char *const t[] = {":status", "200", "grpc-status", "x1", NULL};
    server_settings(), headers(H2_FLAG_END_STREAM, t);
}
static void b_enable_push(void) { server_settings(), frame(H2_SETTINGS, 0, 0, "\0\2\0\0\0\2", 6); }
static void b_bad_max_frame(void) { frame(H2_SETTINGS, 0, 0, "\0\5\0\0\0\1", 6); }
static void b_message_too_big(void)
{
    static uint8_t chunk[H2_DEFAULT_MAX_FRAME];
    server_settings(), headers(0, OK_HEADERS);
    frame(H2_DATA, 0, 1, chunk, sizeof(chunk));
    frame(H2_DATA, 0, 1, chunk, 100);
}
static void b_window_overrun(void)
{
    static uint8_t padding[256] = {255};
    server_settings(), headers(0, OK_HEADERS);
    for (int i = 0; i < 256; i++)
        frame(H2_DATA, H2_FLAG_PADDED, 1, padding, sizeof(padding));
}
static void b_zero_window_update(void) { server_settings(), frame(H2_WINDOW_UPDATE, 0, 0, "\0\0\0\0", 4); }
static void b_no_status(void)
{
    static const char *const h[] = {"content-type", "application/grpc", NULL};
    server_settings(), headers(0, h);
}

static void protocol_violations(void)
{
    static const struct bad_case cases[] = {
        {"DATA first", b_no_settings_first, CALL_PROTOCOL, GRPC_INTERNAL, "did not start with SETTINGS", 1},
        {"SETTINGS ACK first", b_settings_ack_first, CALL_PROTOCOL, GRPC_INTERNAL, "did not start with SETTINGS", 1},
        {"HTTP/1", b_http1, CALL_PROTOCOL, GRPC_INTERNAL, "HTTP/1", 0},
        {"DATA before headers", b_data_before_headers, CALL_PROTOCOL, GRPC_INTERNAL, "DATA before", 0},
        {"no grpc-status", b_no_grpc_status, CALL_PROTOCOL, GRPC_INTERNAL, "without grpc-status", 0},
        {"OK, no message", b_ok_without_message, CALL_PROTOCOL, GRPC_INTERNAL, "without a response message", 0},
        {"two messages", b_two_messages, CALL_PROTOCOL, GRPC_INTERNAL, "exactly one message", 0},
        {"compressed", b_compressed, CALL_PROTOCOL, GRPC_INTERNAL, "compressed", 0},
        {"bad protobuf", b_bad_protobuf, CALL_PROTOCOL, GRPC_INTERNAL, "not valid protobuf", 0},
        {"HTTP 503", b_http_503, CALL_STATUS, GRPC_UNAVAILABLE, "HTTP status 503", 0},
        {"text/html", b_wrong_content_type, CALL_PROTOCOL, GRPC_INTERNAL, "content-type", 0},
        {"PING inside a block", b_ping_inside_block, CALL_PROTOCOL, GRPC_INTERNAL, "inside a header block", 1},
        {"stray CONTINUATION", b_stray_continuation, CALL_PROTOCOL, GRPC_INTERNAL, "without an open header block", 1},
        {"HPACK garbage", b_hpack_garbage, CALL_PROTOCOL, GRPC_INTERNAL, "HPACK", 1},
        {"frame too big", b_too_big, CALL_PROTOCOL, GRPC_INTERNAL, "larger than 16384", 1},
        {"HEADERS stream 3", b_headers_stream3, CALL_PROTOCOL, GRPC_INTERNAL, "stream 3", 1},
        {"PUSH_PROMISE", b_push_promise, CALL_PROTOCOL, GRPC_INTERNAL, "PUSH_PROMISE", 1},
        {"DATA END_STREAM", b_data_end_stream, CALL_PROTOCOL, GRPC_INTERNAL, "without trailers", 0},
        {"trailers no END_STREAM", b_trailers_no_end_stream, CALL_PROTOCOL, GRPC_INTERNAL, "without END_STREAM", 0},
        {"pseudo in trailers", b_pseudo_in_trailers, CALL_PROTOCOL, GRPC_INTERNAL, "pseudo-header", 0},
        {"grpc-status x1", b_bad_grpc_status, CALL_PROTOCOL, GRPC_INTERNAL, "not a number", 0},
        {"ENABLE_PUSH 2", b_enable_push, CALL_PROTOCOL, GRPC_INTERNAL, "ENABLE_PUSH", 1},
        {"MAX_FRAME_SIZE 1", b_bad_max_frame, CALL_PROTOCOL, GRPC_INTERNAL, "MAX_FRAME_SIZE", 1},
        {"message too big", b_message_too_big, CALL_PROTOCOL, GRPC_RESOURCE_EXHAUSTED, "larger than", 0},
        {"window overrun", b_window_overrun, CALL_PROTOCOL, GRPC_INTERNAL, "flow-control", 1},
        {"zero WINDOW_UPDATE", b_zero_window_update, CALL_PROTOCOL, GRPC_INTERNAL, "WINDOW_UPDATE", 1},
        {"no :status", b_no_status, CALL_PROTOCOL, GRPC_INTERNAL, ":status", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct grpc_unary c;
        start(&c);
        cases[i].build();
        enum grpc_outcome o = run(&c);
        int ok = o == cases[i].outcome && c.result.code == cases[i].code && strstr(c.result.message, cases[i].needle);
        if (cases[i].goaway)
            ok = ok && queued(&c, H2_GOAWAY, 0, NULL) != NULL;
        if (!ok)
            fprintf(stderr, "  case \"%s\": outcome %d code %d message \"%s\"\n", cases[i].name, o, c.result.code,
                    c.result.message);
        CHECK(ok);
        grpc_unary_free(&c);
    }
}

static void eof_and_expiry(void)
{
    struct grpc_unary c;
    start(&c);
    CHECK_INT(grpc_unary_eof(&c), CALL_UNAVAILABLE);
    CHECK(strstr(c.result.message, "before its HTTP/2 preface") != NULL);
    grpc_unary_free(&c);

    start(&c);
    server_settings();
    headers(0, OK_HEADERS);
    run(&c);
    CHECK_INT(grpc_unary_eof(&c), CALL_UNAVAILABLE);
    CHECK(strstr(c.result.message, "before the response was complete") != NULL);
    grpc_unary_free(&c);

    start(&c);
    grpc_unary_expire(&c, "no answer within 5 ms");
    CHECK_INT(c.result.outcome, CALL_DEADLINE);
    CHECK_INT(c.result.code, GRPC_DEADLINE_EXCEEDED);
    size_t len = 0;
    const uint8_t *p = queued(&c, H2_RST_STREAM, 0, &len);
    CHECK(p != NULL && len == 4 && p[3] == H2_CANCEL);
    /* Once over, more input changes nothing. */
    server_settings();
    headers(H2_FLAG_END_STREAM, OK_TRAILERS);
    CHECK_INT(run(&c), CALL_DEADLINE);
    grpc_unary_free(&c);
}

static void status_helpers(void)
{
    CHECK_STR(grpc_code_name(GRPC_NOT_FOUND), "NOT_FOUND");
    CHECK_STR(grpc_code_name(GRPC_UNAUTHENTICATED), "UNAUTHENTICATED");
    CHECK(grpc_code_name(17) == NULL && grpc_code_name(-1) == NULL);
    CHECK_INT(grpc_code_from_http(404), GRPC_UNIMPLEMENTED);
    CHECK_INT(grpc_code_from_http(429), GRPC_UNAVAILABLE);
    CHECK_INT(grpc_code_from_http(401), GRPC_UNAUTHENTICATED);
    CHECK_INT(grpc_code_from_http(418), GRPC_UNKNOWN);
    char out[64];
    CHECK_INT(grpc_percent_decode("a%41%4a%4A%", 11, out, sizeof(out)), 5);
    CHECK_STR(out, "aAJJ%");
    grpc_percent_decode("%4", 2, out, sizeof(out));
    CHECK_STR(out, "%4");
    grpc_percent_decode("%g1x", 4, out, sizeof(out));
    CHECK_STR(out, "%g1x");
    CHECK_INT(grpc_percent_decode("abcdef", 6, out, 4), 3); /* truncated to the buffer */
    CHECK_STR(out, "abc");
    char t[16];
    grpc_timeout_format(12000, t);
    CHECK_STR(t, "12000m");
    grpc_timeout_format(99999999, t);
    CHECK_STR(t, "99999999m");
    grpc_timeout_format(100000000, t);
    CHECK_STR(t, "100000S");
    grpc_timeout_format(100000001, t); /* rounded up, never less time than we wait */
    CHECK_STR(t, "100001S");
    grpc_timeout_format(0, t);
    CHECK_STR(t, "0m");
}

static void pbwire(void)
{
    uint8_t buf[512];
    CHECK_INT(pb_put_string(buf, sizeof(buf), 1, "", 0), 0); /* proto3 omits empty strings */
    CHECK_INT(pb_put_string(buf, sizeof(buf), 2, "ab", 2), 4);
    CHECK_MEM(buf, 4, "\x12\x02" "ab", 4);
    char long_value[300];
    memset(long_value, 'x', sizeof(long_value));
    CHECK_INT(pb_put_string(buf, sizeof(buf), 3, long_value, 300), 303); /* 1a ac 02 ... */
    CHECK_MEM(buf, 3, "\x1a\xac\x02", 3);
    CHECK_INT(pb_put_string(buf, 10, 3, long_value, 300), -1);
    CHECK_INT(pb_wellformed(buf, 303), 0);
    CHECK_INT(pb_wellformed(buf, 302), -1);
    CHECK_INT(pb_wellformed((const uint8_t *)"", 0), 0);
    CHECK_INT(pb_wellformed((const uint8_t *)"\x08\x96\x01", 3), 0);               /* varint field */
    CHECK_INT(pb_wellformed((const uint8_t *)"\x0d\1\2\3\4\x11\1\2\3\4\5\6\7\x08", 14), 0); /* fixed32, fixed64 */
    CHECK_INT(pb_wellformed((const uint8_t *)"\x0b", 1), -1);                     /* group start */
    CHECK_INT(pb_wellformed((const uint8_t *)"\x00\x01", 2), -1);                 /* field 0 */
    CHECK_INT(pb_wellformed((const uint8_t *)"\x08\x80", 2), -1);                 /* unterminated varint */
}

int main(void)
{
    RUN(request_bytes);
    RUN(full_response_ok);
    RUN(trailers_only_with_percent_message);
    RUN(continuation_padding_priority);
    RUN(ping_is_answered);
    RUN(goaway_cases);
    RUN(rst_stream_maps_to_status);
    RUN(dynamic_table_across_blocks);
    RUN(huffman_is_traced);
    RUN(protocol_violations);
    RUN(eof_and_expiry);
    RUN(status_helpers);
    RUN(pbwire);
    return check_summary("test_grpc_unary");
}

/* HTTP/2 framing: header round trip, truncated input asks for more, oversized lengths are refused
 * before buffering, the per-type rules of RFC 9113 §6, padding/priority stripping, garbage. */
#include "check.h"
#include "h2.h"

static void header_round_trip(void)
{
    uint8_t buf[64];
    h2_frame_header_write(buf, 0x012345, H2_HEADERS, H2_FLAG_END_HEADERS, 0x7fffffff);
    CHECK_MEM(buf, 9, "\x01\x23\x45\x01\x04\x7f\xff\xff\xff", 9);
    /* The reserved bit is dropped on write and ignored on read. */
    h2_frame_header_write(buf, 3, H2_DATA, 0, 0xffffffffu);
    CHECK_INT(buf[5], 0x7f);
    buf[5] = 0xff;
    memcpy(buf + 9, "abc", 3);
    struct h2_frame f;
    CHECK_INT(h2_frame_parse(buf, 12, H2_DEFAULT_MAX_FRAME, &f), 12);
    CHECK_INT(f.stream_id, 0x7fffffff);
    CHECK_INT(f.length, 3);
    CHECK_INT(f.type, H2_DATA);
    CHECK_MEM(f.payload, 3, "abc", 3);
}

static void truncated_input_needs_more(void)
{
    uint8_t buf[9 + 8];
    h2_frame_header_write(buf, 8, H2_PING, 0, 0);
    memset(buf + 9, 0x5a, 8);
    struct h2_frame f;
    for (size_t n = 0; n < sizeof(buf); n++)
        CHECK_INT(h2_frame_parse(buf, n, H2_DEFAULT_MAX_FRAME, &f), 0);
    CHECK_INT(h2_frame_parse(buf, sizeof(buf), H2_DEFAULT_MAX_FRAME, &f), 17);
    /* Two frames back to back: the parser takes exactly one. */
    uint8_t two[18];
    h2_frame_header_write(two, 0, H2_SETTINGS, H2_FLAG_ACK, 0);
    h2_frame_header_write(two + 9, 0, H2_SETTINGS, 0, 0);
    CHECK_INT(h2_frame_parse(two, sizeof(two), H2_DEFAULT_MAX_FRAME, &f), 9);
    CHECK_INT(f.flags, H2_FLAG_ACK);
}

static void oversized_is_refused_early(void)
{
    uint8_t buf[9];
    struct h2_frame f;
    h2_frame_header_write(buf, H2_DEFAULT_MAX_FRAME + 1, H2_DATA, 0, 1);
    /* Only the header is present: refused without waiting for 16 KiB of payload. */
    CHECK_INT(h2_frame_parse(buf, 9, H2_DEFAULT_MAX_FRAME, &f), H2_PARSE_TOO_BIG);
    h2_frame_header_write(buf, H2_DEFAULT_MAX_FRAME, H2_DATA, 0, 1);
    CHECK_INT(h2_frame_parse(buf, 9, H2_DEFAULT_MAX_FRAME, &f), 0);
    /* An HTTP/1 status line read as a frame header: 'H''T''T' = a 4.7 MB length. */
    CHECK_INT(h2_frame_parse((const uint8_t *)"HTTP/1.1 400", 12, H2_DEFAULT_MAX_FRAME, &f), H2_PARSE_TOO_BIG);
}

static enum h2_error check_frame(uint8_t type, uint8_t flags, uint32_t sid, const char *payload, size_t n)
{
    struct h2_frame f = {(uint32_t)n, type, flags, sid, (const uint8_t *)payload};
    return h2_frame_check(&f);
}

static void per_type_rules(void)
{
    const char z[16] = {0};
    /* Stream id zero where a stream is needed, and the reverse. */
    CHECK_INT(check_frame(H2_DATA, 0, 0, z, 1), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_HEADERS, 0, 0, z, 1), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_CONTINUATION, 0, 0, z, 1), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_RST_STREAM, 0, 0, z, 4), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_SETTINGS, 0, 1, z, 0), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_PING, 0, 1, z, 8), H2_PROTOCOL_ERROR);
    CHECK_INT(check_frame(H2_GOAWAY, 0, 1, z, 8), H2_PROTOCOL_ERROR);
    /* Fixed sizes. */
    CHECK_INT(check_frame(H2_SETTINGS, 0, 0, z, 6), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_SETTINGS, 0, 0, z, 7), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_SETTINGS, H2_FLAG_ACK, 0, z, 6), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_SETTINGS, H2_FLAG_ACK, 0, z, 0), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_PING, 0, 0, z, 7), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_PING, 0, 0, z, 8), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_GOAWAY, 0, 0, z, 7), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_GOAWAY, 0, 0, z, 12), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_RST_STREAM, 0, 1, z, 5), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_PRIORITY, 0, 1, z, 4), H2_FRAME_SIZE_ERROR);
    CHECK_INT(check_frame(H2_PRIORITY, 0, 1, z, 5), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_WINDOW_UPDATE, 0, 0, "\0\0\0\1", 4), H2_NO_ERROR);
    CHECK_INT(check_frame(H2_WINDOW_UPDATE, 0, 1, "\0\0\0\0", 4), H2_PROTOCOL_ERROR); /* zero increment */
    CHECK_INT(check_frame(H2_WINDOW_UPDATE, 0, 1, "\0\0\0\1\0", 5), H2_FRAME_SIZE_ERROR);
    /* We disabled push. */
    CHECK_INT(check_frame(H2_PUSH_PROMISE, H2_FLAG_END_HEADERS, 1, z, 4), H2_PROTOCOL_ERROR);
    /* Unknown types are ignored (§4.1, §5.5). */
    CHECK_INT(check_frame(0xfa, 0xff, 0, z, 3), H2_NO_ERROR);
}

static void padding_and_priority(void)
{
    struct h2_frame f;
    const uint8_t *body;
    size_t len;
    /* DATA, PADDED: pad length 2, "hi", two padding octets. */
    uint8_t data[] = {2, 'h', 'i', 0, 0};
    f = (struct h2_frame){sizeof(data), H2_DATA, H2_FLAG_PADDED, 1, data};
    CHECK_INT(h2_frame_check(&f), H2_NO_ERROR);
    h2_frame_body(&f, &body, &len);
    CHECK_MEM(body, len, "hi", 2);
    /* Padding filling the rest exactly: empty body, still legal. */
    uint8_t full[] = {4, 0, 0, 0, 0};
    f = (struct h2_frame){sizeof(full), H2_DATA, H2_FLAG_PADDED, 1, full};
    CHECK_INT(h2_frame_check(&f), H2_NO_ERROR);
    h2_frame_body(&f, &body, &len);
    CHECK_INT(len, 0);
    /* Padding longer than the payload: PROTOCOL_ERROR (§6.1). */
    uint8_t over[] = {5, 0, 0, 0, 0};
    f = (struct h2_frame){sizeof(over), H2_DATA, H2_FLAG_PADDED, 1, over};
    CHECK_INT(h2_frame_check(&f), H2_PROTOCOL_ERROR);
    /* PADDED with no room for the pad length itself. */
    f = (struct h2_frame){0, H2_DATA, H2_FLAG_PADDED, 1, over};
    CHECK_INT(h2_frame_check(&f), H2_PROTOCOL_ERROR);
    /* HEADERS with PADDED and PRIORITY: pad length, 5 priority octets, block, padding. */
    uint8_t hdr[] = {1, 0x80, 0, 0, 3, 15, 0x88, 0};
    f = (struct h2_frame){sizeof(hdr), H2_HEADERS, H2_FLAG_PADDED | H2_FLAG_PRIORITY | H2_FLAG_END_HEADERS, 1, hdr};
    CHECK_INT(h2_frame_check(&f), H2_NO_ERROR);
    h2_frame_body(&f, &body, &len);
    CHECK_MEM(body, len, "\x88", 1);
    /* PRIORITY flag but too short for its five octets. */
    f = (struct h2_frame){4, H2_HEADERS, H2_FLAG_PRIORITY, 1, hdr};
    CHECK_INT(h2_frame_check(&f), H2_PROTOCOL_ERROR);
    /* The PRIORITY flag means nothing on DATA. */
    f = (struct h2_frame){2, H2_DATA, H2_FLAG_PRIORITY, 1, (const uint8_t *)"ok"};
    h2_frame_body(&f, &body, &len);
    CHECK_MEM(body, len, "ok", 2);
}

static void settings_iteration(void)
{
    uint8_t p[] = {0, 1, 0, 0, 0x10, 0, 0, 5, 0, 0, 0x40, 0};
    struct h2_frame f = {sizeof(p), H2_SETTINGS, 0, 0, p};
    struct h2_setting s0 = h2_setting_at(&f, 0), s1 = h2_setting_at(&f, 1);
    CHECK_INT(s0.id, H2_SETTINGS_HEADER_TABLE_SIZE);
    CHECK_INT(s0.value, 4096);
    CHECK_INT(s1.id, H2_SETTINGS_MAX_FRAME_SIZE);
    CHECK_INT(s1.value, 16384);
}

static void names(void)
{
    CHECK_STR(h2_type_name(H2_GOAWAY), "GOAWAY");
    CHECK_STR(h2_type_name(0x42), "UNKNOWN");
    CHECK_STR(h2_error_name(H2_ENHANCE_YOUR_CALM), "ENHANCE_YOUR_CALM");
    CHECK_STR(h2_error_name(0x99), "UNKNOWN_ERROR");
}

/* Random octets: the parser never claims more than it was given, and checked frames always
 * strip to a body inside the payload. */
static void garbage(void)
{
    uint8_t buf[256];
    uint32_t x = 99;
    int broken = 0;
    for (int round = 0; round < 50000; round++) {
        size_t n = (size_t)(round % sizeof(buf));
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            buf[i] = (uint8_t)(x >> 24);
        }
        if (round % 3 == 0 && n >= 3)
            buf[0] = buf[1] = 0; /* small lengths, so whole frames occur */
        struct h2_frame f;
        ptrdiff_t r = h2_frame_parse(buf, n, H2_DEFAULT_MAX_FRAME, &f);
        if (r > (ptrdiff_t)n)
            broken++;
        if (r > 0 && h2_frame_check(&f) == H2_NO_ERROR && (f.type == H2_DATA || f.type == H2_HEADERS)) {
            const uint8_t *body;
            size_t len;
            h2_frame_body(&f, &body, &len);
            if (body < f.payload || body + len > f.payload + f.length)
                broken++;
        }
    }
    CHECK_INT(broken, 0);
}

int main(void)
{
    RUN(header_round_trip);
    RUN(truncated_input_needs_more);
    RUN(oversized_is_refused_early);
    RUN(per_type_rules);
    RUN(padding_and_priority);
    RUN(settings_iteration);
    RUN(names);
    RUN(garbage);
    return check_summary("test_h2");
}

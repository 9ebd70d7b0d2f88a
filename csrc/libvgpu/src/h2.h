/* HTTP/2 framing (RFC 9113 §4, §6): the frame header codec, the per-type size and stream-id rules,
 * and padding/priority stripping. No connection state here; grpc_unary.c keeps that. */
#ifndef VGPU_H2_H
#define VGPU_H2_H

#include <stddef.h>
#include <stdint.h>

#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_PREFACE_LEN 24
#define H2_FRAME_HEADER_LEN 9
#define H2_DEFAULT_MAX_FRAME 16384u
#define H2_MAX_MAX_FRAME 16777215u
#define H2_DEFAULT_WINDOW 65535u

enum h2_type {
    H2_DATA = 0x0,
    H2_HEADERS = 0x1,
    H2_PRIORITY = 0x2,
    H2_RST_STREAM = 0x3,
    H2_SETTINGS = 0x4,
    H2_PUSH_PROMISE = 0x5,
    H2_PING = 0x6,
    H2_GOAWAY = 0x7,
    H2_WINDOW_UPDATE = 0x8,
    H2_CONTINUATION = 0x9,
};

#define H2_FLAG_END_STREAM 0x01
#define H2_FLAG_ACK 0x01
#define H2_FLAG_END_HEADERS 0x04
#define H2_FLAG_PADDED 0x08
#define H2_FLAG_PRIORITY 0x20

enum h2_error {
    H2_NO_ERROR = 0x0,
    H2_PROTOCOL_ERROR = 0x1,
    H2_INTERNAL_ERROR = 0x2,
    H2_FLOW_CONTROL_ERROR = 0x3,
    H2_SETTINGS_TIMEOUT = 0x4,
    H2_STREAM_CLOSED = 0x5,
    H2_FRAME_SIZE_ERROR = 0x6,
    H2_REFUSED_STREAM = 0x7,
    H2_CANCEL = 0x8,
    H2_COMPRESSION_ERROR = 0x9,
    H2_CONNECT_ERROR = 0xa,
    H2_ENHANCE_YOUR_CALM = 0xb,
    H2_INADEQUATE_SECURITY = 0xc,
    H2_HTTP_1_1_REQUIRED = 0xd,
};

enum h2_setting_id {
    H2_SETTINGS_HEADER_TABLE_SIZE = 0x1,
    H2_SETTINGS_ENABLE_PUSH = 0x2,
    H2_SETTINGS_MAX_CONCURRENT_STREAMS = 0x3,
    H2_SETTINGS_INITIAL_WINDOW_SIZE = 0x4,
    H2_SETTINGS_MAX_FRAME_SIZE = 0x5,
    H2_SETTINGS_MAX_HEADER_LIST_SIZE = 0x6,
};

struct h2_frame {
    uint32_t length;
    uint8_t type;
    uint8_t flags;
    uint32_t stream_id; /* reserved bit dropped (§4.1) */
    const uint8_t *payload;
};

#define H2_PARSE_TOO_BIG (-1) /* length above our SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE_ERROR */

/* One frame from the front of buf: >0 octets consumed, 0 when more input is needed,
 * H2_PARSE_TOO_BIG when the header announces more than max_frame_size. */
ptrdiff_t h2_frame_parse(const uint8_t *buf, size_t n, uint32_t max_frame_size, struct h2_frame *f);

void h2_frame_header_write(uint8_t out[H2_FRAME_HEADER_LEN], uint32_t length, uint8_t type, uint8_t flags,
                           uint32_t stream_id);

/* §6 per-type rules (stream id zero or not, fixed lengths, padding that fits): H2_NO_ERROR or the
 * connection error code to send. Unknown types pass (§4.1: ignore them). */
enum h2_error h2_frame_check(const struct h2_frame *f);

/* The field block fragment of HEADERS, or the data of DATA, without padding and priority.
 * Call after h2_frame_check succeeded. */
void h2_frame_body(const struct h2_frame *f, const uint8_t **body, size_t *len);

struct h2_setting {
    uint16_t id;
    uint32_t value;
};
/* The i-th setting of a checked SETTINGS frame (i < length / 6). */
struct h2_setting h2_setting_at(const struct h2_frame *f, size_t i);

uint32_t h2_get_u32(const uint8_t *p);

const char *h2_type_name(uint8_t type);
const char *h2_error_name(uint32_t code);

#endif

/* HTTP/2 frame codec. Validation is separate from parsing so the parser can stay total (it never
 * reads past `n`) and the rules of §6 live in one table-like switch. */
#include "h2.h"

uint32_t h2_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

ptrdiff_t h2_frame_parse(const uint8_t *buf, size_t n, uint32_t max_frame_size, struct h2_frame *f)
{
    if (n < H2_FRAME_HEADER_LEN)
        return 0;
    uint32_t length = (uint32_t)buf[0] << 16 | (uint32_t)buf[1] << 8 | buf[2];
    /* Checked before waiting for the payload, so a garbage header cannot make us buffer 16 MiB. */
    if (length > max_frame_size)
        return H2_PARSE_TOO_BIG;
    if (n - H2_FRAME_HEADER_LEN < length)
        return 0;
    f->length = length;
    f->type = buf[3];
    f->flags = buf[4];
    f->stream_id = h2_get_u32(buf + 5) & 0x7fffffffu;
    f->payload = buf + H2_FRAME_HEADER_LEN;
    return (ptrdiff_t)(H2_FRAME_HEADER_LEN + length);
}

void h2_frame_header_write(uint8_t out[H2_FRAME_HEADER_LEN], uint32_t length, uint8_t type, uint8_t flags,
                           uint32_t stream_id)
{
    out[0] = (uint8_t)(length >> 16);
    out[1] = (uint8_t)(length >> 8);
    out[2] = (uint8_t)length;
    out[3] = type;
    out[4] = flags;
    out[5] = (uint8_t)((stream_id >> 24) & 0x7f);
    out[6] = (uint8_t)(stream_id >> 16);
    out[7] = (uint8_t)(stream_id >> 8);
    out[8] = (uint8_t)stream_id;
}

/* Octets of HEADERS/DATA preamble (pad length, priority) and padding; -1 if they do not fit. */
static long overhead(const struct h2_frame *f)
{
    long fixed = 0, pad = 0;
    if (f->flags & H2_FLAG_PADDED) {
        if (f->length < 1)
            return -1;
        fixed = 1;
        pad = f->payload[0];
    }
    if (f->type == H2_HEADERS && (f->flags & H2_FLAG_PRIORITY))
        fixed += 5;
    /* §6.1/§6.2: padding that is not shorter than the rest of the payload is a PROTOCOL_ERROR. */
    if (fixed + pad > (long)f->length)
        return -1;
    return fixed + pad;
}

enum h2_error h2_frame_check(const struct h2_frame *f)
{
    switch (f->type) {
    case H2_DATA:
    case H2_HEADERS:
        if (f->stream_id == 0)
            return H2_PROTOCOL_ERROR;
        return overhead(f) < 0 ? H2_PROTOCOL_ERROR : H2_NO_ERROR;
    case H2_CONTINUATION:
        return f->stream_id == 0 ? H2_PROTOCOL_ERROR : H2_NO_ERROR;
    case H2_PRIORITY:
        if (f->stream_id == 0)
            return H2_PROTOCOL_ERROR;
        return f->length == 5 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
    case H2_RST_STREAM:
        if (f->stream_id == 0)
            return H2_PROTOCOL_ERROR;
        return f->length == 4 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
    case H2_SETTINGS:
        if (f->stream_id != 0)
            return H2_PROTOCOL_ERROR;
        if (f->flags & H2_FLAG_ACK)
            return f->length == 0 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
        return f->length % 6 == 0 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
    case H2_PUSH_PROMISE:
        /* We send SETTINGS_ENABLE_PUSH=0, so any PUSH_PROMISE is a PROTOCOL_ERROR (§8.4). */
        return H2_PROTOCOL_ERROR;
    case H2_PING:
        if (f->stream_id != 0)
            return H2_PROTOCOL_ERROR;
        return f->length == 8 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
    case H2_GOAWAY:
        if (f->stream_id != 0)
            return H2_PROTOCOL_ERROR;
        return f->length >= 8 ? H2_NO_ERROR : H2_FRAME_SIZE_ERROR;
    case H2_WINDOW_UPDATE:
        if (f->length != 4)
            return H2_FRAME_SIZE_ERROR;
        /* A zero increment is a PROTOCOL_ERROR (§6.9); we fail the only stream either way. */
        return (h2_get_u32(f->payload) & 0x7fffffffu) == 0 ? H2_PROTOCOL_ERROR : H2_NO_ERROR;
    default:
        return H2_NO_ERROR;
    }
}

void h2_frame_body(const struct h2_frame *f, const uint8_t **body, size_t *len)
{
    size_t start = 0, pad = 0;
    if (f->flags & H2_FLAG_PADDED) {
        start = 1;
        pad = f->payload[0];
    }
    if (f->type == H2_HEADERS && (f->flags & H2_FLAG_PRIORITY))
        start += 5;
    *body = f->payload + start;
    *len = f->length - start - pad;
}

struct h2_setting h2_setting_at(const struct h2_frame *f, size_t i)
{
    const uint8_t *p = f->payload + 6 * i;
    return (struct h2_setting){(uint16_t)(p[0] << 8 | p[1]), h2_get_u32(p + 2)};
}

const char *h2_type_name(uint8_t type)
{
    static const char *const names[] = {"DATA",     "HEADERS", "PRIORITY", "RST_STREAM",    "SETTINGS",
                                        "PUSH_PROMISE", "PING", "GOAWAY",  "WINDOW_UPDATE", "CONTINUATION"};
    return type < sizeof(names) / sizeof(names[0]) ? names[type] : "UNKNOWN";
}

const char *h2_error_name(uint32_t code)
{
    static const char *const names[] = {
        "NO_ERROR",         "PROTOCOL_ERROR", "INTERNAL_ERROR",     "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
        "STREAM_CLOSED",    "FRAME_SIZE_ERROR", "REFUSED_STREAM",   "CANCEL",             "COMPRESSION_ERROR",
        "CONNECT_ERROR",    "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED",
    };
    return code < sizeof(names) / sizeof(names[0]) ? names[code] : "UNKNOWN_ERROR";
}

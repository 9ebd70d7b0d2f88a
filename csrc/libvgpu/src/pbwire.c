/* Protobuf wire format: varints, tags and length-delimited strings. */
#include "pbwire.h"

#include <string.h>

static size_t put_varint(uint8_t *dst, size_t cap, uint64_t v)
{
    size_t i = 0;
    do {
        if (i == cap)
            return 0;
        uint8_t b = v & 0x7f;
        v >>= 7;
        dst[i++] = v ? (uint8_t)(b | 0x80) : b;
    } while (v);
    return i;
}

ptrdiff_t pb_put_string(uint8_t *dst, size_t cap, uint32_t field, const char *s, size_t n)
{
    if (n == 0)
        return 0;
    size_t k = put_varint(dst, cap, (uint64_t)field << 3 | 2);
    if (k == 0)
        return -1;
    size_t l = put_varint(dst + k, cap - k, n);
    if (l == 0 || cap - k - l < n)
        return -1;
    memcpy(dst + k + l, s, n);
    return (ptrdiff_t)(k + l + n);
}

static int get_varint(const uint8_t *p, size_t n, size_t *pos, uint64_t *v)
{
    *v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*pos >= n)
            return -1;
        uint8_t b = p[(*pos)++];
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

int pb_wellformed(const uint8_t *p, size_t n)
{
    size_t pos = 0;
    while (pos < n) {
        uint64_t tag, v;
        if (get_varint(p, n, &pos, &tag) < 0 || (tag >> 3) == 0)
            return -1;
        switch (tag & 7) {
        case 0: /* varint */
            if (get_varint(p, n, &pos, &v) < 0)
                return -1;
            break;
        case 1: /* 64-bit */
            if (n - pos < 8)
                return -1;
            pos += 8;
            break;
        case 2: /* length-delimited */
            if (get_varint(p, n, &pos, &v) < 0 || v > n - pos)
                return -1;
            pos += (size_t)v;
            break;
        case 5: /* 32-bit */
            if (n - pos < 4)
                return -1;
            pos += 4;
            break;
        default: /* groups (3, 4) are long gone from proto3; 6, 7 do not exist */
            return -1;
        }
    }
    return 0;
}

/* HPACK encoding for our request headers: literals without indexing (§6.2.2) or never indexed
 * (§6.2.3), names indexed from the static table when possible. No dynamic table on our side, so
 * there is no encoder state to keep in step with the server's SETTINGS_HEADER_TABLE_SIZE. */
#include "hpack.h"
#include "huffman.h"

#include <string.h>

size_t hpack_int_encode(uint8_t *dst, size_t cap, unsigned prefix_bits, uint8_t first, uint32_t value)
{
    uint32_t mask = (1u << prefix_bits) - 1;
    if (cap == 0)
        return 0;
    if (value < mask) {
        dst[0] = (uint8_t)(first | value);
        return 1;
    }
    dst[0] = (uint8_t)(first | mask);
    value -= mask;
    size_t i = 1;
    while (value >= 128) {
        if (i >= cap)
            return 0;
        dst[i++] = (uint8_t)((value & 0x7f) | 0x80);
        value >>= 7;
    }
    if (i >= cap)
        return 0;
    dst[i++] = (uint8_t)value;
    return i;
}

/* §5.2 string literal; Huffman only when it is strictly shorter. */
static ptrdiff_t put_string(uint8_t *dst, size_t cap, const char *s, int raw)
{
    size_t n = strlen(s);
    size_t hlen = huff_encoded_len((const uint8_t *)s, n);
    int huffman = !raw && hlen < n;
    size_t len = huffman ? hlen : n;
    size_t k = hpack_int_encode(dst, cap, 7, huffman ? 0x80 : 0x00, (uint32_t)len);
    if (k == 0 || cap - k < len)
        return -1;
    if (huffman)
        huff_encode((const uint8_t *)s, n, dst + k, cap - k);
    else
        memcpy(dst + k, s, n);
    return (ptrdiff_t)(k + len);
}

ptrdiff_t hpack_encode_field(uint8_t *dst, size_t cap, const char *name, const char *value, unsigned flags)
{
    uint32_t exact = 0, named = 0;
    for (uint32_t i = 1; i <= HPACK_STATIC_COUNT; i++) {
        if (strcmp(hpack_static_table[i].name, name) != 0)
            continue;
        if (named == 0)
            named = i;
        if (strcmp(hpack_static_table[i].value, value) == 0) {
            exact = i;
            break;
        }
    }
    if (exact && !(flags & HPACK_ENC_NEVER_INDEXED)) {
        size_t k = hpack_int_encode(dst, cap, 7, 0x80, exact);
        return k ? (ptrdiff_t)k : -1;
    }
    int raw = (flags & HPACK_ENC_RAW) != 0;
    uint8_t first = (flags & HPACK_ENC_NEVER_INDEXED) ? 0x10 : 0x00;
    size_t pos = hpack_int_encode(dst, cap, 4, first, named);
    if (pos == 0)
        return -1;
    if (named == 0) {
        ptrdiff_t k = put_string(dst + pos, cap - pos, name, raw);
        if (k < 0)
            return -1;
        pos += (size_t)k;
    }
    ptrdiff_t k = put_string(dst + pos, cap - pos, value, raw);
    if (k < 0)
        return -1;
    return (ptrdiff_t)(pos + (size_t)k);
}

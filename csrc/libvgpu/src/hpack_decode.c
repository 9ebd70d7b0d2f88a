/* HPACK header block decoding (RFC 7541 §5, §6). Every representation is handled, since the
 * peer picks them. A block is decoded whole: HTTP/2 hands it over only after END_HEADERS, so
 * running out of input mid-representation is an error, never "need more". */
#include "hpack.h"
#include "huffman.h"

#include <stdlib.h>
#include <string.h>

int hpack_int_decode(const uint8_t *p, size_t n, unsigned prefix_bits, uint32_t *value)
{
    if (n == 0)
        return HPACK_ERR_TRUNCATED;
    uint32_t mask = (1u << prefix_bits) - 1;
    uint64_t v = p[0] & mask;
    if (v < mask) {
        *value = (uint32_t)v;
        return 1;
    }
    /* Five continuation octets carry 35 bits, enough for HPACK_INT_MAX; a sixth can only be an
     * overlong encoding, refused so a stream of 0x80 octets cannot spin here. */
    size_t i = 1;
    for (unsigned shift = 0;; shift += 7) {
        if (i >= n)
            return HPACK_ERR_TRUNCATED;
        if (shift > 28)
            return HPACK_ERR_INT_OVERFLOW;
        uint8_t b = p[i++];
        v += (uint64_t)(b & 0x7f) << shift;
        if (v > HPACK_INT_MAX)
            return HPACK_ERR_INT_OVERFLOW;
        if (!(b & 0x80))
            break;
    }
    *value = (uint32_t)v;
    return (int)i;
}

/* A string literal (§5.2) into a fresh NUL-terminated buffer the caller frees. */
static int read_string(const uint8_t *p, size_t n, size_t *used, char **out, size_t *out_len, int *huffman)
{
    if (n == 0)
        return HPACK_ERR_TRUNCATED;
    uint32_t len;
    int r = hpack_int_decode(p, n, 7, &len);
    if (r < 0)
        return r;
    if (len > n - (size_t)r)
        return HPACK_ERR_TRUNCATED;
    *huffman = (p[0] & 0x80) != 0;
    size_t cap = *huffman ? huff_decoded_max(len) : len;
    char *buf = malloc(cap + 1);
    if (buf == NULL)
        return HPACK_ERR_NOMEM;
    if (*huffman) {
        ptrdiff_t d = huff_decode(p + r, len, (uint8_t *)buf, cap);
        if (d < 0) {
            free(buf);
            return HPACK_ERR_HUFFMAN;
        }
        *out_len = (size_t)d;
    } else {
        memcpy(buf, p + r, len);
        *out_len = len;
    }
    buf[*out_len] = '\0';
    *out = buf;
    *used = (size_t)r + len;
    return HPACK_OK;
}

/* Index space of §2.3.3: 1..61 static, then the dynamic table newest first. */
static int lookup(const struct hpack_dtable *t, uint32_t index, const char **name, size_t *name_len,
                  const char **value, size_t *value_len)
{
    if (index == 0)
        return HPACK_ERR_INDEX;
    if (index <= HPACK_STATIC_COUNT) {
        *name = hpack_static_table[index].name;
        *value = hpack_static_table[index].value;
        *name_len = strlen(*name);
        *value_len = strlen(*value);
        return HPACK_OK;
    }
    const struct hpack_entry *e = hpack_dtable_get(t, index - HPACK_STATIC_COUNT);
    if (e == NULL)
        return HPACK_ERR_INDEX;
    *name = e->name;
    *name_len = e->name_len;
    *value = e->value;
    *value_len = e->value_len;
    return HPACK_OK;
}

static int emit(hpack_field_cb cb, void *ctx, const char *name, size_t name_len, const char *value,
                size_t value_len, unsigned flags)
{
    struct hpack_field f = {name, name_len, value, value_len, flags};
    return cb(ctx, &f) == 0 ? HPACK_OK : HPACK_ERR_CALLBACK;
}

/* §6.2: literal field, with incremental indexing (6-bit prefix) or without/never (4-bit). */
static int decode_literal(struct hpack_dtable *t, const uint8_t *p, size_t n, size_t *used, unsigned prefix,
                          int add, unsigned flags, hpack_field_cb cb, void *ctx)
{
    uint32_t index;
    int r = hpack_int_decode(p, n, prefix, &index);
    if (r < 0)
        return r;
    size_t pos = (size_t)r;

    char *own_name = NULL, *value = NULL;
    const char *name;
    size_t name_len, value_len, k;
    int huff, rc;
    if (index == 0) {
        rc = read_string(p + pos, n - pos, &k, &own_name, &name_len, &huff);
        if (rc < 0)
            return rc;
        pos += k;
        name = own_name;
        if (huff)
            flags |= HPACK_F_NAME_HUFFMAN;
    } else {
        const char *unused_value;
        size_t unused_len;
        rc = lookup(t, index, &name, &name_len, &unused_value, &unused_len);
        if (rc < 0)
            return rc;
    }
    rc = read_string(p + pos, n - pos, &k, &value, &value_len, &huff);
    if (rc < 0)
        goto out;
    pos += k;
    if (huff)
        flags |= HPACK_F_VALUE_HUFFMAN;
    rc = emit(cb, ctx, name, name_len, value, value_len, flags);
    if (rc == HPACK_OK && add)
        rc = hpack_dtable_add(t, name, name_len, value, value_len);
    *used = pos;
out:
    free(own_name);
    free(value);
    return rc;
}

int hpack_decode_block(struct hpack_dtable *t, const uint8_t *p, size_t n, hpack_field_cb cb, void *ctx)
{
    size_t pos = 0;
    int seen_field = 0;
    while (pos < n) {
        uint8_t b = p[pos];
        size_t used = 0;
        int rc;
        if (b & 0x80) { /* §6.1 indexed field */
            uint32_t index;
            rc = hpack_int_decode(p + pos, n - pos, 7, &index);
            if (rc < 0)
                return rc;
            used = (size_t)rc;
            const char *name, *value;
            size_t name_len, value_len;
            rc = lookup(t, index, &name, &name_len, &value, &value_len);
            if (rc == HPACK_OK)
                rc = emit(cb, ctx, name, name_len, value, value_len, HPACK_F_INDEXED);
            seen_field = 1;
        } else if ((b & 0xc0) == 0x40) { /* §6.2.1 incremental indexing */
            rc = decode_literal(t, p + pos, n - pos, &used, 6, 1, HPACK_F_ADDED, cb, ctx);
            seen_field = 1;
        } else if ((b & 0xe0) == 0x20) { /* §6.3 size update: only before the first field (§4.2) */
            if (seen_field)
                return HPACK_ERR_SIZE_UPDATE;
            uint32_t size;
            rc = hpack_int_decode(p + pos, n - pos, 5, &size);
            if (rc < 0)
                return rc;
            used = (size_t)rc;
            rc = hpack_dtable_set_max(t, size);
        } else { /* §6.2.2 without indexing (0000), §6.2.3 never indexed (0001) */
            unsigned flags = (b & 0x10) ? HPACK_F_NEVER_INDEXED : 0;
            rc = decode_literal(t, p + pos, n - pos, &used, 4, 0, flags, cb, ctx);
            seen_field = 1;
        }
        if (rc < 0)
            return rc;
        pos += used;
    }
    return HPACK_OK;
}

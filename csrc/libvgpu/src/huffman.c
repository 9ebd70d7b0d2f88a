/* HPACK Huffman encode/decode.
 *
 * The RFC 7541 code is canonical (codes of one length are consecutive, assigned in symbol order,
 * shorter lengths first), so decoding needs only, per length, how many codes it has and the symbols
 * in canonical order; the classic bit-at-a-time canonical decoder (as in zlib's puff) then walks the
 * input without a 257-node tree. The tables are rebuilt per call: 257 steps, negligible next to a
 * socket round trip, and it keeps the code free of lazily initialised globals. */
#include "huffman.h"

size_t huff_encoded_len(const uint8_t *src, size_t n)
{
    uint64_t bits = 0;
    for (size_t i = 0; i < n; i++)
        bits += vgpu_huff_table[src[i]].bits;
    return (size_t)((bits + 7) / 8);
}

ptrdiff_t huff_encode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap)
{
    uint64_t acc = 0; /* at most 7 pending + 30 new bits */
    unsigned pending = 0;
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        const struct huff_sym *s = &vgpu_huff_table[src[i]];
        acc = (acc << s->bits) | s->code;
        pending += s->bits;
        while (pending >= 8) {
            if (out == cap)
                return -1;
            pending -= 8;
            dst[out++] = (uint8_t)(acc >> pending);
        }
        acc &= (1u << pending) - 1;
    }
    if (pending > 0) {
        /* Pad with the most significant bits of EOS, i.e. ones (§5.2). */
        if (out == cap)
            return -1;
        unsigned pad = 8 - pending;
        dst[out++] = (uint8_t)((acc << pad) | ((1u << pad) - 1));
    }
    return (ptrdiff_t)out;
}

struct canon {
    uint16_t count[HUFF_MAX_BITS + 1];  /* codes per length */
    uint16_t sorted[HUFF_SYMBOLS];      /* symbols by (length, symbol) */
};

static void canon_build(struct canon *c)
{
    uint16_t offset[HUFF_MAX_BITS + 2] = {0};
    for (unsigned len = 0; len <= HUFF_MAX_BITS; len++)
        c->count[len] = 0;
    for (unsigned s = 0; s < HUFF_SYMBOLS; s++)
        c->count[vgpu_huff_table[s].bits]++;
    for (unsigned len = 1; len <= HUFF_MAX_BITS; len++)
        offset[len + 1] = (uint16_t)(offset[len] + c->count[len]);
    for (unsigned s = 0; s < HUFF_SYMBOLS; s++)
        c->sorted[offset[vgpu_huff_table[s].bits]++] = (uint16_t)s;
}

ptrdiff_t huff_decode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap)
{
    struct canon c;
    canon_build(&c);

    size_t out = 0;
    uint32_t code = 0;  /* bits of the symbol being read */
    uint32_t first = 0; /* first code of the current length */
    uint32_t index = 0; /* position of that code in c.sorted */
    unsigned len = 0;   /* bits read for the current symbol */
    int all_ones = 1;   /* so far the current symbol's bits are a prefix of EOS */

    for (size_t i = 0; i < n; i++) {
        for (int b = 7; b >= 0; b--) {
            unsigned bit = (src[i] >> b) & 1u;
            code |= bit;
            all_ones &= (int)bit;
            len++;
            uint32_t count = c.count[len];
            if (code - first < count) {
                unsigned sym = c.sorted[index + (code - first)];
                if (sym == HUFF_EOS)
                    return -1; /* §5.2: EOS in the string is a decoding error */
                if (out == cap)
                    return -1;
                dst[out++] = (uint8_t)sym;
                code = first = index = 0;
                len = 0;
                all_ones = 1;
                continue;
            }
            if (len == HUFF_MAX_BITS)
                return -1; /* unreachable for a complete code, kept as a guard */
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
    }
    /* What is left must be padding: fewer than 8 bits, all ones (§5.2). */
    if (len > 7 || !all_ones)
        return -1;
    return (ptrdiff_t)out;
}

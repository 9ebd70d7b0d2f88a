/* HPACK Huffman coding (RFC 7541 §5.2, Appendix B): both directions, because grpcio servers
 * Huffman-code their response headers and we Huffman-code ours whenever that is shorter. */
#ifndef VGPU_HUFFMAN_H
#define VGPU_HUFFMAN_H

#include <stddef.h>
#include <stdint.h>

#define HUFF_SYMBOLS 257 /* 256 octets + EOS */
#define HUFF_EOS 256
#define HUFF_MAX_BITS 30

struct huff_sym {
    uint32_t code; /* right-aligned */
    uint8_t bits;
};

extern const struct huff_sym vgpu_huff_table[HUFF_SYMBOLS];

/* Octets that encoding n source octets produces (padding included). */
size_t huff_encoded_len(const uint8_t *src, size_t n);

/* Encode into dst; returns the length, or -1 if cap is too small. */
ptrdiff_t huff_encode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap);

/* Upper bound of the decoded length of n coded octets: the shortest code is 5 bits. */
static inline size_t huff_decoded_max(size_t n) { return n * 8 / 5 + 1; }

/* Decode into dst; returns the length, or -1 for a coding error (EOS inside the string, padding
 * longer than 7 bits or not all ones, RFC 7541 §5.2) or a dst too small. */
ptrdiff_t huff_decode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap);

#endif

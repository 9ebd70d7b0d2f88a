/* HPACK (RFC 7541): the header compression of HTTP/2.
 *
 * Decoding is complete (static and dynamic table, size updates, Huffman) because the server
 * chooses the representation: grpcio indexes and Huffman-codes, grpclib (via python hpack)
 * does too. Encoding only emits literals without indexing, so our encoder never needs a dynamic
 * table and the server's SETTINGS_HEADER_TABLE_SIZE cannot desynchronise us. */
#ifndef VGPU_HPACK_H
#define VGPU_HPACK_H

#include <stddef.h>
#include <stdint.h>

#define HPACK_STATIC_COUNT 61
#define HPACK_ENTRY_OVERHEAD 32    /* §4.1 */
#define HPACK_DEFAULT_TABLE 4096   /* SETTINGS_HEADER_TABLE_SIZE default */
#define HPACK_INT_MAX 0x7fffffffu  /* larger integers are refused, not wrapped */

enum hpack_err {
    HPACK_OK = 0,
    HPACK_ERR_TRUNCATED = -1,     /* block ends inside a representation */
    HPACK_ERR_INT_OVERFLOW = -2,  /* integer above HPACK_INT_MAX or overlong */
    HPACK_ERR_INDEX = -3,         /* index 0 or beyond both tables */
    HPACK_ERR_HUFFMAN = -4,       /* invalid Huffman string */
    HPACK_ERR_SIZE_UPDATE = -5,   /* size update after a field, or above the limit */
    HPACK_ERR_NOMEM = -6,
    HPACK_ERR_CALLBACK = -7,      /* the callback refused a field */
};

const char *hpack_strerror(int err);

struct hpack_static {
    const char *name;
    const char *value;
};
extern const struct hpack_static hpack_static_table[HPACK_STATIC_COUNT + 1]; /* 1-based */

struct hpack_entry {
    char *name; /* name and value share one allocation */
    size_t name_len;
    char *value;
    size_t value_len;
};

/* The decoder's dynamic table: a ring, newest at `head`, oldest evicted first (§4.4). */
struct hpack_dtable {
    struct hpack_entry *ring;
    size_t slots; /* ring capacity: limit / 32, the most entries the limit admits */
    size_t head;  /* slot of the newest entry */
    size_t count;
    size_t size;     /* §4.1 size of the current entries */
    size_t max_size; /* current maximum, lowered/raised by size updates */
    size_t limit;    /* the SETTINGS_HEADER_TABLE_SIZE we advertised: ceiling for updates */
};

int hpack_dtable_init(struct hpack_dtable *t, size_t limit);
void hpack_dtable_free(struct hpack_dtable *t);
/* Entry by dynamic index (1 = newest), or NULL. */
const struct hpack_entry *hpack_dtable_get(const struct hpack_dtable *t, size_t index);
/* §6.3 size update: evicts down to the new maximum; above `limit` is an error. */
int hpack_dtable_set_max(struct hpack_dtable *t, size_t max_size);
/* §4.4 insertion with eviction; an entry larger than the maximum empties the table. */
int hpack_dtable_add(struct hpack_dtable *t, const char *name, size_t name_len, const char *value,
                     size_t value_len);

/* Field flags reported to the callback. */
#define HPACK_F_NAME_HUFFMAN 0x1
#define HPACK_F_VALUE_HUFFMAN 0x2
#define HPACK_F_NEVER_INDEXED 0x4
#define HPACK_F_INDEXED 0x8 /* fully indexed representation */
#define HPACK_F_ADDED 0x10  /* literal with incremental indexing: now in the dynamic table */

struct hpack_field {
    const char *name; /* NUL-terminated copies, lengths authoritative */
    size_t name_len;
    const char *value;
    size_t value_len;
    unsigned flags;
};

/* Returns 0 to continue, non-zero to stop decoding with HPACK_ERR_CALLBACK. */
typedef int (*hpack_field_cb)(void *ctx, const struct hpack_field *f);

/* Decode one complete header block (HEADERS + CONTINUATION fragments joined). */
int hpack_decode_block(struct hpack_dtable *t, const uint8_t *p, size_t n, hpack_field_cb cb, void *ctx);

/* Integer with an N-bit prefix (§5.1). Decode returns the octets consumed or an hpack_err. */
int hpack_int_decode(const uint8_t *p, size_t n, unsigned prefix_bits, uint32_t *value);
/* Encode; `first` carries the representation bits above the prefix. Returns length or 0 if cap. */
size_t hpack_int_encode(uint8_t *dst, size_t cap, unsigned prefix_bits, uint8_t first, uint32_t value);

#define HPACK_ENC_NEVER_INDEXED 0x1 /* §6.2.3, for values an intermediary must not index */
#define HPACK_ENC_RAW 0x2           /* never Huffman-code (tests pin exact RFC bytes) */

/* Encode one field: fully indexed on an exact static match, else a literal without indexing with
 * an indexed static name when there is one; values Huffman-coded when that is shorter.
 * Returns the length, or -1 if cap is too small. */
ptrdiff_t hpack_encode_field(uint8_t *dst, size_t cap, const char *name, const char *value, unsigned flags);

#endif

/* HPACK tables: the static table (RFC 7541 Appendix A) and the decoder's dynamic table (§2.3.2,
 * §4). The dynamic table is a ring sized from the advertised limit: every entry costs at least 32
 * octets (§4.1), so limit/32 slots can never overflow and no resizing is ever needed. */
#include "hpack.h"

#include <stdlib.h>
#include <string.h>

const struct hpack_static hpack_static_table[HPACK_STATIC_COUNT + 1] = {
    {NULL, NULL},
    {":authority", ""},
    {":method", "GET"},
    {":method", "POST"},
    {":path", "/"},
    {":path", "/index.html"},
    {":scheme", "http"},
    {":scheme", "https"},
    {":status", "200"},
    {":status", "204"},
    {":status", "206"},
    {":status", "304"},
    {":status", "400"},
    {":status", "404"},
    {":status", "500"},
    {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"},
    {"accept-language", ""},
    {"accept-ranges", ""},
    {"accept", ""},
    {"access-control-allow-origin", ""},
    {"age", ""},
    {"allow", ""},
    {"authorization", ""},
    {"cache-control", ""},
    {"content-disposition", ""},
    {"content-encoding", ""},
    {"content-language", ""},
    {"content-length", ""},
    {"content-location", ""},
    {"content-range", ""},
    {"content-type", ""},
    {"cookie", ""},
    {"date", ""},
    {"etag", ""},
    {"expect", ""},
    {"expires", ""},
    {"from", ""},
    {"host", ""},
    {"if-match", ""},
    {"if-modified-since", ""},
    {"if-none-match", ""},
    {"if-range", ""},
    {"if-unmodified-since", ""},
    {"last-modified", ""},
    {"link", ""},
    {"location", ""},
    {"max-forwards", ""},
    {"proxy-authenticate", ""},
    {"proxy-authorization", ""},
    {"range", ""},
    {"referer", ""},
    {"refresh", ""},
    {"retry-after", ""},
    {"server", ""},
    {"set-cookie", ""},
    {"strict-transport-security", ""},
    {"transfer-encoding", ""},
    {"user-agent", ""},
    {"vary", ""},
    {"via", ""},
    {"www-authenticate", ""},
};

const char *hpack_strerror(int err)
{
    switch (err) {
    case HPACK_OK: return "ok";
    case HPACK_ERR_TRUNCATED: return "header block truncated";
    case HPACK_ERR_INT_OVERFLOW: return "integer overflow";
    case HPACK_ERR_INDEX: return "invalid table index";
    case HPACK_ERR_HUFFMAN: return "invalid Huffman string";
    case HPACK_ERR_SIZE_UPDATE: return "invalid dynamic table size update";
    case HPACK_ERR_NOMEM: return "out of memory";
    case HPACK_ERR_CALLBACK: return "header field refused";
    default: return "unknown HPACK error";
    }
}

int hpack_dtable_init(struct hpack_dtable *t, size_t limit)
{
    memset(t, 0, sizeof(*t));
    t->slots = limit / HPACK_ENTRY_OVERHEAD;
    t->ring = calloc(t->slots ? t->slots : 1, sizeof(*t->ring));
    if (t->ring == NULL)
        return HPACK_ERR_NOMEM;
    t->max_size = limit;
    t->limit = limit;
    return HPACK_OK;
}

static size_t slot_of(const struct hpack_dtable *t, size_t index)
{
    return (t->head + t->slots - (index - 1)) % t->slots;
}

const struct hpack_entry *hpack_dtable_get(const struct hpack_dtable *t, size_t index)
{
    if (index == 0 || index > t->count)
        return NULL;
    return &t->ring[slot_of(t, index)];
}

static void evict_oldest(struct hpack_dtable *t)
{
    struct hpack_entry *e = &t->ring[slot_of(t, t->count)];
    t->size -= e->name_len + e->value_len + HPACK_ENTRY_OVERHEAD;
    free(e->name);
    memset(e, 0, sizeof(*e));
    t->count--;
}

void hpack_dtable_free(struct hpack_dtable *t)
{
    while (t->count > 0)
        evict_oldest(t);
    free(t->ring);
    t->ring = NULL;
}

int hpack_dtable_set_max(struct hpack_dtable *t, size_t max_size)
{
    if (max_size > t->limit)
        return HPACK_ERR_SIZE_UPDATE; /* §6.3: above the SETTINGS value is a decoding error */
    t->max_size = max_size;
    while (t->size > t->max_size)
        evict_oldest(t);
    return HPACK_OK;
}

int hpack_dtable_add(struct hpack_dtable *t, const char *name, size_t name_len, const char *value,
                     size_t value_len)
{
    size_t esize = name_len + value_len + HPACK_ENTRY_OVERHEAD;
    if (esize > t->max_size) {
        /* §4.4: an entry larger than the table empties it and is not added. */
        while (t->count > 0)
            evict_oldest(t);
        return HPACK_OK;
    }
    /* Copy before evicting: `name` may point into the entry about to be evicted (§4.4). */
    char *copy = malloc(name_len + value_len + 2);
    if (copy == NULL)
        return HPACK_ERR_NOMEM;
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    memcpy(copy + name_len + 1, value, value_len);
    copy[name_len + 1 + value_len] = '\0';

    while (t->size + esize > t->max_size)
        evict_oldest(t);
    t->head = (t->head + 1) % t->slots;
    t->ring[t->head] = (struct hpack_entry){copy, name_len, copy + name_len + 1, value_len};
    t->count++;
    t->size += esize;
    return HPACK_OK;
}

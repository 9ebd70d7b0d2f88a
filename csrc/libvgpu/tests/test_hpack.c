/* HPACK against RFC 7541 Appendix C (C.1 integers, C.2 single fields, C.3/C.4 requests without
 * and with Huffman, C.5/C.6 responses with a 256-octet table and eviction), plus integer edge
 * cases, size updates, malformed blocks and the encoder. */
#include <stdlib.h>

#include "check.h"
#include "hpack.h"

struct collect {
    char text[2048];
    unsigned flags_or;
    int refuse_after; /* refuse the n-th field (1-based); 0 never */
    int seen;
};

static int collect_cb(void *ctx, const struct hpack_field *f)
{
    struct collect *c = ctx;
    size_t len = strlen(c->text);
    snprintf(c->text + len, sizeof(c->text) - len, "%s: %s\n", f->name, f->value);
    c->flags_or |= f->flags;
    c->seen++;
    return c->refuse_after && c->seen >= c->refuse_after;
}

static void dump_table(const struct hpack_dtable *t, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 1; i <= t->count; i++) {
        const struct hpack_entry *e = hpack_dtable_get(t, i);
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "[%zu] %s: %s\n", i, e->name, e->value);
    }
}

/* Decode `hex` into t; check the fields, the table and its size. */
static void step(struct hpack_dtable *t, const char *hex, const char *fields, const char *table, size_t size,
                 unsigned want_flags)
{
    uint8_t block[512];
    size_t n = unhex(hex, block, sizeof(block));
    struct collect c = {0};
    CHECK_INT(hpack_decode_block(t, block, n, collect_cb, &c), HPACK_OK);
    CHECK_STR(c.text, fields);
    char dumped[1024];
    dump_table(t, dumped, sizeof(dumped));
    CHECK_STR(dumped, table);
    CHECK_INT(t->size, size);
    if (want_flags)
        CHECK((c.flags_or & want_flags) == want_flags);
}

static void c1_integers(void)
{
    uint8_t buf[8];
    uint32_t v;
    /* C.1.1: 10 with a 5-bit prefix. */
    CHECK_INT(hpack_int_encode(buf, sizeof(buf), 5, 0, 10), 1);
    CHECK_INT(buf[0], 0x0a);
    /* C.1.2: 1337 with a 5-bit prefix = 1f 9a 0a. */
    CHECK_INT(hpack_int_encode(buf, sizeof(buf), 5, 0, 1337), 3);
    CHECK_MEM(buf, 3, "\x1f\x9a\x0a", 3);
    CHECK_INT(hpack_int_decode(buf, 3, 5, &v), 3);
    CHECK_INT(v, 1337);
    /* C.1.3: 42 at an octet boundary (8-bit prefix). */
    CHECK_INT(hpack_int_encode(buf, sizeof(buf), 8, 0, 42), 1);
    CHECK_INT(buf[0], 42);
    CHECK_INT(hpack_int_decode(buf, 1, 8, &v), 1);
    CHECK_INT(v, 42);
}

static void integer_edges(void)
{
    uint8_t buf[8];
    uint32_t v;
    /* Exactly 2^N-1 needs a zero continuation octet. */
    CHECK_INT(hpack_int_encode(buf, sizeof(buf), 5, 0, 31), 2);
    CHECK_MEM(buf, 2, "\x1f\x00", 2);
    CHECK_INT(hpack_int_decode(buf, 2, 5, &v), 2);
    CHECK_INT(v, 31);
    /* 30 fits the prefix. */
    CHECK_INT(hpack_int_encode(buf, sizeof(buf), 5, 0xe0, 30), 1);
    CHECK_INT(buf[0], 0xfe);
    CHECK_INT(hpack_int_decode(buf, 1, 5, &v), 1);
    CHECK_INT(v, 30); /* bits above the prefix are ignored */
    /* Round trips across prefixes and magnitudes, up to the maximum. */
    const uint32_t values[] = {0, 1, 126, 127, 128, 254, 255, 256, 16383, 16384, 2097151, 0x7fffffff};
    for (unsigned prefix = 1; prefix <= 8; prefix++)
        for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
            size_t k = hpack_int_encode(buf, sizeof(buf), prefix, 0, values[i]);
            CHECK(k > 0);
            CHECK_INT(hpack_int_decode(buf, k, prefix, &v), k);
            CHECK_INT(v, values[i]);
            CHECK_INT(hpack_int_decode(buf, k - 1, prefix, &v), HPACK_ERR_TRUNCATED);
        }
    /* The largest accepted: 31 + 0x7fffffe0 = 0x7fffffff. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\xe0\xff\xff\xff\x07", 6, 5, &v), 6);
    CHECK_INT(v, 0x7fffffff);
    /* One more overflows. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\xe1\xff\xff\xff\x07", 6, 5, &v), HPACK_ERR_INT_OVERFLOW);
    /* 2^32 territory: must not wrap to a small number. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\xff\xff\xff\xff\x0f", 6, 5, &v), HPACK_ERR_INT_OVERFLOW);
    /* Overlong: zero continuation octets beyond five are refused, not looped on. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\x80\x80\x80\x80\x80\x00", 7, 5, &v), HPACK_ERR_INT_OVERFLOW);
    /* Five zero-ish continuation octets are still a valid (if wasteful) encoding. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\x80\x80\x80\x80\x00", 6, 5, &v), 6);
    CHECK_INT(v, 31);
    /* Truncated: continuation bit set on the last octet, or nothing at all. */
    CHECK_INT(hpack_int_decode((const uint8_t *)"\x1f\x9a", 2, 5, &v), HPACK_ERR_TRUNCATED);
    CHECK_INT(hpack_int_decode(buf, 0, 5, &v), HPACK_ERR_TRUNCATED);
    /* Encoder capacity. */
    CHECK_INT(hpack_int_encode(buf, 2, 5, 0, 1337), 0);
    CHECK_INT(hpack_int_encode(buf, 0, 5, 0, 1), 0);
}

static void c2_single_fields(void)
{
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    /* C.2.1 literal with indexing. */
    step(&t, "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572", "custom-key: custom-header\n",
         "[1] custom-key: custom-header\n", 55, 0);
    hpack_dtable_free(&t);
    hpack_dtable_init(&t, 4096);
    /* C.2.2 literal without indexing: the table stays empty. */
    step(&t, "040c 2f73 616d 706c 652f 7061 7468", ":path: /sample/path\n", "", 0, 0);
    /* C.2.3 never indexed. */
    step(&t, "1008 7061 7373 776f 7264 0673 6563 7265 74", "password: secret\n", "", 0, HPACK_F_NEVER_INDEXED);
    /* C.2.4 indexed. */
    step(&t, "82", ":method: GET\n", "", 0, HPACK_F_INDEXED);
    hpack_dtable_free(&t);
}

static const char *const C3_FIELDS[] = {
    ":method: GET\n:scheme: http\n:path: /\n:authority: www.example.com\n",
    ":method: GET\n:scheme: http\n:path: /\n:authority: www.example.com\ncache-control: no-cache\n",
    ":method: GET\n:scheme: https\n:path: /index.html\n:authority: www.example.com\ncustom-key: custom-value\n",
};
static const char *const C3_TABLES[] = {
    "[1] :authority: www.example.com\n",
    "[1] cache-control: no-cache\n[2] :authority: www.example.com\n",
    "[1] custom-key: custom-value\n[2] cache-control: no-cache\n[3] :authority: www.example.com\n",
};
static const size_t C3_SIZES[] = {57, 110, 164};

static void c3_requests(void)
{
    static const char *const hex[] = {
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    };
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    for (int i = 0; i < 3; i++)
        step(&t, hex[i], C3_FIELDS[i], C3_TABLES[i], C3_SIZES[i], 0);
    hpack_dtable_free(&t);
}

static void c4_requests_huffman(void)
{
    static const char *const hex[] = {
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    };
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    for (int i = 0; i < 3; i++)
        step(&t, hex[i], C3_FIELDS[i], C3_TABLES[i], C3_SIZES[i], HPACK_F_VALUE_HUFFMAN);
    hpack_dtable_free(&t);
}

#define DATE1 "Mon, 21 Oct 2013 20:13:21 GMT"
#define DATE2 "Mon, 21 Oct 2013 20:13:22 GMT"
#define COOKIE "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
static const char *const C5_FIELDS[] = {
    ":status: 302\ncache-control: private\ndate: " DATE1 "\nlocation: https://www.example.com\n",
    ":status: 307\ncache-control: private\ndate: " DATE1 "\nlocation: https://www.example.com\n",
    ":status: 200\ncache-control: private\ndate: " DATE2 "\nlocation: https://www.example.com\n"
    "content-encoding: gzip\nset-cookie: " COOKIE "\n",
};
/* The 256-octet table evicts: ":status: 302" goes in C.5.2, three entries in C.5.3. */
static const char *const C5_TABLES[] = {
    "[1] location: https://www.example.com\n[2] date: " DATE1 "\n[3] cache-control: private\n[4] :status: 302\n",
    "[1] :status: 307\n[2] location: https://www.example.com\n[3] date: " DATE1 "\n[4] cache-control: private\n",
    "[1] set-cookie: " COOKIE "\n[2] content-encoding: gzip\n[3] date: " DATE2 "\n",
};
static const size_t C5_SIZES[] = {222, 222, 215};

static void c5_responses(void)
{
    static const char *const hex[] = {
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 "
        "474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 "
        "666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 "
        "3630 303b 2076 6572 7369 6f6e 3d31",
    };
    struct hpack_dtable t;
    hpack_dtable_init(&t, 256);
    for (int i = 0; i < 3; i++)
        step(&t, hex[i], C5_FIELDS[i], C5_TABLES[i], C5_SIZES[i], 0);
    hpack_dtable_free(&t);
}

static void c6_responses_huffman(void)
{
    static const char *const hex[] = {
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 "
        "63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 "
        "b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    };
    struct hpack_dtable t;
    hpack_dtable_init(&t, 256);
    for (int i = 0; i < 3; i++)
        step(&t, hex[i], C5_FIELDS[i], C5_TABLES[i], C5_SIZES[i], HPACK_F_VALUE_HUFFMAN);
    hpack_dtable_free(&t);
}

static void dynamic_table_rules(void)
{
    struct hpack_dtable t;
    hpack_dtable_init(&t, 100);
    CHECK_INT(hpack_dtable_add(&t, "a", 1, "1", 1), HPACK_OK); /* 34 */
    CHECK_INT(hpack_dtable_add(&t, "b", 1, "2", 1), HPACK_OK); /* 68 */
    CHECK_INT(t.count, 2);
    /* A third entry evicts the oldest ("a"). */
    CHECK_INT(hpack_dtable_add(&t, "c", 1, "3", 1), HPACK_OK);
    CHECK_INT(t.count, 2);
    CHECK_STR(hpack_dtable_get(&t, 1)->name, "c");
    CHECK_STR(hpack_dtable_get(&t, 2)->name, "b");
    CHECK(hpack_dtable_get(&t, 3) == NULL);
    CHECK(hpack_dtable_get(&t, 0) == NULL);
    /* An entry whose name refers to the entry it evicts: copied first (§4.4). */
    const struct hpack_entry *oldest = hpack_dtable_get(&t, 2);
    CHECK_INT(hpack_dtable_add(&t, oldest->name, oldest->name_len, "0123456789012345678901234567", 28), HPACK_OK);
    CHECK_INT(t.count, 2);
    CHECK_STR(hpack_dtable_get(&t, 1)->name, "b");
    CHECK_STR(hpack_dtable_get(&t, 1)->value, "0123456789012345678901234567");
    CHECK_STR(hpack_dtable_get(&t, 2)->name, "c");
    CHECK_INT(t.size, 95);
    /* An entry larger than the table empties it and is not added. */
    char big[80];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK_INT(hpack_dtable_add(&t, "big", 3, big, strlen(big)), HPACK_OK);
    CHECK_INT(t.count, 0);
    CHECK_INT(t.size, 0);
    /* Size updates: lowering evicts, zero empties, above the limit is an error. */
    hpack_dtable_add(&t, "a", 1, "1", 1);
    hpack_dtable_add(&t, "b", 1, "2", 1);
    CHECK_INT(hpack_dtable_set_max(&t, 40), HPACK_OK);
    CHECK_INT(t.count, 1);
    CHECK_STR(hpack_dtable_get(&t, 1)->name, "b");
    CHECK_INT(hpack_dtable_set_max(&t, 0), HPACK_OK);
    CHECK_INT(t.count, 0);
    CHECK_INT(hpack_dtable_set_max(&t, 101), HPACK_ERR_SIZE_UPDATE);
    /* Many insertions wrap the ring without losing track. */
    CHECK_INT(hpack_dtable_set_max(&t, 100), HPACK_OK);
    for (int i = 0; i < 1000; i++) {
        char name[8];
        snprintf(name, sizeof(name), "%d", i % 10);
        hpack_dtable_add(&t, name, 1, "v", 1);
    }
    CHECK_INT(t.count, 2);
    CHECK_STR(hpack_dtable_get(&t, 1)->name, "9");
    CHECK_STR(hpack_dtable_get(&t, 2)->name, "8");
    hpack_dtable_free(&t);
}

static int decode_hex(struct hpack_dtable *t, const char *hex, struct collect *c)
{
    uint8_t block[256];
    size_t n = unhex(hex, block, sizeof(block));
    return hpack_decode_block(t, block, n, collect_cb, c);
}

static void size_updates_in_blocks(void)
{
    struct hpack_dtable t;
    struct collect c = {0};
    hpack_dtable_init(&t, 4096);
    /* Two updates at the start are fine (§4.2); the table follows the last one. */
    CHECK_INT(decode_hex(&t, "20 3f e1 1f 82", &c), HPACK_OK); /* 0, then 4096, then :method GET */
    CHECK_INT(t.max_size, 4096);
    /* After a field: error. */
    CHECK_INT(decode_hex(&t, "82 20", &c), HPACK_ERR_SIZE_UPDATE);
    /* Above the advertised limit: error. */
    CHECK_INT(decode_hex(&t, "3f e2 1f", &c), HPACK_ERR_SIZE_UPDATE); /* 4097 */
    /* An update to 0 evicts what C.3.1 inserted. */
    decode_hex(&t, "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d", &c);
    CHECK_INT(t.count, 1);
    CHECK_INT(decode_hex(&t, "20", &c), HPACK_OK);
    CHECK_INT(t.count, 0);
    hpack_dtable_free(&t);
}

static void malformed_blocks(void)
{
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    static const struct {
        const char *hex;
        int err;
    } cases[] = {
        {"80", HPACK_ERR_INDEX},                         /* index 0 */
        {"be", HPACK_ERR_INDEX},                         /* 62: empty dynamic table */
        {"ff ff ff ff ff 0f", HPACK_ERR_INT_OVERFLOW},  /* index overflow */
        {"40 05 61 62", HPACK_ERR_TRUNCATED},            /* name shorter than announced */
        {"44", HPACK_ERR_TRUNCATED},                     /* literal without a value */
        {"04 85 f1 e3", HPACK_ERR_TRUNCATED},            /* Huffman value cut short */
        {"04 81 00", HPACK_ERR_HUFFMAN},                 /* Huffman padding not ones */
        {"04 84 ff ff ff fc", HPACK_ERR_HUFFMAN},        /* EOS inside the string */
        {"00 7f", HPACK_ERR_TRUNCATED},                  /* new-name literal, name length runs off */
        {"4f ff", HPACK_ERR_TRUNCATED},                  /* index 15, value length runs off */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct collect c = {0};
        int rc = decode_hex(&t, cases[i].hex, &c);
        if (rc != cases[i].err)
            fprintf(stderr, "  case %zu: %s\n", i, cases[i].hex);
        CHECK_INT(rc, cases[i].err);
    }
    /* The callback can stop decoding. */
    struct collect c = {.refuse_after = 2};
    CHECK_INT(decode_hex(&t, "8286 84", &c), HPACK_ERR_CALLBACK);
    CHECK_INT(c.seen, 2);
    CHECK(strcmp(hpack_strerror(HPACK_ERR_HUFFMAN), "invalid Huffman string") == 0);
    hpack_dtable_free(&t);
}

static void encoder(void)
{
    uint8_t buf[256];
    uint8_t want[64];
    size_t wl;
    /* Exact static match -> indexed (C.2.4). */
    CHECK_INT(hpack_encode_field(buf, sizeof(buf), ":method", "GET", 0), 1);
    CHECK_INT(buf[0], 0x82);
    /* Raw literal without indexing with an indexed name: exactly C.2.2. */
    wl = unhex("040c 2f73 616d 706c 652f 7061 7468", want, sizeof(want));
    ptrdiff_t n = hpack_encode_field(buf, sizeof(buf), ":path", "/sample/path", HPACK_ENC_RAW);
    CHECK_MEM(buf, n, want, wl);
    /* New-name never-indexed literal: exactly C.2.3. */
    wl = unhex("1008 7061 7373 776f 7264 0673 6563 7265 74", want, sizeof(want));
    n = hpack_encode_field(buf, sizeof(buf), "password", "secret", HPACK_ENC_NEVER_INDEXED | HPACK_ENC_RAW);
    CHECK_MEM(buf, n, want, wl);
    /* Huffman when shorter: ":authority www.example.com" -> 01 8c f1e3... (C.4.1's string). */
    wl = unhex("018c f1e3 c2e5 f23a 6ba0 ab90 f4ff", want, sizeof(want));
    n = hpack_encode_field(buf, sizeof(buf), ":authority", "www.example.com", 0);
    CHECK_MEM(buf, n, want, wl);
    /* Round trip of the gRPC request headers through our decoder. */
    const char *fields[][2] = {{":method", "POST"}, {":scheme", "http"},
                               {":path", "/registry.VDeviceRegistry/RegisterContainerDevice"},
                               {":authority", "localhost"}, {"content-type", "application/grpc"},
                               {"te", "trailers"}, {"grpc-timeout", "12000m"}, {"x-empty", ""}};
    size_t pos = 0;
    char expect[512] = "";
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        n = hpack_encode_field(buf + pos, sizeof(buf) - pos, fields[i][0], fields[i][1], 0);
        CHECK(n > 0);
        pos += (size_t)n;
        size_t el = strlen(expect);
        snprintf(expect + el, sizeof(expect) - el, "%s: %s\n", fields[i][0], fields[i][1]);
    }
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    struct collect c = {0};
    CHECK_INT(hpack_decode_block(&t, buf, pos, collect_cb, &c), HPACK_OK);
    CHECK_STR(c.text, expect);
    CHECK_INT(t.count, 0); /* literals without indexing leave no state */
    hpack_dtable_free(&t);
    /* Capacity is respected. */
    CHECK_INT(hpack_encode_field(buf, 5, ":authority", "www.example.com", 0), -1);
    CHECK_INT(hpack_encode_field(buf, 0, ":method", "GET", 0), -1);
}

/* Decoding arbitrary octets must never crash or leak state inconsistently (run under -fsanitize
 * when debugging; here it checks the table invariants after each block). */
static void garbage_blocks(void)
{
    struct hpack_dtable t;
    hpack_dtable_init(&t, 4096);
    uint32_t x = 12345;
    int broken = 0;
    for (int round = 0; round < 20000; round++) {
        uint8_t block[64];
        size_t n = (size_t)(round % 64);
        for (size_t i = 0; i < n; i++) {
            x = x * 1103515245u + 12345u;
            block[i] = (uint8_t)(x >> 16);
        }
        struct collect c = {0};
        (void)hpack_decode_block(&t, block, n, collect_cb, &c);
        size_t sum = 0;
        for (size_t i = 1; i <= t.count; i++) {
            const struct hpack_entry *e = hpack_dtable_get(&t, i);
            sum += e->name_len + e->value_len + HPACK_ENTRY_OVERHEAD;
        }
        if (sum != t.size || t.size > t.max_size)
            broken++;
    }
    hpack_dtable_free(&t);
    CHECK_INT(broken, 0);
}

int main(void)
{
    RUN(c1_integers);
    RUN(integer_edges);
    RUN(c2_single_fields);
    RUN(c3_requests);
    RUN(c4_requests_huffman);
    RUN(c5_responses);
    RUN(c6_responses_huffman);
    RUN(dynamic_table_rules);
    RUN(size_updates_in_blocks);
    RUN(malformed_blocks);
    RUN(encoder);
    RUN(garbage_blocks);
    return check_summary("test_hpack");
}

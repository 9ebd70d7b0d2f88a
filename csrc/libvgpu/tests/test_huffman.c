/* Huffman coding: RFC 7541 C.4/C.6 strings both ways, every symbol round-trips, and the §5.2
 * error cases (EOS in the string, padding too long or not all ones). */
#include "check.h"
#include "huffman.h"

static void rfc_strings(void)
{
    static const struct {
        const char *text, *hex;
    } cases[] = {
        {"www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"},       /* C.4.1 */
        {"no-cache", "a8eb 1064 9cbf"},                             /* C.4.2 */
        {"custom-key", "25a8 49e9 5ba9 7d7f"},                      /* C.4.3 */
        {"custom-value", "25a8 49e9 5bb8 e8b4 bf"},                 /* C.4.3 */
        {"302", "6402"},                                            /* C.6.1 */
        {"private", "aec3 771a 4b"},                                /* C.6.1 */
        {"Mon, 21 Oct 2013 20:13:21 GMT", "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff"},
        {"https://www.example.com", "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3"},
        {"307", "640e ff"},                                         /* C.6.2 */
        {"gzip", "9bd9 ab"},                                        /* C.6.3 */
        {"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
         "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t want[128], got[128];
        size_t wl = unhex(cases[i].hex, want, sizeof(want));
        size_t tl = strlen(cases[i].text);
        CHECK_INT(huff_encoded_len((const uint8_t *)cases[i].text, tl), wl);
        ptrdiff_t el = huff_encode((const uint8_t *)cases[i].text, tl, got, sizeof(got));
        CHECK_MEM(got, el, want, wl);
        ptrdiff_t dl = huff_decode(want, wl, got, sizeof(got));
        CHECK_MEM(got, dl, cases[i].text, tl);
    }
}

static void every_symbol_round_trips(void)
{
    uint8_t all[256 * 3], coded[256 * 3 * 4], back[256 * 3];
    for (size_t i = 0; i < sizeof(all); i++)
        all[i] = (uint8_t)((i * 7 + i / 256) & 0xff); /* every octet value, in varied neighbours */
    ptrdiff_t el = huff_encode(all, sizeof(all), coded, sizeof(coded));
    CHECK(el > 0);
    ptrdiff_t dl = huff_decode(coded, (size_t)el, back, sizeof(back));
    CHECK_MEM(back, dl, all, sizeof(all));
    /* Each single symbol alone too: exercises every padding length 0..7. */
    for (int s = 0; s < 256; s++) {
        uint8_t in = (uint8_t)s, enc[8], dec[2];
        ptrdiff_t e = huff_encode(&in, 1, enc, sizeof(enc));
        CHECK_INT(e, (vgpu_huff_table[s].bits + 7) / 8);
        ptrdiff_t d = huff_decode(enc, (size_t)e, dec, sizeof(dec));
        CHECK_MEM(dec, d, &in, 1);
    }
}

static void code_is_prefix_free_and_complete(void)
{
    /* Kraft sum of a complete prefix code is exactly 1: sum 2^(30-len) == 2^30. */
    uint64_t kraft = 0;
    for (int s = 0; s < HUFF_SYMBOLS; s++) {
        CHECK(vgpu_huff_table[s].bits >= 5 && vgpu_huff_table[s].bits <= HUFF_MAX_BITS);
        kraft += 1ull << (HUFF_MAX_BITS - vgpu_huff_table[s].bits);
    }
    CHECK(kraft == 1ull << HUFF_MAX_BITS);
}

static void decode_errors(void)
{
    uint8_t out[64], in[8];
    /* EOS (30 ones) spelled out inside the string: §5.2 decoding error. */
    size_t n = unhex("ff ff ff fc", in, sizeof(in));
    CHECK_INT(huff_decode(in, n, out, sizeof(out)), -1);
    /* Padding of 8+ ones: "www" would end inside a byte, add a whole 0xff byte of padding. */
    uint8_t www[8];
    ptrdiff_t wl = huff_encode((const uint8_t *)"a", 1, www, sizeof(www)); /* 'a' = 00011, 3 pad bits */
    CHECK_INT(wl, 1);
    www[1] = 0xff;
    CHECK_INT(huff_decode(www, 2, out, sizeof(out)), -1);
    /* Padding that is not all ones: 'a' then 000 instead of 111. */
    uint8_t zero_pad = 0x18; /* 00011 000 */
    CHECK_INT(huff_decode(&zero_pad, 1, out, sizeof(out)), -1);
    /* Correct padding decodes. */
    uint8_t one_pad = 0x1f; /* 00011 111 */
    CHECK_INT(huff_decode(&one_pad, 1, out, sizeof(out)), 1);
    CHECK(out[0] == 'a');
    /* Output buffer too small. */
    n = unhex("f1e3 c2e5 f23a 6ba0 ab90 f4ff", in, sizeof(in));
    CHECK_INT(huff_decode(in, n, out, 3), -1);
    /* Empty input decodes to the empty string. */
    CHECK_INT(huff_decode(in, 0, out, sizeof(out)), 0);
    /* Encoder capacity. */
    CHECK_INT(huff_encode((const uint8_t *)"www.example.com", 15, out, 5), -1);
}

int main(void)
{
    RUN(rfc_strings);
    RUN(every_symbol_round_trips);
    RUN(code_is_prefix_free_and_complete);
    RUN(decode_errors);
    return check_summary("test_huffman");
}

/* A minimal assertion harness: a failed CHECK reports and the test binary goes on, so one run
 * shows every failure; main() returns non-zero if any check failed. */
#ifndef VGPU_CHECK_H
#define VGPU_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check_total, check_failed;

#define CHECK(cond)                                                                                             \
    do {                                                                                                        \
        check_total++;                                                                                          \
        if (!(cond)) {                                                                                          \
            check_failed++;                                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                          \
        }                                                                                                       \
    } while (0)

#define CHECK_INT(a, b)                                                                                         \
    do {                                                                                                        \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                                   \
        check_total++;                                                                                          \
        if (va_ != vb_) {                                                                                       \
            check_failed++;                                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, va_, \
                    vb_);                                                                                       \
        }                                                                                                       \
    } while (0)

#define CHECK_STR(a, b)                                                                                         \
    do {                                                                                                        \
        const char *sa_ = (a), *sb_ = (b);                                                                      \
        check_total++;                                                                                          \
        if (strcmp(sa_, sb_) != 0) {                                                                            \
            check_failed++;                                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (\"%s\" != \"%s\")\n", __FILE__, __LINE__, #a, #b,  \
                    sa_, sb_);                                                                                  \
        }                                                                                                       \
    } while (0)

#define CHECK_MEM(a, alen, b, blen)                                                                             \
    do {                                                                                                        \
        size_t la_ = (size_t)(alen), lb_ = (size_t)(blen);                                                      \
        check_total++;                                                                                          \
        if (la_ != lb_ || memcmp((a), (b), la_) != 0) {                                                         \
            check_failed++;                                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s[%zu] == %s[%zu]\n", __FILE__, __LINE__, #a, la_, #b, lb_); \
        }                                                                                                       \
    } while (0)

#define RUN(test)                                                                                               \
    do {                                                                                                        \
        int before_ = check_failed;                                                                             \
        test();                                                                                                 \
        printf("%s %s\n", check_failed == before_ ? "ok  " : "FAIL", #test);                                    \
    } while (0)

static inline int check_summary(const char *suite)
{
    printf("%s: %d checks, %d failed\n", suite, check_total, check_failed);
    return check_failed ? 1 : 0;
}

/* "82 86 84" or "828684" -> octets; returns the length. */
static inline size_t unhex(const char *hex, uint8_t *out, size_t cap)
{
    size_t n = 0;
    int hi = -1;
    for (; *hex; hex++) {
        int v;
        if (*hex >= '0' && *hex <= '9')
            v = *hex - '0';
        else if (*hex >= 'a' && *hex <= 'f')
            v = *hex - 'a' + 10;
        else if (*hex >= 'A' && *hex <= 'F')
            v = *hex - 'A' + 10;
        else
            continue;
        if (hi < 0) {
            hi = v;
        } else {
            if (n < cap)
                out[n++] = (uint8_t)(hi << 4 | v);
            hi = -1;
        }
    }
    return n;
}

#endif

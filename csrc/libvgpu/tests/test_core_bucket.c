/* The core limit's token bucket and controller as pure units: the ceiling, admission while >= 0 and
 * the charge that goes negative, the capped refill, no lost update under concurrent chargers, and the
 * controller's gain estimate, anti-windup and soft-limit debounce. */
#include <pthread.h>

#include "check.h"
#include "core_bucket.h"
#include "core_ctl.h"

static void test_ceiling(void)
{
    CHECK_INT(core_bucket_ceiling(132, 2048), 8650752);
    CHECK_INT(core_bucket_ceiling(20, 1536), 20 * 1536 * 32);
    CHECK_INT(core_bucket_ceiling(0, 2048), 0);
    CHECK_INT(core_bucket_ceiling(132, -1), 0);
}

static void test_charge_goes_negative_then_refuses(void)
{
    int64_t tokens = 100;
    CHECK(core_bucket_try_charge(&tokens, 60));
    CHECK_INT(__atomic_load_n(&tokens, __ATOMIC_SEQ_CST), 40);
    CHECK(core_bucket_try_charge(&tokens, 1000)); /* admitted at 40, goes to -960 */
    CHECK_INT(__atomic_load_n(&tokens, __ATOMIC_SEQ_CST), -960);
    CHECK(!core_bucket_try_charge(&tokens, 1));   /* refused while negative, nothing charged */
    CHECK_INT(__atomic_load_n(&tokens, __ATOMIC_SEQ_CST), -960);
    CHECK(core_bucket_try_charge(&tokens, 0) == false);
    __atomic_store_n(&tokens, 0, __ATOMIC_SEQ_CST);
    CHECK(core_bucket_try_charge(&tokens, ~0ULL)); /* a huge grid is clamped, no wrap */
    CHECK_INT(__atomic_load_n(&tokens, __ATOMIC_SEQ_CST), -CORE_BUCKET_MAX_CHARGE);
}

static void test_refill_capped(void)
{
    int64_t tokens = -500;
    CHECK_INT(core_bucket_refill(&tokens, 300, 1000), -200);
    CHECK_INT(core_bucket_refill(&tokens, 5000, 1000), 1000);
    CHECK_INT(core_bucket_refill(&tokens, -7, 1000), 1000); /* a negative add adds nothing */
    __atomic_store_n(&tokens, 1500, __ATOMIC_SEQ_CST);                            /* above a lowered cap: cut to it */
    CHECK_INT(core_bucket_refill(&tokens, 10, 1000), 1000);
    __atomic_store_n(&tokens, 0, __ATOMIC_SEQ_CST);
    CHECK_INT(core_bucket_refill(&tokens, INT64_MAX, 1000), 1000);
}

static int64_t shared_tokens;
static long admitted;

static void *charger(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000; i++)
        if (core_bucket_try_charge(&shared_tokens, 3))
            __atomic_fetch_add(&admitted, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void *refiller(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000; i++)
        core_bucket_refill(&shared_tokens, 2, INT64_C(1) << 50);
    return NULL;
}

/* Four chargers and a refiller: the final count is exactly refills - 3 x admitted. */
static void test_concurrent_no_lost_update(void)
{
    __atomic_store_n(&shared_tokens, 0, __ATOMIC_SEQ_CST);
    pthread_t t[5];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, charger, NULL);
    pthread_create(&t[4], NULL, refiller, NULL);
    for (int i = 0; i < 5; i++)
        pthread_join(t[i], NULL);
    CHECK_INT(__atomic_load_n(&shared_tokens, __ATOMIC_SEQ_CST), 200000 - 3 * __atomic_load_n(&admitted, __ATOMIC_SEQ_CST));
}

static void test_ctl_first_rate_and_gain(void)
{
    struct core_ctl c;
    core_ctl_init(&c, 30, 0, 1000000);
    CHECK_INT((long long)c.rate, 300000); /* 30 % of the ceiling per second */
    /* no sample yet: the rate holds */
    CHECK_INT(core_ctl_step(&c, -1, 0, 0, false, 0.1), 30000);
    /* 1e5 tokens in NVML's one-second window (the 0.2 s lived, zero before) gave 40 %, so 30 % needs
     * 7.5e4 tokens/s; the first estimate is taken whole, and the trim waits for a full window. */
    int64_t add = core_ctl_step(&c, 40, 0, 100000, true, 0.1);
    CHECK_INT((long long)c.rate, 75000);
    CHECK(c.trim == 1.0);
    CHECK_INT(add, 7500);
    CHECK_INT(core_ctl_cap(&c), 15000); /* two cycles of refill */
    CHECK_INT(core_ctl_step(&c, 1, 0, 0, false, 0), 0); /* no time passed: nothing */
    /* a full window over target while throttled: trimmed down */
    for (int i = 0; i < CORE_CTL_WINDOW; i++)
        core_ctl_step(&c, 40, 0, 7500, true, 0.1);
    CHECK(c.trim < 1.0);
}

static void test_ctl_trim_only_when_throttled(void)
{
    struct core_ctl c;
    core_ctl_init(&c, 60, 0, 1000000);
    for (int i = 0; i < 100; i++)
        core_ctl_step(&c, 40, 0, 1000, false, 0.1); /* demand-limited: under target, never refused */
    CHECK(c.trim == 1.0);
    for (int i = 0; i < 100; i++)
        core_ctl_step(&c, 10, 0, 1000, true, 0.1); /* far off: a transient, left to the model */
    CHECK(c.trim == 1.0);
    for (int i = 0; i < 100; i++)
        core_ctl_step(&c, 99.5, 0, 1000, true, 0.1); /* saturated: the error is unknown */
    CHECK(c.trim == 1.0);
    for (int i = 0; i < 100; i++)
        core_ctl_step(&c, 40, 0, 1000, true, 0.1); /* refused and under: trimmed up, bounded */
    CHECK(c.trim == 2.0);
}

static void test_ctl_soft_debounce(void)
{
    struct core_ctl c;
    core_ctl_init(&c, 30, 70, 1000000);
    CHECK(core_ctl_target(&c) == 30);
    for (int i = 0; i < CORE_CTL_QUIET_CYCLES - 1; i++)
        core_ctl_step(&c, 30, 0.5, 1000, true, 0.1);
    CHECK(core_ctl_target(&c) == 30); /* not yet debounced */
    core_ctl_step(&c, 30, 1.0, 1000, true, 0.1);
    CHECK(core_ctl_target(&c) == 70);
    core_ctl_step(&c, 30, 1.5, 1000, true, 0.1); /* one contended cycle: back to hard */
    CHECK(core_ctl_target(&c) == 30);
    struct core_ctl lower;
    core_ctl_init(&lower, 50, 40, 1000); /* soft <= hard: no soft limit */
    for (int i = 0; i < 20; i++)
        core_ctl_step(&lower, 10, 0, 10, false, 0.1);
    CHECK(core_ctl_target(&lower) == 50);
}

int main(void)
{
    RUN(test_ceiling);
    RUN(test_charge_goes_negative_then_refuses);
    RUN(test_refill_capped);
    RUN(test_concurrent_no_lost_update);
    RUN(test_ctl_first_rate_and_gain);
    RUN(test_ctl_trim_only_when_throttled);
    RUN(test_ctl_soft_debounce);
    return check_summary("test_core_bucket");
}

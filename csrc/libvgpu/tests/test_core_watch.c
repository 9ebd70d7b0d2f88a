/* The core limit's environment parsing, NVML sample aggregation and watcher: one cycle with an
 * injected sampler and clock (per-process and shared buckets: the sampler refills, a follower only
 * when the sampler's heartbeat is stale), and the real thread cycling until stopped. */
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core_bucket.h"
#include "core_env.h"
#include "core_util.h"
#include "core_watch.h"

struct env_kv {
    const char *kv[16];
};

static const char *lookup(void *ctx, const char *name)
{
    const struct env_kv *e = ctx;
    for (size_t i = 0; e->kv[i]; i += 2)
        if (strcmp(e->kv[i], name) == 0)
            return e->kv[i + 1];
    return NULL;
}

static void test_env(void)
{
    struct env_kv e = {{"CUDA_CORE_LIMIT", "50", "CUDA_CORE_LIMIT_1", "30", "CUDA_CORE_LIMIT_2", "",
                        "CUDA_CORE_SOFT_LIMIT_1", "70", "CUDA_CORE_SOFT_LIMIT_0", "40",
                        "CUDA_SM_SHARED_BUCKET", "true", NULL}};
    struct core_env c;
    char err[128] = "";
    CHECK_INT(core_env_parse(&c, lookup, &e, err, sizeof(err)), 0);
    CHECK_INT(c.hard[0], 50);
    CHECK_INT(c.hard[1], 30);
    CHECK_INT(c.hard[2], 0);  /* present but empty: off, no fallback */
    CHECK_INT(c.hard[15], 50);
    CHECK_INT(c.soft[1], 70);
    CHECK_INT(c.soft[0], 0);  /* not above hard */
    CHECK(c.shared_bucket);

    struct env_kv off = {{"CUDA_CORE_LIMIT_0", "100", "CUDA_CORE_LIMIT_1", "-5", "CUDA_SM_SHARED_BUCKET", "yes", NULL}};
    CHECK_INT(core_env_parse(&c, lookup, &off, err, sizeof(err)), 0);
    CHECK_INT(c.hard[0], 0);
    CHECK_INT(c.hard[1], 0);
    CHECK(!c.shared_bucket);

    struct core_env before = c;
    struct env_kv bad = {{"CUDA_CORE_LIMIT_3", "30%", NULL}};
    CHECK_INT(core_env_parse(&c, lookup, &bad, err, sizeof(err)), -1);
    CHECK_STR(err, "CUDA_CORE_LIMIT_3=30% is not a whole percent");
    CHECK(memcmp(&before, &c, sizeof(c)) == 0); /* nothing changed */
}

static int ours_if_even(void *ctx, unsigned int pid)
{
    (void)ctx;
    return pid == 99 ? -1 : pid % 2 == 0;
}

static void test_util_sum(void)
{
    struct core_proc_sample s[] = {
        {.pid = 10, .sm = 20, .enc = 10, .dec = 0}, /* ours: 20 + 8.5 */
        {.pid = 12, .sm = 30},                      /* ours, two samples: mean 20 */
        {.pid = 12, .sm = 10},
        {.pid = 7, .sm = 5},                        /* another's */
        {.pid = 99, .sm = 9},                       /* cannot tell: contention, not ours */
    };
    double ours, ext;
    core_util_sum(s, 5, ours_if_even, NULL, &ours, &ext);
    CHECK(ours > 48.49 && ours < 48.51);
    CHECK(ext == 9);
    core_util_sum(s, 0, ours_if_even, NULL, &ours, &ext);
    CHECK(ours == 0 && ext == 0);
}

struct fake {
    uint64_t now;
    double util, external;
    int rc, calls;
};

static int fake_sample(void *ctx, int host, double *util, double *external)
{
    struct fake *f = ctx;
    (void)host;
    f->calls++;
    *util = f->util;
    *external = f->external;
    return f->rc;
}

static uint64_t fake_now(void *ctx)
{
    return ((struct fake *)ctx)->now;
}

static void test_local_cycle(void)
{
    struct fake f = {.now = 1000000000ull, .util = -1, .rc = -1};
    struct core_watch_ops ops = {fake_sample, fake_now, &f, NULL};
    struct core_device d;
    core_device_init(&d, 2, 30, 0, 1000000, NULL, f.now);
    int64_t first = *d.tokens;
    CHECK_INT(first, 30000); /* one cycle of the first rate (30 % of the ceiling per second) */
    core_bucket_try_charge(d.tokens, 35000);
    f.now += 100000000ull;
    core_watch_cycle(&d, NULL, &ops); /* no sample: the first rate refills */
    CHECK_INT(f.calls, 1);
    CHECK_INT(*d.tokens, -5000 + 30000);
    /* 40 % measured after 6.5e4 tokens in NVML's second: the rate follows the gain (target 30). */
    core_bucket_try_charge(d.tokens, 30000);
    f.rc = 0;
    f.util = 40;
    f.now += 100000000ull;
    core_watch_cycle(&d, NULL, &ops);
    CHECK(d.ctl.measured);
    CHECK(d.ctl.rate > 48000 && d.ctl.rate < 49500); /* 30/40 of 6.5e4/s */
    f.now -= 1; /* the clock did not advance: nothing happens */
    int calls = f.calls;
    core_watch_cycle(&d, NULL, &ops);
    CHECK_INT(f.calls, calls);
}

static void test_shared_sampler_and_follower(void)
{
    char dir[64] = "/tmp/core_watch.XXXXXX", err[128];
    CHECK(mkdtemp(dir) != NULL);
    struct core_shared a, b; /* two open file descriptions: the OFD lock tells them apart */
    CHECK_INT(core_shared_open(&a, dir, err, sizeof(err)), 0);
    CHECK_INT(core_shared_open(&b, dir, err, sizeof(err)), 0);
    struct fake f = {.now = 5000000000ull, .util = 30, .rc = 0};
    struct core_watch_ops ops = {fake_sample, fake_now, &f, NULL};
    struct core_device da, db;
    core_device_init(&da, 0, 30, 0, 1000000, core_shared_device(&a, 0, 1000000, 30, 0, 30000), f.now);
    core_device_init(&db, 0, 30, 0, 1000000, core_shared_device(&b, 0, 1000000, 30, 0, 30000), f.now);
    CHECK(da.tokens == &a.node->devices[0].tokens);
    f.now += 100000000ull;
    core_watch_cycle(&da, &a, &ops); /* a becomes the sampler */
    CHECK(a.lock_fd >= 0);
    CHECK_INT(f.calls, 1);
    CHECK(a.node->devices[0].share > 0);
    CHECK_INT(a.node->devices[0].util, 300);
    CHECK_INT(a.node->devices[0].limit, 30);
    CHECK_INT(a.node->devices[0].last_refill_ns, f.now);
    __atomic_store_n(&a.node->devices[0].tokens, -5, __ATOMIC_RELAXED);
    f.now += 200000000ull;
    core_watch_cycle(&db, &b, &ops); /* b follows: the heartbeat is fresh, nothing to do */
    CHECK(b.lock_fd < 0);
    CHECK_INT(f.calls, 1);
    CHECK_INT(b.node->devices[0].tokens, -5);
    f.now += CORE_WATCH_STALE_NS + 1; /* the sampler went silent (stuck, still holding the lock) */
    core_watch_cycle(&db, &b, &ops);
    CHECK_INT(f.calls, 1);
    CHECK_INT(b.node->devices[0].tokens, -5 + a.node->devices[0].share);
    core_shared_close(&a); /* a lets go: b takes over at its next cycle */
    f.now += 100000000ull;
    core_watch_cycle(&db, &b, &ops);
    CHECK(b.lock_fd >= 0);
    CHECK_INT(f.calls, 2);
    CHECK_INT(b.node->sampler_pid, getpid());
    core_shared_close(&b);
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    CHECK_INT(system(cmd), 0);
}

static uint64_t real_now(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int counting_sample(void *ctx, int host, double *util, double *external)
{
    (void)host;
    __atomic_fetch_add((int *)ctx, 1, __ATOMIC_RELAXED);
    *util = 10;
    *external = 0;
    return 0;
}

static void test_thread_cycles_every_device(void)
{
    int calls = 0;
    struct core_watch_ops ops = {counting_sample, real_now, &calls, NULL};
    struct core_device d[2];
    core_device_init(&d[0], 0, 30, 0, 1000, NULL, real_now(NULL));
    core_device_init(&d[1], 1, 60, 0, 1000, NULL, real_now(NULL));
    struct core_watcher w = {.devs = {&d[0], &d[1]}, .count = 2, .ops = &ops};
    CHECK_INT(core_watcher_start(&w), 0);
    for (int i = 0; i < 500 && __atomic_load_n(&calls, __ATOMIC_RELAXED) < 4; i++)
        usleep(10000);
    core_watcher_stop(&w);
    CHECK(calls >= 4); /* two cycles of both devices */
    CHECK(d[0].last_util == 10 && d[1].last_util == 10);
}

int main(void)
{
    RUN(test_env);
    RUN(test_util_sum);
    RUN(test_local_cycle);
    RUN(test_shared_sampler_and_follower);
    RUN(test_thread_cycles_every_device);
    return check_summary("test_core_watch");
}

/* Closed-loop simulation of the core limit: the real bucket, controller and watcher cycle
 * (core_watch_cycle, every 100 ms, reading the utilisation of the last second rounded to whole
 * percent like NVML) against a simulated GPU (SM count, ns per block, a bounded launch queue) driven
 * by an application that launches as fast as the bucket lets it (sleeping 10 ms when refused, like
 * the launch hook). Checks that the achieved share over a 10 s window (after 1 s of start-up) is
 * within 3 points of the target at 30 % and 60 % on a 20-SM, a 132-SM and a 188-SM GPU, for short and
 * long kernels; prints the mean absolute error of the 1 s utilisation samples. Also: a demand-limited phase does not wind the controller up,
 * the soft limit bursts while uncontended and returns to hard on contention, and an application
 * alternating one kernel of up to 1.5 s with 250 ms of idle is held at the target. */
#include <stdbool.h>
#include <stdlib.h>

#include "check.h"
#include "core_bucket.h"
#include "core_ctl.h"
#include "core_watch.h"

#define MS_PER_CYCLE 100
#define HISTORY 1000 /* ms of busy history: NVML's one-second window */

struct gpu {
    int sms;
    double ns_per_block;
    double pending;               /* queued blocks */
    double busy[HISTORY];         /* busy fraction per ms, ring */
};

struct app {
    unsigned long long grid;      /* blocks per launch */
    int launches_per_ms;          /* CPU speed of the launch loop */
    int queue_launches;           /* driver queue depth, in launches */
    double demand;                /* fraction of launches_per_ms it wants (1 = saturating) */
    double credit;
    long sleep_until;
    long idle_ms;                 /* > 0: one launch, wait for it to finish, sleep this long, repeat */
    bool running;                 /* (idle_ms) the launch it waits for */
};

struct result {
    double share;                 /* mean busy % over the measured window */
    double mae;                   /* mean |util_1s - target| over watcher samples in the window */
};

static double last_target; /* the controller's target at the end of the last run */

static double util_1s(const struct gpu *g, long now)
{
    long n = now < HISTORY ? now : HISTORY;
    if (n <= 0)
        return 0;
    double sum = 0;
    for (long i = 1; i <= n; i++)
        sum += g->busy[(now - i) % HISTORY];
    return 100.0 * sum / (double)n;
}

/* The watcher's injected sampler and clock: the simulated GPU's last second, whole percent. */
struct sim {
    struct gpu *g;
    long t;          /* ms */
    double external; /* another process's SM % now */
};

static int sim_sample(void *ctx, int host, double *util, double *external)
{
    (void)host;
    struct sim *s = ctx;
    *util = (double)(long)(util_1s(s->g, s->t) + 0.5);
    *external = s->external;
    return 0;
}

static uint64_t sim_now(void *ctx)
{
    return (uint64_t)((struct sim *)ctx)->t * 1000000ull;
}

/* The synchronous application: a launch, a synchronize that returns when the GPU has finished it,
 * idle_ms of sleep, the next launch (retried every 10 ms while the bucket refuses it). */
static void sync_app(struct app *a, struct gpu *g, int64_t *tokens, long t)
{
    if (t < a->sleep_until || g->pending > 0)
        return;
    if (a->running) {
        a->running = false;
        a->sleep_until = t + a->idle_ms;
    } else if (core_bucket_try_charge(tokens, a->grid)) {
        g->pending += (double)a->grid;
        a->running = true;
    } else {
        a->sleep_until = t + 10;
    }
}

/* Runs `ms` milliseconds of the application, the GPU and the real watcher cycle every 100 ms;
 * `external(ms)` gives another process's SM % for the soft limit; measures share and MAE over
 * [from, ms) against `target(ms)`. */
static struct result simulate(struct gpu *g, struct app *a, int hard, int soft, long ms, long from,
                              double (*target)(long), double (*external)(long), double (*demand)(long))
{
    struct sim s = {.g = g};
    struct core_watch_ops ops = {.sample = sim_sample, .now_ns = sim_now, .ctx = &s};
    struct core_device d;
    core_device_init(&d, 0, hard, soft, core_bucket_ceiling(g->sms, 2048), NULL, 0);
    double cap = g->sms * 1e6 / g->ns_per_block; /* blocks per ms */
    double busy_sum = 0, err_sum = 0;
    long samples = 0;
    for (long t = 0; t < ms; t++) {
        if (demand)
            a->demand = demand(t);
        if (a->idle_ms > 0)
            sync_app(a, g, d.tokens, t);
        else if (t >= a->sleep_until) {
            a->credit += a->demand * a->launches_per_ms;
            while (a->credit >= 1) {
                if (g->pending >= (double)a->queue_launches * (double)a->grid)
                    break; /* the driver's queue is full: the launch call blocks */
                if (!core_bucket_try_charge(d.tokens, a->grid)) {
                    a->sleep_until = t + 10; /* the launch hook's wait */
                    a->credit = 0;
                    break;
                }
                g->pending += (double)a->grid;
                a->credit -= 1;
            }
            if (a->credit > a->launches_per_ms)
                a->credit = a->launches_per_ms;
        }
        double done = g->pending < cap ? g->pending : cap;
        g->pending -= done;
        g->busy[t % HISTORY] = done / cap;
        if (t >= from)
            busy_sum += done / cap;
        if ((t + 1) % MS_PER_CYCLE == 0) {
            s.t = t + 1;
            s.external = external ? external(t) : 0;
            core_watch_cycle(&d, NULL, &ops);
            if (t + 1 > from + HISTORY) { /* a full second of the window behind the sample */
                double util = d.last_util;
                err_sum += util > target(t) ? util - target(t) : target(t) - util;
                samples++;
            }
        }
    }
    last_target = core_ctl_target(&d.ctl);
    return (struct result){.share = 100.0 * busy_sum / (double)(ms - from), .mae = samples ? err_sum / samples : 0};
}

static double target_now;
static double fixed_target(long t)
{
    (void)t;
    return target_now;
}

static void one(int sms, double ns_per_block, unsigned long long grid, double target)
{
    struct gpu g = {.sms = sms, .ns_per_block = ns_per_block};
    struct app a = {.grid = grid, .launches_per_ms = 400, .queue_launches = 1024, .demand = 1};
    target_now = target;
    struct result r = simulate(&g, &a, (int)target, 0, 11000, 1000, fixed_target, NULL, NULL);
    double err = r.share > target ? r.share - target : target - r.share;
    printf("sim: %3d SMs, %6.0f ns/block, grid %5llu, target %2.0f%%: share %5.2f%% (|err| %.2f), MAE %.2f\n",
           sms, ns_per_block, grid, target, r.share, err, r.mae);
    CHECK(err <= 3.0);
    CHECK(r.mae <= 3.0);
}

static void test_targets_on_small_and_big_gpus(void)
{
    int sms[] = {20, 132, 188};
    double targets[] = {30, 60};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            one(sms[i], 5000, 2ULL * (unsigned)sms[i], targets[j]);   /* 10 us kernels */
            one(sms[i], 50000, 4ULL * (unsigned)sms[i], targets[j]);  /* 200 us kernels */
        }
}

/* 5 s launching at a fifth of the target's worth, then saturating: the rate must not have wound up
 * to a burst, and the share over the saturated phase's last 10 s sits at the target. */
static double light_then_heavy(long t)
{
    return t < 5000 ? 0.03 : 1.0;
}

static void test_demand_limited_does_not_wind_up(void)
{
    struct gpu g = {.sms = 132, .ns_per_block = 5000};
    struct app a = {.grid = 264, .launches_per_ms = 400, .queue_launches = 1024, .demand = 1};
    target_now = 60;
    struct result r = simulate(&g, &a, 60, 0, 16000, 6000, fixed_target, NULL, light_then_heavy);
    printf("sim: demand-limited 5 s then saturating, target 60%%: share %.2f%%, MAE %.2f\n", r.share, r.mae);
    CHECK(r.share >= 57 && r.share <= 63);
}

/* Soft limit 60 over hard 30: uncontended for the first 8 s (bursts to 60 once debounced), then an
 * external process uses 20 % (back to 30 at once). The run is deterministic, so the two windows are
 * measured on two identical runs. */
static double contention(long t)
{
    return t < 8000 ? 0.0 : 20.0;
}

static double soft_then_hard(long t)
{
    return t < 8000 ? 60 : 30;
}

static void test_soft_limit(void)
{
    struct result r[2];
    long from[2] = {3000, 10000}, to[2] = {8000, 16000};
    for (int i = 0; i < 2; i++) {
        struct gpu g = {.sms = 132, .ns_per_block = 5000};
        struct app a = {.grid = 264, .launches_per_ms = 400, .queue_launches = 1024, .demand = 1};
        r[i] = simulate(&g, &a, 30, 60, to[i], from[i], soft_then_hard, contention, NULL);
        CHECK(last_target == (i == 0 ? 60 : 30));
    }
    printf("sim: soft 60 / hard 30: uncontended share %.2f%% (MAE %.2f), contended share %.2f%% (MAE %.2f)\n",
           r[0].share, r[0].mae, r[1].share, r[1].mae);
    CHECK(r[0].share >= 57 && r[0].share <= 63);
    /* The step from hard to soft is a transient, not a bias for the trim: wound up on it, the burst
     * overshoots soft for seconds (MAE 0.50 here, +5 points on the fake driver). */
    CHECK(r[0].mae <= 0.25);
    CHECK(r[1].share >= 27 && r[1].share <= 33);
}

/* The case the reference's GAP path is for: one big kernel + synchronize after 250 ms idle, on a GPU
 * running 1000 blocks per ms (the fake driver's 1 us per block), over a minute (a period is ~2.7 s at
 * 30 %). A long kernel is charged at its launch but shows in the utilisation only as it runs: learned
 * from the charges, the gain read several times low right after each launch (800 ms kernels got 45 %,
 * 1500 ms 70 %, 800 ms at 60 % 47 %); from the tokens run but as a mean of per-sample ratios, the
 * tail samples of a kernel still skewed it (800 ms 36 %). At 60 % the one-second samples swing
 * between 0 and 80 %, which the trim must not take for a bias (wound down: 39 %). */
static void test_long_kernels_after_idle(void)
{
    struct {
        long kernel_ms;
        int target;
    } cases[] = {{300, 30}, {800, 30}, {1000, 30}, {1500, 30}, {800, 60}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gpu g = {.sms = 132, .ns_per_block = 132000};
        struct app a = {.grid = (unsigned long long)cases[i].kernel_ms * 1000, .idle_ms = 250};
        target_now = cases[i].target;
        struct result r = simulate(&g, &a, cases[i].target, 0, 62000, 2000, fixed_target, NULL, NULL);
        printf("sim: %4ld ms kernels after 250 ms idle, target %d%%: share %.2f%%\n", cases[i].kernel_ms,
               cases[i].target, r.share);
        CHECK(r.share >= cases[i].target - 3 && r.share <= cases[i].target + 3);
    }
}

int main(void)
{
    RUN(test_targets_on_small_and_big_gpus);
    RUN(test_demand_limited_does_not_wind_up);
    RUN(test_soft_limit);
    RUN(test_long_kernels_after_idle);
    return check_summary("test_core_sim");
}

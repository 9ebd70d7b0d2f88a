/* The scale-free rate controller of the core limit (see core_ctl.h). */
#include "core_ctl.h"

#define TRIM_GAIN 0.05   /* per cycle, on the relative error: slow, it corrects a bias */
#define TRIM_BAND 0.5    /* integrate only within +-50 % of the target: transients are the model's */
#define TRIM_MIN 0.5
#define TRIM_MAX 2.0
#define MIN_UTIL 0.5     /* below this the gain estimate is noise */
/* Weight of a new sample in the smoothed token rate and utilisation. While the window fills (the
 * first second) a sample replaces them: those windows are partial and the first rate arbitrary. */
#define SMOOTH 0.2
#define CAP_CYCLES 2.0  /* the bucket holds at most this many cycles of refill */
#define FIRST_PERIOD 0.1 /* seconds: the cycle assumed before the first one is measured */
/* The first rate refills target % of the ceiling per second: low for a real GPU (the first
 * measurement raises it within a cycle or two), so the start never bursts far above the limit. */
#define FIRST_RATE_SECONDS 1.0
/* NVML's window: utilisation of the last second is compared with the tokens consumed in the last
 * second, zero before the first cycle (a young process has consumed nothing earlier). */
#define NVML_WINDOW 1.0

void core_ctl_init(struct core_ctl *c, double hard, double soft, int64_t ceiling)
{
    *c = (struct core_ctl){.hard = hard, .soft = soft > hard ? soft : 0, .ceiling = (double)ceiling, .trim = 1.0};
    c->rate = c->ceiling * (hard / 100.0) / FIRST_RATE_SECONDS;
    c->period = FIRST_PERIOD;
}

double core_ctl_target(const struct core_ctl *c)
{
    return c->soft > 0 && c->quiet >= CORE_CTL_QUIET_CYCLES ? c->soft : c->hard;
}

int64_t core_ctl_cap(const struct core_ctl *c)
{
    double cap = CAP_CYCLES * c->rate * c->trim * c->period;
    return (int64_t)(cap < c->ceiling ? cap : c->ceiling);
}

static double clamp(double v, double lo, double hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The tokens that ran this cycle: the charges join the backlog, which drains at most `full` tokens
 * a second (all of it before the first measurement). Tracks whether a charge ran past its cycle. */
static double run_backlog(struct core_ctl *c, double consumed, double dt)
{
    c->backlog += consumed > 0 ? consumed : 0;
    double ran = c->measured && c->backlog > c->full * dt ? c->full * dt : c->backlog;
    c->backlog -= ran;
    c->steady = c->backlog > 0 ? 0 : c->steady < CORE_CTL_WINDOW ? c->steady + 1 : CORE_CTL_WINDOW;
    return ran;
}

/* Learns the full rate from the tokens run over the window (per second) and the utilisation. */
static void learn(struct core_ctl *c, double tokens_per_s, double util)
{
    double w = c->measured && c->filled == CORE_CTL_WINDOW ? SMOOTH : 1.0;
    c->token_avg = (1 - w) * c->token_avg + w * tokens_per_s;
    c->util_avg = (1 - w) * c->util_avg + w * util;
    c->full = 100 * c->token_avg / c->util_avg;
    c->measured = true;
}

int64_t core_ctl_step(struct core_ctl *c, double util, double external, double consumed, bool throttled,
                      double dt)
{
    if (dt <= 0)
        return 0;
    c->period = dt;
    double before = core_ctl_target(c);
    c->quiet = external > CORE_CTL_EXTERNAL_BUSY ? 0 : c->quiet + 1;
    if (c->quiet > CORE_CTL_QUIET_CYCLES)
        c->quiet = CORE_CTL_QUIET_CYCLES;
    double target = core_ctl_target(c);
    /* After a change of target (soft <-> hard) the window still shows the old one: a transient. */
    c->settled = target != before ? 0 : c->settled < CORE_CTL_WINDOW ? c->settled + 1 : CORE_CTL_WINDOW;

    c->ran[c->pos] = run_backlog(c, consumed, dt);
    c->seconds[c->pos] = dt;
    c->pos = (c->pos + 1) % CORE_CTL_WINDOW;
    if (c->filled < CORE_CTL_WINDOW)
        c->filled++;

    if (util >= MIN_UTIL) {
        double tokens = 0, seconds = 0;
        for (int i = 0; i < c->filled; i++) {
            tokens += c->ran[i];
            seconds += c->seconds[i];
        }
        if (seconds < NVML_WINDOW)
            seconds = NVML_WINDOW;
        if (tokens > 0)
            learn(c, tokens / seconds, util);
        double err = (target - util) / target;
        /* The trim integrates only with a full window of this target behind it: the start and a
         * change of target are the model's. */
        bool settled = c->filled == CORE_CTL_WINDOW && c->settled == CORE_CTL_WINDOW;
        /* Nor while a charge has run past its cycle in the last window: with kernels that long the
         * utilisation swings between 0 and the kernel's, and the band selects its samples unevenly
         * (test_core_sim: at 60 %, 800 ms kernels after 250 ms idle got 39 %, the trim wound down). */
        settled = settled && c->steady == CORE_CTL_WINDOW;
        if (throttled && settled && util < 99 && err < TRIM_BAND && err > -TRIM_BAND)
            c->trim = clamp(c->trim * (1 + TRIM_GAIN * err), TRIM_MIN, TRIM_MAX);
    }
    if (c->measured)
        c->rate = target * c->full / 100; /* target / gain */
    double add = c->rate * c->trim * dt;
    /* More than a full bucket per cycle is capped by the refill anyway; bound it so the int64 holds. */
    if (add > 4 * c->ceiling + 1)
        add = 4 * c->ceiling + 1;
    return (int64_t)add;
}

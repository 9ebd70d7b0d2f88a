/* The controller of the core (SM) limit: turns the measured SM utilisation of the container into the
 * tokens to add to its bucket each watcher cycle. Pure (the caller passes time and measurements).
 *
 * Why not the peers' `delta`: its step is SMs^2 x maxThreads x |diff| / 2560 tokens, so its loop gain
 * grows with the square of the SM count and it overshoots on big GPUs. This controller is scale-free:
 * it learns the plant's gain g = util / token-rate (percent per token/s) over the same one-second
 * window NVML's utilisation covers, sets the rate to target / g, and trims a residual bias with a
 * slow multiplicative integral term, so the loop behaves the same on 20 SMs and 132. The gain estimate
 * is right whether the application is throttled (util follows the rate) or demand-limited (it
 * launches less; util follows its demand): in both, util / tokens is the GPU's cost per block. The
 * trim only integrates while the bucket actually throttled, so an idle or demand-limited
 * application does not wind it up.
 *
 * Long kernels: a launch is charged at once but its utilisation accrues while it runs, up to a
 * second for a kernel as long as NVML's window. The tokens compared with the utilisation are
 * therefore those that have run: charges queue in a backlog that drains at the learned full rate
 * (100 / g tokens a second), and g is the ratio of the smoothed token rate to the smoothed
 * utilisation, so a sample in a kernel's tail (little utilisation, few tokens) weighs little. The
 * trim holds while a charge has run past its cycle in the last window: the samples then swing
 * between 0 and the kernel's share, which is no bias.
 *
 * Soft limit: with soft > hard, the target is soft while no external process used more than 1 % SM
 * for CORE_CTL_QUIET_CYCLES cycles in a row; one contended cycle returns it to hard. */
#ifndef VGPU_CORE_CTL_H
#define VGPU_CORE_CTL_H

#include <stdbool.h>
#include <stdint.h>

#define CORE_CTL_WINDOW 10          /* cycles remembered: ~1 s at 100 ms, NVML's sample window */
#define CORE_CTL_QUIET_CYCLES 10    /* uncontended cycles before the soft limit applies */
#define CORE_CTL_EXTERNAL_BUSY 1.0  /* external SM % that counts as contention */

struct core_ctl {
    double hard, soft;   /* percent; soft <= hard means no soft limit */
    double ceiling;      /* bucket ceiling, tokens */
    double rate;         /* tokens per second refilled now */
    double trim;         /* multiplicative bias correction, [0.5, 2] */
    double period;       /* seconds of the last cycle */
    double full;         /* tokens per second at 100 %: 100 / g */
    double backlog;      /* tokens charged that have not run yet at `full` */
    double token_avg;    /* smoothed tokens per second run over the window */
    double util_avg;     /* smoothed utilisation, the same samples */
    double ran[CORE_CTL_WINDOW], seconds[CORE_CTL_WINDOW];
    int pos, filled;
    int steady;          /* cycles since a charge last ran past its cycle, at most CORE_CTL_WINDOW */
    int quiet;           /* consecutive uncontended cycles */
    int settled;         /* cycles since the target last changed, at most CORE_CTL_WINDOW */
    bool measured;       /* the gain has been estimated at least once */
};

/* hard/soft in percent (soft <= 0: none); ceiling from core_bucket_ceiling(). The first rate, before
 * any measurement, refills target % of the ceiling per second. */
void core_ctl_init(struct core_ctl *c, double hard, double soft, int64_t ceiling);

/* The target in force (hard, or soft while uncontended). */
double core_ctl_target(const struct core_ctl *c);

/* The most tokens the bucket may hold now: two cycles of the current rate, at most the ceiling.
 * Without it a bucket filled while the rate was high (or at the start) lets the application run
 * unthrottled for as long as that credit lasts, seconds when blocks are long. */
int64_t core_ctl_cap(const struct core_ctl *c);

/* One watcher cycle. util: the container's SM % over the last second (negative: no sample, keep the
 * rate); external: the busiest other process's SM % (contention, for the soft limit); consumed: tokens
 * charged since the previous cycle; throttled: a charge was refused since the previous cycle; dt:
 * seconds since the previous cycle. Returns the tokens to add now. */
int64_t core_ctl_step(struct core_ctl *c, double util, double external, double consumed, bool throttled,
                      double dt);

#endif

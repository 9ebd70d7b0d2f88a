/* The watcher cycle and thread (see core_watch.h). */
#include "core_watch.h"

#include <signal.h>
#include <time.h>

#include "core_bucket.h"

void core_device_init(struct core_device *d, int host, int hard, int soft, int64_t ceiling,
                      struct vgpu_sm_device *shared, uint64_t now_ns)
{
    *d = (struct core_device){.host = host, .shared = shared, .last_ns = now_ns, .last_util = -1};
    core_ctl_init(&d->ctl, hard, soft, ceiling);
    d->tokens = shared ? &shared->tokens : &d->local_tokens;
    if (!shared)
        d->local_tokens = core_bucket_refill(&d->local_tokens, (int64_t)(d->ctl.rate * d->ctl.period),
                                             core_ctl_cap(&d->ctl));
    d->after_refill = __atomic_load_n(d->tokens, __ATOMIC_RELAXED);
}

/* In shared mode a process that is not the sampler keeps the bucket alive while the sampler is
 * stuck: the last share, at most two shares deep. */
static void follower_cycle(struct core_device *d, struct core_shared *sh, uint64_t now)
{
    if (!core_shared_sampler_stale(sh, now, CORE_WATCH_STALE_NS))
        return;
    int64_t share = __atomic_load_n(&d->shared->share, __ATOMIC_RELAXED);
    core_shared_refill(d->shared, now, share, 2 * share, NULL);
}

void core_watch_cycle(struct core_device *d, struct core_shared *sh, const struct core_watch_ops *ops)
{
    uint64_t now = ops->now_ns(ops->ctx);
    if (d->shared) {
        if (!core_shared_try_sampler(sh)) {
            follower_cycle(d, sh, now);
            d->last_ns = now;
            return;
        }
        core_shared_heartbeat(sh, now);
    }
    double dt = now > d->last_ns ? (double)(now - d->last_ns) / 1e9 : 0;
    if (dt <= 0)
        return;
    d->last_ns = now;
    double util = -1, external = 0;
    if (ops->sample(ops->ctx, d->host, &util, &external) < 0)
        util = -1;
    d->last_util = util;
    int64_t level = __atomic_load_n(d->tokens, __ATOMIC_RELAXED);
    double consumed = (double)(d->after_refill - level);
    /* Throttled: the bucket is empty at the refill, so launches are waiting (or just were). */
    int64_t add = core_ctl_step(&d->ctl, util, external, consumed, level < 0, dt);
    int64_t cap = core_ctl_cap(&d->ctl);
    if (ops->cycle)
        ops->cycle(ops->ctx, d->host, util, core_ctl_target(&d->ctl), add, level);
    if (!d->shared) {
        d->after_refill = core_bucket_refill(d->tokens, add, cap);
        return;
    }
    struct vgpu_sm_device *s = d->shared;
    __atomic_store_n(&s->share, add, __ATOMIC_RELAXED);
    __atomic_store_n(&s->util, util < 0 ? -1 : (int32_t)(util * 10), __ATOMIC_RELAXED);
    __atomic_store_n(&s->limit, (int32_t)core_ctl_target(&d->ctl), __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_sample_ns, now, __ATOMIC_RELEASE);
    if (!core_shared_refill(s, now, add, cap, &d->after_refill)) /* a follower refilled just now */
        d->after_refill = __atomic_load_n(d->tokens, __ATOMIC_RELAXED);
}

static void *watcher_main(void *arg)
{
    struct core_watcher *w = arg;
    sigset_t all; /* the application's signal handlers run on its own threads, never here */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) { /* a period first: a device's first cycle measures its first 100 ms */
        struct timespec ts = {0, (long)CORE_WATCH_PERIOD_NS};
        nanosleep(&ts, NULL);
        if (__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
            break;
        for (int i = 0, n = __atomic_load_n(&w->count, __ATOMIC_ACQUIRE); i < n; i++)
            core_watch_cycle(w->devs[i], w->sh, w->ops);
    }
    return NULL;
}

int core_watcher_start(struct core_watcher *w)
{
    w->stop = 0;
    return pthread_create(&w->thread, NULL, watcher_main, w);
}

void core_watcher_stop(struct core_watcher *w)
{
    __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
    pthread_join(w->thread, NULL);
}

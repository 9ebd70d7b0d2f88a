/* Token bucket arithmetic (see core_bucket.h). */
#include "core_bucket.h"

int64_t core_bucket_ceiling(int sms, int max_threads_per_sm)
{
    if (sms <= 0 || max_threads_per_sm <= 0)
        return 0;
    return (int64_t)sms * max_threads_per_sm * 32;
}

bool core_bucket_try_charge(_Atomic int64_t *tokens, unsigned long long blocks)
{
    if (atomic_load_explicit(tokens, memory_order_relaxed) < 0)
        return false;
    int64_t cost = blocks > (unsigned long long)CORE_BUCKET_MAX_CHARGE ? CORE_BUCKET_MAX_CHARGE : (int64_t)blocks;
    atomic_fetch_sub_explicit(tokens, cost, memory_order_relaxed);
    return true;
}

int64_t core_bucket_refill(_Atomic int64_t *tokens, int64_t add, int64_t cap)
{
    if (add < 0)
        add = 0;
    int64_t old = atomic_load_explicit(tokens, memory_order_relaxed), next;
    do {
        /* Saturate instead of wrapping; a count above the cap (the controller lowered it) is cut
         * to the cap: that credit was earned at a rate no longer in force. */
        next = old > cap || add > cap - old ? cap : old + add;
    } while (!atomic_compare_exchange_weak_explicit(tokens, &old, next, memory_order_relaxed,
                                                    memory_order_relaxed));
    return next;
}

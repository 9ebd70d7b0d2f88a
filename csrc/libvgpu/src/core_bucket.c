/* Token bucket arithmetic (see core_bucket.h). */
#include "core_bucket.h"

int64_t core_bucket_ceiling(int sms, int max_threads_per_sm)
{
    if (sms <= 0 || max_threads_per_sm <= 0)
        return 0;
    return (int64_t)sms * max_threads_per_sm * 32;
}

bool core_bucket_try_charge(int64_t *tokens, unsigned long long blocks)
{
    if (__atomic_load_n(tokens, __ATOMIC_RELAXED) < 0)
        return false;
    int64_t cost = blocks > (unsigned long long)CORE_BUCKET_MAX_CHARGE ? CORE_BUCKET_MAX_CHARGE : (int64_t)blocks;
    __atomic_fetch_sub(tokens, cost, __ATOMIC_RELAXED);
    return true;
}

int64_t core_bucket_refill(int64_t *tokens, int64_t add, int64_t cap)
{
    if (add < 0)
        add = 0;
    int64_t old = __atomic_load_n(tokens, __ATOMIC_RELAXED), next;
    do {
        /* Saturate instead of wrapping; a count above the cap (the controller lowered it) is cut
         * to the cap: that credit was earned at a rate no longer in force. */
        next = old > cap || add > cap - old ? cap : old + add;
    } while (!__atomic_compare_exchange_n(tokens, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return next;
}

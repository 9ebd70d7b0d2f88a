/* The token bucket of the core (SM) limit: one signed 64-bit token count per device, in process
 * memory or in the shared sm_node.config (a plain int64_t changed only by __atomic builtins, as
 * vgpu_files.h's protocol says). A launch costs its grid blocks; a charge is admitted while
 * the count is >= 0 and may take it negative (one atomic subtract), so the unthrottled path is a load
 * and a fetch_sub. The controller's refill adds tokens, capped at the level the controller allows (at most the
 * ceiling). Pure: no I/O, no
 * clock; the caller decides how to wait when a charge is refused. */
#ifndef VGPU_CORE_BUCKET_H
#define VGPU_CORE_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

/* The biggest single charge: a grid's block product can reach 2^63; clamping keeps the count from
 * wrapping while still making a huge grid wait for many refills. */
#define CORE_BUCKET_MAX_CHARGE (1LL << 40)

/* SMs x maxThreadsPerSM x 32 (the peers' ceiling; H200: 132 x 2048 x 32 = 8,650,752); 0 when either
 * figure is not positive. */
int64_t core_bucket_ceiling(int sms, int max_threads_per_sm);

/* Charges `blocks` if the count is >= 0 and returns true; returns false (nothing charged) while the
 * count is negative: the caller waits and retries. */
bool core_bucket_try_charge(int64_t *tokens, unsigned long long blocks);

/* Adds `add` (>= 0) tokens, the result capped at `cap` (a count already above it is cut to it);
 * returns the count after the refill. */
int64_t core_bucket_refill(int64_t *tokens, int64_t add, int64_t cap);

#endif

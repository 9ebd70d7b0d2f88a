/* Aggregation of NVML process utilisation samples (see core_util.h). */
#include "core_util.h"

#include <stdbool.h>

void core_util_sum(const struct core_proc_sample *s, size_t n, core_pid_is_ours is_ours, void *ctx, double *ours,
                   double *external)
{
    double sum = 0, busiest = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = s[j].pid == s[i].pid;
        if (seen) /* this PID was aggregated at its first sample */
            continue;
        double util = 0, sm = 0;
        int count = 0;
        for (size_t j = i; j < n; j++) {
            if (s[j].pid != s[i].pid)
                continue;
            util += s[j].sm + CORE_UTIL_CODEC_WEIGHT * (s[j].enc + s[j].dec);
            sm += s[j].sm;
            count++;
        }
        if (is_ours(ctx, s[i].pid) == 1)
            sum += util / count;
        else if (sm / count > busiest)
            busiest = sm / count;
    }
    *ours = sum;
    *external = busiest;
}

/* Running a grpc_unary call on a unix socket under one deadline. */
#ifndef VGPU_TRANSPORT_H
#define VGPU_TRANSPORT_H

#include <stdint.h>

#include "grpc_unary.h"

/* Connect to `path`, send the call (its grpc-timeout set from what is left of timeout_ms after
 * connecting), read until the outcome. Everything, connect included, ends within timeout_ms. */
void grpc_call_unix(const char *path, const struct grpc_call_spec *spec, uint64_t timeout_ms, grpc_trace_fn trace,
                    void *trace_ctx, struct grpc_result *result);

#endif

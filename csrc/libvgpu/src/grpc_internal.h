/* Shared by the call's own files (grpc_*.c, transport.c), not by its users: the output queue, failing the call, tracing. */
#ifndef VGPU_GRPC_INTERNAL_H
#define VGPU_GRPC_INTERNAL_H

#include "grpc_unary.h"
#include "grpc_status.h"
#include "h2.h"

#if defined(__GNUC__)
#define GU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define GU_PRINTF(a, b)
#endif

int gu_queue(struct grpc_unary *c, const void *p, size_t n);
int gu_queue_frame(struct grpc_unary *c, uint8_t type, uint8_t flags, uint32_t stream_id, const void *payload,
                   size_t n);

/* End the call with this outcome unless it already ended (the first cause wins). */
void gu_fail(struct grpc_unary *c, enum grpc_outcome outcome, int code, const char *fmt, ...) GU_PRINTF(4, 5);

/* A connection error (RFC 9113 §5.4.1): queue GOAWAY with the code, end the call as a protocol error. */
void gu_conn_error(struct grpc_unary *c, enum h2_error err, const char *fmt, ...) GU_PRINTF(3, 4);

void gu_tracef(struct grpc_unary *c, const char *fmt, ...) GU_PRINTF(2, 3);

/* Copy `s` for a one-line trace or error: control octets become '?', long values are cut. */
void gu_printable(char *dst, size_t cap, const char *s, size_t n);

/* grpc_response.c: a complete header block; DATA on our stream. */
void gu_header_block(struct grpc_unary *c);
void gu_data(struct grpc_unary *c, const struct h2_frame *f);

#endif

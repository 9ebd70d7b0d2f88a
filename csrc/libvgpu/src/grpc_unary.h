/* One unary gRPC call over HTTP/2 cleartext, without I/O ("sans-I/O"): the caller feeds it the
 * octets the server sent and writes out what it queues. Keeping the sockets out makes every
 * protocol path testable with canned server bytes (tests/test_grpc_unary.c), and transport.c
 * stays a plain poll loop with a deadline. */
#ifndef VGPU_GRPC_UNARY_H
#define VGPU_GRPC_UNARY_H

#include <stddef.h>
#include <stdint.h>

#include "hpack.h"

#define GRPC_MAX_MESSAGE 16384      /* the registry's max message size (16 KiB) */
#define GRPC_MAX_HEADER_BLOCK 65536 /* also advertised as SETTINGS_MAX_HEADER_LIST_SIZE */
#define GRPC_STREAM_ID 1u           /* the call is the connection's only stream */
#define GRPC_MESSAGE_MAX 1024       /* kept grpc-message / diagnostic length */

enum grpc_outcome {
    CALL_PENDING = 0,
    CALL_STATUS,      /* the server answered with a status, OK or not */
    CALL_UNAVAILABLE, /* the connection closed, or GOAWAY came, before the answer */
    CALL_PROTOCOL,    /* the peer broke HTTP/2, HPACK or gRPC framing */
    CALL_DEADLINE,    /* our deadline passed first (set through grpc_unary_expire) */
};

struct grpc_result {
    enum grpc_outcome outcome;
    int code;                        /* the server's status, or the status the outcome maps to */
    char message[GRPC_MESSAGE_MAX];  /* percent-decoded grpc-message, or what went wrong */
};

struct grpc_call_spec {
    const char *path;      /* "/registry.VDeviceRegistry/RegisterContainerDevice" */
    const char *authority; /* ":authority"; any host name does on a unix socket */
    const char *timeout;   /* grpc-timeout value, or NULL for none */
    const uint8_t *message; /* serialized request */
    size_t message_len;
};

typedef void (*grpc_trace_fn)(void *ctx, const char *line);

struct grpc_unary {
    uint8_t *out; /* queued for the server */
    size_t out_len, out_cap;
    uint8_t *in; /* received, not yet a whole frame */
    size_t in_len, in_cap;
    struct hpack_dtable dtable;
    int seen_settings;      /* the server preface (a SETTINGS frame) arrived */
    uint8_t *block;         /* header block being assembled from HEADERS + CONTINUATION */
    size_t block_len;
    int block_open;
    int block_end_stream;   /* the HEADERS that opened it carried END_STREAM */
    int got_headers;        /* response headers were decoded */
    uint8_t msg[GRPC_MAX_MESSAGE + 5]; /* response DATA: 5-octet gRPC prefix + protobuf */
    size_t msg_len;
    uint32_t data_received; /* DATA octets incl. padding, against our 65535 window */
    int goaway;             /* GOAWAY seen and our stream was within last-stream-id */
    uint32_t goaway_code;
    struct grpc_result result;
    grpc_trace_fn trace;
    void *trace_ctx;
};

/* Set up and queue the whole request: preface, SETTINGS, HEADERS, DATA with END_STREAM.
 * Returns 0, or -1 with result set (request too large, no memory). */
int grpc_unary_start(struct grpc_unary *c, const struct grpc_call_spec *spec, grpc_trace_fn trace,
                     void *trace_ctx);

/* Process received octets; returns the outcome so far (CALL_PENDING until the call is over).
 * May queue output (SETTINGS ACK, PING ACK, GOAWAY). */
enum grpc_outcome grpc_unary_feed(struct grpc_unary *c, const uint8_t *p, size_t n);

/* The server closed the connection. */
enum grpc_outcome grpc_unary_eof(struct grpc_unary *c);

/* The deadline passed: queue RST_STREAM(CANCEL) so the server can stop, end as CALL_DEADLINE. */
void grpc_unary_expire(struct grpc_unary *c, const char *why);

/* Output queue: what to write, and how much of it was written. */
void grpc_unary_pending(const struct grpc_unary *c, const uint8_t **p, size_t *n);
void grpc_unary_consumed(struct grpc_unary *c, size_t n);

void grpc_unary_free(struct grpc_unary *c);

#endif

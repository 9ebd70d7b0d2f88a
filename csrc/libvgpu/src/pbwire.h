/* The few protobuf wire-format pieces the registry call needs, by hand: the request is three
 * proto3 strings, the response an empty message we only check for well-formedness. */
#ifndef VGPU_PBWIRE_H
#define VGPU_PBWIRE_H

#include <stddef.h>
#include <stdint.h>

/* Append field `field` (wire type 2) holding s[0..n); proto3 omits an empty string.
 * Returns octets written (0 for an omitted field) or -1 if cap is too small. */
ptrdiff_t pb_put_string(uint8_t *dst, size_t cap, uint32_t field, const char *s, size_t n);

/* 0 when p[0..n) is a sequence of well-formed fields (unknown fields are fine), -1 otherwise. */
int pb_wellformed(const uint8_t *p, size_t n);

#endif

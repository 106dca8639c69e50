/* Reading a state blob's named sections (layout: docs/guides/checkpoints.md "State blobs",
 * src/state/blob.hpp), for tests that look inside or damage blobs. */
#ifndef DSOPT_TESTS_BLOB_SECTIONS_H
#define DSOPT_TESTS_BLOB_SECTIONS_H

#include <stdint.h>

/* The bytes of section `name` of a well-formed blob, NULL if absent;
 * *len (may be NULL) gets its length. Like strchr, the result is writable
 * when the blob is (tests damage sections through it). */
uint8_t *blob_section(const uint8_t *blob, const char *name, uint64_t *len);

/* Rewrites the CRC-32 at the end of a `size`-byte blob after its bytes were
 * changed, so that the load reads the changed values. */
void blob_fix_checksum(uint8_t *blob, uint64_t size);

/* Removes section `name` from a well-formed `size`-byte blob in place, as
 * a blob written before that section existed (count, total size and
 * checksum rewritten). Returns the new size (`size` when it is absent). */
uint64_t blob_drop_section(uint8_t *blob, uint64_t size, const char *name);

#endif /* DSOPT_TESTS_BLOB_SECTIONS_H */

#include "blob_sections.h"

#include <string.h>

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

uint8_t *blob_section(const uint8_t *blob, const char *name, uint64_t *len) {
  uint64_t at = 24;              /* magic, version, reserved, total size */
  at += 4 + get_u32(blob + at);  /* algorithm */
  at += 8;                       /* world size, rank */
  const uint64_t nparams = get_u64(blob + at);
  at += 8 + 16 * nparams;
  const uint32_t nsections = get_u32(blob + at);
  at += 4;
  for (uint32_t i = 0; i < nsections; ++i) {
    const uint32_t name_len = get_u32(blob + at);
    const int match = name_len == strlen(name) && memcmp(blob + at + 4, name, name_len) == 0;
    at += 4 + name_len;
    const uint64_t bytes = get_u64(blob + at);
    at += 8;
    if (match) {
      if (len) *len = bytes;
      return (uint8_t *)(blob + at);
    }
    at += bytes;
  }
  return NULL;
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void blob_fix_checksum(uint8_t *blob, uint64_t size) {
  const uint32_t crc = crc32_of(blob, (size_t)(size - 4));
  memcpy(blob + size - 4, &crc, 4);
}

uint64_t blob_drop_section(uint8_t *blob, uint64_t size, const char *name) {
  uint64_t len = 0;
  uint8_t *data = blob_section(blob, name, &len);
  if (!data) return size;
  const uint64_t name_len = strlen(name);
  uint8_t *start = data - 8 - name_len - 4; /* its name length field */
  const uint64_t cut = 4 + name_len + 8 + len;
  memmove(start, start + cut, (size_t)(blob + size - (start + cut)));
  size -= cut;
  /* the section count follows the parameters (see blob_section) */
  uint64_t at = 24;
  at += 4 + get_u32(blob + at);
  at += 8;
  at += 8 + 16 * get_u64(blob + at);
  const uint32_t nsections = get_u32(blob + at) - 1;
  memcpy(blob + at, &nsections, 4);
  memcpy(blob + 16, &size, 8); /* total size */
  blob_fix_checksum(blob, size);
  return size;
}

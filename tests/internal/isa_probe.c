/* Runs a fixed mixed-dtype Adam workload, then a Lion one, and prints a
 * checksum of every parameter and the final state blob of each. Run under DSOPT_CPU_ISA=scalar, avx2
 * and avx512 (check_isa_identity.sh): the vector code, the scalar tail and
 * the scalar kernels must give the same bits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsopt.h"

static uint32_t rng_state = 12345u;
static float uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return (float)(rng_state >> 8) / 16777216.0f * 2.0f - 1.0f;
}
static uint16_t to_half_bits(float f, int dtype) {
  /* crude, only to make inputs: truncation is fine here */
  uint32_t u;
  memcpy(&u, &f, 4);
  if (dtype == DSOPT_BFLOAT16) return (uint16_t)(u >> 16);
  return (uint16_t)(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xff) - 112) << 10) | ((u >> 13) & 0x3ff));
}
static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static void fill(void* data, int64_t n, int dtype, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float v = uniform() * scale;
    if (dtype == DSOPT_FLOAT32) ((float*)data)[i] = v;
    else ((uint16_t*)data)[i] = to_half_bits(v, dtype);
  }
}
#define NP 6
/* Steps the workload with `cfg` and prints the checksum; 0 on success. */
static int probe(const char* cfg) {
  const int64_t sizes[NP] = {1, 7, 33, 4099, 65537, 100003};
  const int pdt[NP] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16, DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
  const int gdt[NP] = {DSOPT_FLOAT16, DSOPT_FLOAT32, DSOPT_BFLOAT16, DSOPT_BFLOAT16, DSOPT_FLOAT16, DSOPT_FLOAT32};
  dsopt_tensor params[NP], grads[NP];
  for (int i = 0; i < NP; ++i) {
    size_t es = pdt[i] == DSOPT_FLOAT32 ? 4 : 2, gs = gdt[i] == DSOPT_FLOAT32 ? 4 : 2;
    params[i] = (dsopt_tensor){malloc(sizes[i] * es), sizes[i], pdt[i], i % 2};
    grads[i] = (dsopt_tensor){malloc(sizes[i] * gs), sizes[i], gdt[i], 0};
    fill(params[i].data, sizes[i], pdt[i], 1.0f);
  }
  dsopt_comm* comm = NULL;
  dsopt_optimizer* opt = NULL;
  if (dsopt_comm_create_local(&comm) || dsopt_create(&opt, cfg, comm, params, NP)) {
    fprintf(stderr, "setup failed: %s\n", dsopt_last_error());
    return 1;
  }
  for (int step = 0; step < 8; ++step) {
    for (int i = 0; i < NP; ++i) fill(grads[i].data, sizes[i], gdt[i], 4.0f);
    dsopt_step_info info = {sizeof info};
    if (dsopt_step(opt, grads, NP, &info)) {
      fprintf(stderr, "step failed: %s\n", dsopt_last_error());
      return 1;
    }
  }
  uint64_t h = 1469598103934665603ull, size = 0;
  for (int i = 0; i < NP; ++i) h = fnv(h, params[i].data, sizes[i] * (pdt[i] == DSOPT_FLOAT32 ? 4 : 2));
  dsopt_state_size(opt, &size);
  void* blob = malloc(size);
  dsopt_state_save(opt, blob, size, NULL);
  h = fnv(h, blob, size);
  printf("%016llx\n", (unsigned long long)h);
  /* Everything is released: `make test-sanitize` runs this under
   * LeakSanitizer. */
  free(blob);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  for (int i = 0; i < NP; ++i) {
    free(params[i].data);
    free(grads[i].data);
  }
  return 0;
}

int main(void) {
  const char* adam =
      "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01, "
      "\"adam_w_mode\": false}}, \"param_groups\": [{}, {\"lr\": 0.003, \"betas\": [0.8, 0.99]}], "
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 3}, \"gradient_clipping\": 2.0}";
  const char* lion =
      "{\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}, "
      "\"param_groups\": [{}, {\"lr\": 0.003, \"betas\": [0.8, 0.95]}], "
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 3}, \"gradient_clipping\": 2.0}";
  return probe(adam) || probe(lion);
}

/* 1-bit Adam on several MPI ranks across the warmup/compression boundary
 * (odd sizes, a mask, a non_freeze group, fp16 parameters); prints a
 * checksum of the parameters and the state blob per rank. Run under each
 * DSOPT_CPU_ISA by check_isa_identity.sh: the SIMD and scalar compressed
 * allreduce kernels must give the same bits. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsopt.h"

static uint32_t rng_state;
static float uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return (float)(rng_state >> 8) / 16777216.0f * 2.0f - 1.0f;
}
static uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
#define NP 5
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int64_t sizes[NP] = {1, 7, 77, 4099, 70001};
  dsopt_tensor params[NP], grads[NP];
  rng_state = 777u;
  for (int i = 0; i < NP; ++i) {
    float* p = malloc(sizeof(float) * sizes[i]);
    for (int64_t k = 0; k < sizes[i]; ++k) p[k] = uniform();
    params[i] = (dsopt_tensor){p, sizes[i], DSOPT_FLOAT32, i == 1 ? 1 : 0};
    grads[i] = (dsopt_tensor){malloc(sizeof(float) * sizes[i]), sizes[i], DSOPT_FLOAT32, 0};
  }
  const char* cfg =
      "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3, "
      "\"weight_decay\": 0.01}}, \"param_groups\": [{}, {\"non_freeze\": true}], "
      "\"gradient_clipping\": 5.0}";
  dsopt_comm* comm = NULL;
  dsopt_optimizer* opt = NULL;
  if (dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)) || dsopt_create(&opt, cfg, comm, params, NP)) {
    fprintf(stderr, "setup failed: %s\n", dsopt_last_error());
    return 1;
  }
  float* mask = malloc(sizeof(float) * sizes[3]);
  for (int64_t k = 0; k < sizes[3]; ++k) mask[k] = (k % 5) ? 1.0f : 0.0f;
  dsopt_tensor mask_tensor = {mask, sizes[3], DSOPT_FLOAT32, 0};
  if (dsopt_set_momentum_mask(opt, 3, &mask_tensor)) {
    fprintf(stderr, "mask failed: %s\n", dsopt_last_error());
    return 1;
  }
  rng_state = 1000u + (uint32_t)rank;
  for (int step = 0; step < 7; ++step) {
    for (int i = 0; i < NP; ++i)
      for (int64_t k = 0; k < sizes[i]; ++k) ((float*)grads[i].data)[k] = uniform();
    dsopt_step_info info = {sizeof info};
    if (dsopt_step(opt, grads, NP, &info)) {
      fprintf(stderr, "step failed: %s\n", dsopt_last_error());
      return 1;
    }
  }
  uint64_t h = 1469598103934665603ull, size = 0;
  for (int i = 0; i < NP; ++i) h = fnv(h, params[i].data, sizeof(float) * sizes[i]);
  dsopt_state_size(opt, &size);
  void* blob = malloc(size);
  dsopt_state_save(opt, blob, size, NULL);
  h = fnv(h, blob, size);
  /* rank 0 prints every rank's checksum, in rank order */
  uint64_t all[64];
  int world;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0)
    for (int r = 0; r < world; ++r) printf("rank %d %016llx\n", r, (unsigned long long)all[r]);
  /* Everything is released: `make test-sanitize` runs this under
   * LeakSanitizer. */
  free(blob);
  free(mask);
  for (int i = 0; i < NP; ++i) {
    free(params[i].data);
    free(grads[i].data);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}

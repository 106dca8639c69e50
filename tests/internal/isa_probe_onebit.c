/* 1-bit Adam, 1-bit LAMB and 0/1 Adam on several MPI ranks across their
 * phase boundaries (odd sizes, so every update rule runs its tails; a mask,
 * a non_freeze group), and compressed ZeRO with each gradient codec (error
 * feedback on and off, blocks that leave short last blocks) and each
 * parameter codec; prints a checksum of the parameters and the state blob
 * per optimizer and rank. Run under each DSOPT_CPU_ISA by
 * check_isa_identity.sh: the SIMD and scalar update rules, compressed
 * allreduce kernels and block codecs must give the same bits. */
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
static const int64_t sizes[NP] = {1, 7, 77, 4099, 70001};

/* The checksum of one optimizer's run (collective). */
static int run(const char* cfg, int with_mask, int rank, uint64_t* out) {
  dsopt_tensor params[NP], grads[NP];
  rng_state = 777u;
  for (int i = 0; i < NP; ++i) {
    float* p = malloc(sizeof(float) * sizes[i]);
    for (int64_t k = 0; k < sizes[i]; ++k) p[k] = uniform();
    params[i] = (dsopt_tensor){p, sizes[i], DSOPT_FLOAT32, i == 1 ? 1 : 0};
    grads[i] = (dsopt_tensor){malloc(sizeof(float) * sizes[i]), sizes[i], DSOPT_FLOAT32, 0};
  }
  dsopt_comm* comm = NULL;
  dsopt_optimizer* opt = NULL;
  if (dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)) || dsopt_create(&opt, cfg, comm, params, NP)) {
    fprintf(stderr, "setup failed: %s\n", dsopt_last_error());
    return 1;
  }
  float* mask = malloc(sizeof(float) * sizes[3]);
  for (int64_t k = 0; k < sizes[3]; ++k) mask[k] = (k % 5) ? 1.0f : 0.0f;
  dsopt_tensor mask_tensor = {mask, sizes[3], DSOPT_FLOAT32, 0};
  if (with_mask && dsopt_set_momentum_mask(opt, 3, &mask_tensor)) {
    fprintf(stderr, "mask failed: %s\n", dsopt_last_error());
    return 1;
  }
  rng_state = 1000u + (uint32_t)rank;
  for (int step = 0; step < 9; ++step) {
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
  *out = fnv(h, blob, size);
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
  return 0;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  static const char* const configs[] = {
      "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3, "
      "\"weight_decay\": 0.01}}, \"param_groups\": [{}, {\"non_freeze\": true}], "
      "\"gradient_clipping\": 5.0}",
      "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3, "
      "\"weight_decay\": 0.01}}, \"param_groups\": [{}, {}], \"gradient_clipping\": 5.0}",
      "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 3, "
      "\"var_update_scaler\": 1, \"local_step_scaler\": 2, \"local_step_clipper\": 2, "
      "\"weight_decay\": 0.01}}, \"param_groups\": [{}, {}]}",
      /* compressed ZeRO: the block codecs */
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"param_groups\": [{}, {}], "
      "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 6000, \"allgather_bucket_size\": 9000, "
      "\"compression\": {\"gradients\": \"int4\", \"parameters\": \"int8\", \"gradient_block_size\": 24, "
      "\"parameter_block_size\": 40}}}",
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"param_groups\": [{}, {}], "
      "\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 5000, "
      "\"compression\": {\"gradients\": \"sign\", \"parameters\": \"bf16\", \"gradient_block_size\": 56}}}",
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"param_groups\": [{}, {}], "
      "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 7000, "
      "\"compression\": {\"gradients\": \"int8\", \"error_feedback\": false}}}",
  };
  const int nconfigs = (int)(sizeof configs / sizeof configs[0]);
  for (int c = 0; c < nconfigs; ++c) {
    uint64_t h = 0, all[64];
    if (run(configs[c], c < 3, rank, &h)) return 1;
    /* rank 0 prints every rank's checksum, in rank order */
    MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0)
      for (int r = 0; r < world; ++r) printf("optimizer %d rank %d %016llx\n", c, r, (unsigned long long)all[r]);
  }
  MPI_Finalize();
  return 0;
}

/*
 * Results do not depend on the kernel thread count: every optimizer, over
 * hundreds of tensors of mixed sizes and dtypes (so the CPU kernels' even
 * split of the elements cuts tensors at different places for every count,
 * and vector tails land on both sides of the cuts), with gradient clipping
 * (sums of squares), steps the same bits with 1, 2, 3 and 5 threads:
 * parameters and state blobs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/rng.h"

enum { TENSORS = 300, STEPS = 6 };

static const char *const kOptimizers[] = {
    "\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}",
    "\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}",
    "\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}",
    "\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 3, "
    "\"local_step_scaler\": 2, \"local_step_clipper\": 2}",
};

typedef struct outcome {
  uint64_t params_hash, blob_hash;
} outcome;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int64_t size_of(int i) {
  /* 1 to a few thousand elements, some around vector widths */
  static const int64_t special[] = {1, 7, 8, 15, 16, 17, 31, 33, 4095, 4096, 4097};
  if (i % 10 == 0) return special[(i / 10) % 11];
  return 1 + (int64_t)((uint64_t)i * 2654435761u % 3000u);
}

static outcome run(const char *optimizer, int threads) {
  outcome out = {0, 0};
  dsopt_tensor params[TENSORS], grads[TENSORS];
  rng r = rng_seeded(11);
  for (int i = 0; i < TENSORS; ++i) {
    const int64_t n = size_of(i);
    const int dtype = i % 7 == 3 ? DSOPT_BFLOAT16 : DSOPT_FLOAT32;
    const size_t es = dtype == DSOPT_FLOAT32 ? 4 : 2;
    params[i] = (dsopt_tensor){malloc((size_t)n * es), n, dtype, 0};
    grads[i] = (dsopt_tensor){malloc((size_t)n * 4), n, DSOPT_FLOAT32, 0};
    for (int64_t k = 0; k < n; ++k) {
      const float v = (float)rng_signed(&r, 1.0);
      if (dtype == DSOPT_FLOAT32) ((float *)params[i].data)[k] = v;
      else {
        uint32_t u;
        memcpy(&u, &v, 4);
        ((uint16_t *)params[i].data)[k] = (uint16_t)(u >> 16);
      }
    }
  }
  char config[512];
  snprintf(config, sizeof config,
           "{\"optimizer\": {%s}, \"threads\": %d, \"gradient_clipping\": 1.0}", optimizer, threads);
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  if (CHECK_OK(dsopt_comm_create_local(&comm)) &&
      CHECK_OK(dsopt_create(&opt, config, comm, params, TENSORS))) {
    for (int step = 0; step < STEPS; ++step) {
      rng g = rng_seeded(100 + (uint64_t)step);
      for (int i = 0; i < TENSORS; ++i)
        for (int64_t k = 0; k < grads[i].numel; ++k) ((float *)grads[i].data)[k] = (float)rng_signed(&g, 0.5);
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      CHECK_OK(dsopt_step(opt, grads, TENSORS, &info));
      CHECK_EQ_INT(info.skipped, 0);
    }
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < TENSORS; ++i)
      h = fnv(h, params[i].data, (size_t)params[i].numel * (params[i].dtype == DSOPT_FLOAT32 ? 4 : 2));
    out.params_hash = h;
    uint64_t size = 0;
    CHECK_OK(dsopt_state_size(opt, &size));
    void *blob = malloc(size);
    CHECK_OK(dsopt_state_save(opt, blob, size, NULL));
    out.blob_hash = fnv(1469598103934665603ull, blob, size);
    free(blob);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  for (int i = 0; i < TENSORS; ++i) {
    free(params[i].data);
    free(grads[i].data);
  }
  return out;
}

static void test_every_optimizer_steps_the_same_bits_on_any_thread_count(void) {
  static const int counts[] = {2, 3, 5};
  for (size_t o = 0; o < sizeof kOptimizers / sizeof kOptimizers[0]; ++o) {
    const outcome one = run(kOptimizers[o], 1);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; ++c) {
      const outcome other = run(kOptimizers[o], counts[c]);
      CHECKF(other.params_hash == one.params_hash && other.blob_hash == one.blob_hash,
             "%s: %d threads give other bits than 1 thread", kOptimizers[o], counts[c]);
    }
  }
}

int main(void) {
  RUN_TEST(test_every_optimizer_steps_the_same_bits_on_any_thread_count);
  return check_finish();
}

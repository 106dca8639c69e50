/*
 * The non-finite check of dsopt_step finds a single Inf or NaN wherever it
 * lies: first, last and middle elements, around the points where the CPU
 * kernels split work between threads and streams, in the vector tails, in
 * any tensor of many, in fp32, fp16 and bf16 gradients, with 1, 2 and 3
 * threads. The step is then skipped and changes nothing; with every value
 * finite it is applied. CTest runs this under each instruction set
 * (DSOPT_CPU_ISA).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/rng.h"

enum { MAX_TENSORS = 4 };

typedef struct layout {
  int count;
  int64_t sizes[MAX_TENSORS];
} layout;

static uint16_t bad_bits(int dtype, int kind) {
  /* kind 0: NaN, 1: +Inf, 2: -Inf */
  if (dtype == DSOPT_FLOAT16) return kind == 0 ? 0x7E00 : kind == 1 ? 0x7C00 : 0xFC00;
  return kind == 0 ? 0x7FC0 : kind == 1 ? 0x7F80 : 0xFF80;
}

static dsopt_step_info step_info(void) {
  dsopt_step_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  return info;
}

static size_t elem_size(int dtype) { return dtype == DSOPT_FLOAT32 ? 4 : 2; }

/* Small finite values in any dtype (0x3C00 is 1.0 in fp16, 0x3F80 in bf16). */
static void fill_finite(void *g, int64_t n, int dtype, rng *r) {
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DSOPT_FLOAT32) ((float *)g)[i] = (float)rng_signed(r, 1.0);
    else ((uint16_t *)g)[i] = (uint16_t)((dtype == DSOPT_FLOAT16 ? 0x3C00 : 0x3F80) | (rng_next(r) & 0x3F));
  }
}

static void set_bad(void *g, int64_t i, int dtype, int kind) {
  if (dtype == DSOPT_FLOAT32) ((float *)g)[i] = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
  else ((uint16_t *)g)[i] = bad_bits(dtype, kind);
}

/* One optimizer over `l`; every position of interest of every tensor gets
 * one bad value in turn. */
static void check_layout(const layout *l, int dtype, int threads) {
  dsopt_tensor params[MAX_TENSORS], grads[MAX_TENSORS];
  float *saved[MAX_TENSORS];
  rng r = rng_seeded((uint64_t)(dtype * 100 + threads * 10 + l->count));
  for (int t = 0; t < l->count; ++t) {
    const int64_t n = l->sizes[t];
    float *p = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; ++i) p[i] = (float)rng_signed(&r, 1.0);
    params[t] = (dsopt_tensor){p, n, DSOPT_FLOAT32, 0};
    grads[t] = (dsopt_tensor){malloc((size_t)n * elem_size(dtype)), n, dtype, 0};
    fill_finite(grads[t].data, n, dtype, &r);
    saved[t] = malloc((size_t)n * 4);
  }
  char config[160];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": %d}", threads);
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  if (!CHECK_OK(dsopt_comm_create_local(&comm)) ||
      !CHECK_OK(dsopt_create(&opt, config, comm, params, l->count)))
    return;
  int64_t applied = 0;
  for (int t = 0; t < l->count; ++t) {
    const int64_t n = l->sizes[t];
    const int64_t at[] = {0, 1, n / 4 - 1, n / 4, n / 2 - 1, n / 2, n / 2 + 1, 3 * n / 4,
                          n - 17, n - 16, n - 15, n - 2, n - 1, (int64_t)(rng_next(&r) % (uint64_t)n)};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; ++k) {
      const int64_t i = at[k];
      if (i < 0 || i >= n) continue;
      const int kind = (int)(k % 3);
      for (int u = 0; u < l->count; ++u) memcpy(saved[u], params[u].data, (size_t)l->sizes[u] * 4);
      char keep[4];
      memcpy(keep, (char *)grads[t].data + (size_t)i * elem_size(dtype), elem_size(dtype));
      set_bad(grads[t].data, i, dtype, kind);
      dsopt_step_info info = step_info();
      CHECK_OK(dsopt_step(opt, grads, l->count, &info));
      CHECKF(info.skipped == 1, "a %s at element %lld of tensor %d (of %d, n=%lld), dtype %d, %d threads: "
             "skipped = %d", kind == 0 ? "NaN" : "Inf", (long long)i, t, l->count, (long long)n,
             dtype, threads, info.skipped);
      int unchanged = 1;
      for (int u = 0; u < l->count; ++u)
        unchanged &= memcmp(saved[u], params[u].data, (size_t)l->sizes[u] * 4) == 0;
      CHECKF(unchanged, "the skipped step changed parameters (element %lld of tensor %d)", (long long)i, t);
      memcpy((char *)grads[t].data + (size_t)i * elem_size(dtype), keep, elem_size(dtype));
    }
    /* every value finite again: the step is applied */
    dsopt_step_info info = step_info();
    CHECK_OK(dsopt_step(opt, grads, l->count, &info));
    CHECK_EQ_INT(info.skipped, 0);
    CHECK_EQ_INT(info.step, ++applied);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  for (int t = 0; t < l->count; ++t) {
    free(params[t].data);
    free(grads[t].data);
    free(saved[t]);
  }
}

static void test_every_position_dtype_and_thread_count(void) {
  static const layout layouts[] = {
      {1, {1}},     {1, {5}},     {1, {63}},    {1, {64}},          {1, {65}},
      {1, {1000}},  {1, {4097}},  {1, {16384}}, {1, {100003}},      {4, {3, 70001, 17, 40000}},
      {3, {16, 16, 16}},
  };
  static const int dtypes[] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
  for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; ++l)
    for (int d = 0; d < 3; ++d)
      for (int threads = 1; threads <= 3; ++threads) check_layout(&layouts[l], dtypes[d], threads);
}

int main(void) {
  RUN_TEST(test_every_position_dtype_and_thread_count);
  return check_finish();
}

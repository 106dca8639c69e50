/* Absent gradients (a dsopt_tensor with data NULL in dsopt_step, or a
 * parameter no rank hands over with dsopt_grad_ready), under mpirun:
 *  - Adam/AdamW at ZeRO stage 0, 1 and 2: a parameter absent on every rank
 *    is not updated (bit-exact), its step count stays; a parameter absent
 *    on some ranks gets zeros from them. Each parameter then follows,
 *    bit for bit, an optimizer of that parameter alone that is stepped only
 *    in the steps where some rank had its gradient (torch.optim's
 *    per-parameter state, frozen / unfrozen mid-run included);
 *  - the state blob keeps the per-parameter steps: save, load into a fresh
 *    optimizer, continue: bit-identical;
 *  - 1-bit Adam, 1-bit LAMB and 0/1 Adam: an absent gradient is exactly an
 *    explicit zero gradient (warmup and compressed stages);
 *  - dsopt_grad_ready: a parameter nobody hands over is absent everywhere;
 *  - dsopt_get_param_step / dsopt_set_param_step.
 * Gradients are multiples of 2^-10 below 4 in magnitude, so their sums over
 * ranks are exact in any order and the one-parameter optimizers see the
 * same averaged gradients as the full one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/mpi_world.h"
#include "support/rng.h"

#define NUM_PARAMS 4
#define STEPS 12

static const int64_t numels[NUM_PARAMS] = {37, 1000, 5, 64};
static const int32_t dtypes[NUM_PARAMS] = {DSOPT_FLOAT32, DSOPT_FLOAT32, DSOPT_FLOAT32,
                                           DSOPT_BFLOAT16};
static const int32_t groups[NUM_PARAMS] = {0, 1, 0, 1};

/* Whether rank r has a gradient of parameter i in step k. */
static int present(int i, int r, int k, int ranks) {
  switch (i) {
    case 0: return 1;
    case 1: return (k >= 4 && k < 8) || k >= 10;  /* frozen, unfrozen, frozen, unfrozen */
    case 2: return k % 5 != 4 && r == k % ranks;  /* one rank at a time; nobody every 5th */
    default: return k != 2 && k != 3;
  }
}

static int present_anywhere(int i, int k, int ranks) {
  for (int r = 0; r < ranks; ++r)
    if (present(i, r, k, ranks)) return 1;
  return 0;
}

/* Exactly representable values, the same for a (stream, rank, step, param). */
static void dyadic(float *out, int64_t n, uint64_t stream, int rank, int step, int param) {
  rng g = rng_for(stream + (uint64_t)param * 7919u, (uint64_t)rank, (uint64_t)step);
  for (int64_t j = 0; j < n; ++j) {
    int v = (int)(rng_next(&g) % 8191u) - 4095;
    if (v == 0) v = 1;
    out[j] = (float)v / 1024.0f;
  }
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);  /* dyadic initial values with few bits: exact */
}

typedef struct run {
  dsopt_optimizer *opt;
  void *data[NUM_PARAMS];
  dsopt_tensor params[NUM_PARAMS];
  int first, count;  /* the parameters it holds: first .. first+count-1 */
} run;

static int make_run(run *r, const char *config, dsopt_comm *comm, int first, int count) {
  memset(r, 0, sizeof *r);
  r->first = first;
  r->count = count;
  for (int k = 0; k < count; ++k) {
    const int i = first + k;
    float *values = (float *)malloc((size_t)numels[i] * 4);
    dyadic(values, numels[i], 11, 0, 0, i);
    if (dtypes[i] == DSOPT_FLOAT32) {
      r->data[k] = values;
    } else {
      uint16_t *half = (uint16_t *)malloc((size_t)numels[i] * 2);
      for (int64_t j = 0; j < numels[i]; ++j) half[j] = to_bf16(values[j]);
      free(values);
      r->data[k] = half;
    }
    r->params[k] = (dsopt_tensor){r->data[k], numels[i], dtypes[i], groups[i]};
  }
  return dsopt_create(&r->opt, config, comm, r->params, count);
}

static void free_run(run *r) {
  dsopt_destroy(r->opt);
  for (int k = 0; k < r->count; ++k) free(r->data[k]);
}

static int same_param(const run *a, int ka, const run *b, int kb) {
  const int i = a->first + ka;
  const size_t bytes = (size_t)numels[i] * (dtypes[i] == DSOPT_FLOAT32 ? 4 : 2);
  return memcmp(a->data[ka], b->data[kb], bytes) == 0;
}

/* This rank's gradient buffers of step k, one per parameter. */
static float *grads_of_step[NUM_PARAMS];

static void fill_grads(int rank, int k) {
  for (int i = 0; i < NUM_PARAMS; ++i) dyadic(grads_of_step[i], numels[i], 23, rank, k, i);
}

static char config_buf[1024];

static const char *adam_config(const char *type, int stage, const char *extra) {
  snprintf(config_buf, sizeof config_buf,
           "{\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.05%s}},"
           " \"param_groups\": [{}, {\"lr\": 0.003, \"betas\": [0.8, 0.95], \"eps\": 1e-4}],"
           " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 300}, \"threads\": 1}",
           type, extra, stage);
  return config_buf;
}

/* Adam/AdamW at a ZeRO stage against one-parameter optimizers. */
static void test_adam_per_parameter(dsopt_comm *comm, const char *type, int stage, int via_handover) {
  const int rank = world_rank(), ranks = world_size();
  char name[96];
  snprintf(name, sizeof name, "%s stage %d %s", type, stage, via_handover ? "grad_ready" : "dsopt_step");
  check_current_test = name;
  run full, alone[NUM_PARAMS];
  char config[1024];
  snprintf(config, sizeof config, "%s", adam_config(type, stage, ""));
  if (!CHECK_OK(make_run(&full, config, comm, 0, NUM_PARAMS))) return;
  char lone_config[1024];
  snprintf(lone_config, sizeof lone_config, "%s", adam_config(type, 0, ""));
  for (int i = 0; i < NUM_PARAMS; ++i) CHECK_OK(make_run(&alone[i], lone_config, comm, i, 1));
  float *zeros = (float *)calloc(1000, 4);
  for (int k = 0; k < STEPS; ++k) {
    fill_grads(rank, k);
    uint16_t before[64];
    memcpy(before, full.data[3], sizeof before);
    float before1[1000];
    memcpy(before1, full.data[1], sizeof before1);
    if (via_handover) {
      for (int i = NUM_PARAMS - 1; i >= 0; --i)
        if (present(i, rank, k, ranks)) {
          const dsopt_tensor g = {grads_of_step[i], numels[i], DSOPT_FLOAT32, 0};
          CHECK_OK(dsopt_grad_ready(full.opt, i, &g));
        }
      CHECK_OK(dsopt_step(full.opt, NULL, 0, NULL));
    } else {
      dsopt_tensor g[NUM_PARAMS];
      for (int i = 0; i < NUM_PARAMS; ++i)
        g[i] = (dsopt_tensor){present(i, rank, k, ranks) ? grads_of_step[i] : NULL, numels[i],
                              DSOPT_FLOAT32, 0};
      CHECK_OK(dsopt_step(full.opt, g, NUM_PARAMS, NULL));
    }
    for (int i = 0; i < NUM_PARAMS; ++i) {
      if (!present_anywhere(i, k, ranks)) continue;
      const dsopt_tensor g = {present(i, rank, k, ranks) ? grads_of_step[i] : zeros, numels[i],
                              DSOPT_FLOAT32, 0};
      CHECK_OK(dsopt_step(alone[i].opt, &g, 1, NULL));
    }
    if (!present_anywhere(3, k, ranks))
      CHECKF(memcmp(before, full.data[3], sizeof before) == 0, "step %d: frozen bf16 parameter moved", k);
    if (!present_anywhere(1, k, ranks))
      CHECKF(memcmp(before1, full.data[1], sizeof before1) == 0, "step %d: frozen parameter moved", k);
    for (int i = 0; i < NUM_PARAMS; ++i) {
      CHECKF(same_param(&full, i, &alone[i], 0), "step %d: parameter %d differs from its own run", k, i);
      int64_t s = -1, s_alone = -2;
      CHECK_OK(dsopt_get_param_step(full.opt, i, &s));
      CHECK_OK(dsopt_get_param_step(alone[i].opt, 0, &s_alone));
      CHECKF(s == s_alone, "step %d: parameter %d counts %lld updates, its own run %lld", k, i,
             (long long)s, (long long)s_alone);
    }
  }
  int64_t s1 = 0;
  CHECK_OK(dsopt_get_param_step(full.opt, 1, &s1));
  CHECKF(s1 == 6, "parameter 1 had gradients in 6 steps, counts %lld", (long long)s1);
  free(zeros);
  free_run(&full);
  for (int i = 0; i < NUM_PARAMS; ++i) free_run(&alone[i]);
}

/* Save after some absent steps, load into a fresh optimizer, continue both. */
static void test_blob_keeps_param_steps(dsopt_comm *comm) {
  check_current_test = "blob keeps per-parameter steps";
  const int rank = world_rank(), ranks = world_size();
  run a, b;
  char config[1024];
  snprintf(config, sizeof config, "%s", adam_config("AdamW", 0, ""));
  if (!CHECK_OK(make_run(&a, config, comm, 0, NUM_PARAMS))) return;
  CHECK_OK(make_run(&b, config, comm, 0, NUM_PARAMS));
  for (int k = 0; k < STEPS; ++k) {
    if (k == 6) {
      uint64_t size = 0;
      CHECK_OK(dsopt_state_size(a.opt, &size));
      void *blob = malloc(size);
      CHECK_OK(dsopt_state_save(a.opt, blob, size, NULL));
      for (int i = 0; i < NUM_PARAMS; ++i)  /* fp32 parameters are the caller's to restore */
        memcpy(b.data[i], a.data[i], (size_t)numels[i] * (dtypes[i] == DSOPT_FLOAT32 ? 4 : 2));
      CHECK_OK(dsopt_state_load(b.opt, blob, size));
      free(blob);
      for (int i = 0; i < NUM_PARAMS; ++i) {
        int64_t sa = 0, sb = -1;
        CHECK_OK(dsopt_get_param_step(a.opt, i, &sa));
        CHECK_OK(dsopt_get_param_step(b.opt, i, &sb));
        CHECKF(sa == sb, "parameter %d: %lld steps saved, %lld loaded", i, (long long)sa, (long long)sb);
      }
    }
    fill_grads(rank, k);
    dsopt_tensor g[NUM_PARAMS];
    for (int i = 0; i < NUM_PARAMS; ++i)
      g[i] = (dsopt_tensor){present(i, rank, k, ranks) ? grads_of_step[i] : NULL, numels[i],
                            DSOPT_FLOAT32, 0};
    CHECK_OK(dsopt_step(a.opt, g, NUM_PARAMS, NULL));
    if (k >= 6) CHECK_OK(dsopt_step(b.opt, g, NUM_PARAMS, NULL));
  }
  for (int i = 0; i < NUM_PARAMS; ++i)
    CHECKF(same_param(&a, i, &b, i), "parameter %d differs after resuming", i);
  free_run(&a);
  free_run(&b);
}

/* The 1-bit optimizers: NULL is a zero gradient, through both stages. */
static void test_onebit_absent_is_zero(dsopt_comm *comm, const char *type, const char *extra) {
  check_current_test = type;
  const int rank = world_rank(), ranks = world_size();
  run with_null, with_zeros;
  char config[1024];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.001, \"weight_decay\": 0.01%s}},"
           " \"param_groups\": [{}, {\"lr\": 0.002}], \"threads\": 1}", type, extra);
  if (!CHECK_OK(make_run(&with_null, config, comm, 0, NUM_PARAMS))) return;
  CHECK_OK(make_run(&with_zeros, config, comm, 0, NUM_PARAMS));
  float *zeros = (float *)calloc(1000, 4);
  int compressed = 0;
  for (int k = 0; k < STEPS; ++k) {
    fill_grads(rank, k);
    dsopt_tensor g[NUM_PARAMS], z[NUM_PARAMS];
    for (int i = 0; i < NUM_PARAMS; ++i) {
      const int has = present(i, rank, k, ranks);
      g[i] = (dsopt_tensor){has ? grads_of_step[i] : NULL, numels[i], DSOPT_FLOAT32, 0};
      z[i] = (dsopt_tensor){has ? grads_of_step[i] : zeros, numels[i], DSOPT_FLOAT32, 0};
    }
    dsopt_step_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_OK(dsopt_step(with_null.opt, g, NUM_PARAMS, &info));
    CHECK_OK(dsopt_step(with_zeros.opt, z, NUM_PARAMS, NULL));
    compressed += info.compressed;
    for (int i = 0; i < NUM_PARAMS; ++i)
      CHECKF(same_param(&with_null, i, &with_zeros, i), "step %d: parameter %d: NULL differs from zeros", k, i);
  }
  if (ranks > 1) CHECKF(compressed > 0, "the compressed stage never ran");
  int64_t s = 0;
  CHECK_OK(dsopt_get_param_step(with_null.opt, 1, &s));
  CHECKF(s == STEPS, "a 1-bit optimizer's parameter counts %lld steps of %d", (long long)s, STEPS);
  CHECK_STATUS(dsopt_set_param_step(with_null.opt, 0, 3), DSOPT_EUNSUPPORTED);
  free(zeros);
  free_run(&with_null);
  free_run(&with_zeros);
}

static void test_param_step_calls(dsopt_comm *comm) {
  check_current_test = "dsopt_get/set_param_step";
  run r;
  char config[1024];
  snprintf(config, sizeof config, "%s", adam_config("Adam", 0, ""));
  if (!CHECK_OK(make_run(&r, config, comm, 0, NUM_PARAMS))) return;
  int64_t s = -1;
  CHECK_OK(dsopt_get_param_step(r.opt, 2, &s));
  CHECK(s == 0);
  CHECK_OK(dsopt_set_param_step(r.opt, 2, 41));
  CHECK_OK(dsopt_get_param_step(r.opt, 2, &s));
  CHECK(s == 41);
  CHECK_STATUS(dsopt_set_param_step(r.opt, 2, -1), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_param_step(r.opt, NUM_PARAMS, 1), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_get_param_step(r.opt, -1, &s), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_get_param_step(r.opt, 0, NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_param_step(NULL, 0, 1), DSOPT_EINVAL);
  CHECK_OK(dsopt_get_param_step(r.opt, 2, &s));
  CHECK(s == 41);
  free_run(&r);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  for (int i = 0; i < NUM_PARAMS; ++i) grads_of_step[i] = (float *)malloc((size_t)numels[i] * 4);
  dsopt_comm *comm = world_comm();
  if (CHECK(comm != NULL)) {
    for (int stage = 0; stage <= 2; ++stage) {
      test_adam_per_parameter(comm, "AdamW", stage, 0);
      test_adam_per_parameter(comm, "AdamW", stage, 1);
    }
    test_adam_per_parameter(comm, "Adam", 0, 0);
    test_blob_keeps_param_steps(comm);
    test_onebit_absent_is_zero(comm, "OneBitAdam", ", \"freeze_step\": 3");
    test_onebit_absent_is_zero(comm, "OneBitLamb", ", \"freeze_step\": 3");
    test_onebit_absent_is_zero(comm, "ZeroOneAdam", ", \"var_freeze_step\": 6");
    test_param_step_calls(comm);
  }
  dsopt_comm_destroy(comm);
  for (int i = 0; i < NUM_PARAMS; ++i) free(grads_of_step[i]);
  const int rc = check_finish();
  MPI_Finalize();
  return rc;
}

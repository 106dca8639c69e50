/* dsopt_rebind_params on one rank: a run whose parameters move to new
 * buffers (values copied, old buffers freed, then rebound) before the first
 * step and twice mid-run is bit-identical, parameters and state blob, to a
 * run that never moved, for every optimizer (AdamW and Adam with fp32, fp16
 * and bf16 parameters and fp16 loss scaling, ZeRO stage 2, the 1-bit
 * optimizers through their compression stage), also with gradients handed
 * over. Every bad argument is rejected, naming what is wrong, and changes
 * nothing: the old buffers are still the ones updated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/local_run.h"

#define STEPS 8
#define NUM_TENSORS 4

static const tensor_spec fp32_specs[NUM_TENSORS] = {
    {300, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {17, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {64, DSOPT_FLOAT32, DSOPT_FLOAT16, 0},
    {5, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
};
static const tensor_spec mixed_specs[NUM_TENSORS] = {
    {300, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {17, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {64, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0},
    {5, DSOPT_BFLOAT16, DSOPT_FLOAT32, 1},
};

#define GROUPS " \"param_groups\": [{}, {\"lr\": 0.004, \"weight_decay\": 0.02}], \"threads\": 1"

typedef struct case_t {
  const char *name;
  const char *config;
  const tensor_spec *specs;
} case_t;

static const case_t cases[] = {
    {"AdamW fp32", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS "}", fp32_specs},
    {"AdamW fp16/bf16", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS "}",
     mixed_specs},
    {"Adam fp16/bf16 loss scaling",
     "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}," GROUPS
     ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 3}}",
     mixed_specs},
    {"ZeRO-2 fp32", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
                    ", \"zero_optimization\": {\"stage\": 2}}",
     fp32_specs},
    {"ZeRO-2 fp16/bf16", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
                         ", \"zero_optimization\": {\"stage\": 2}}",
     mixed_specs},
    {"1-bit Adam", "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," GROUPS "}",
     mixed_specs},
    {"1-bit LAMB", "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," GROUPS "}",
     mixed_specs},
    {"0/1 Adam", "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 3,"
                 " \"var_update_scaler\": 1, \"local_step_scaler\": 1}}," GROUPS "}",
     fp32_specs},
};

/* The same gradients for both runs: new random ones per step from `seed`. */
static void gradients_for_step(model *m, uint64_t seed, int k) {
  rng r = rng_for(seed, 0, (uint64_t)k);
  model_random_grads(m, &r, 1.0, 1.0);
}

static int step(local_run *r, int handed_over) {
  if (!handed_over) return local_run_step(r);
  for (int i = r->m.count - 1; i >= 0; --i) {
    int status = dsopt_grad_ready(r->opt, i, &r->m.grads[i]);
    if (status != DSOPT_OK) return status;
  }
  memset(&r->info, 0, sizeof r->info);
  r->info.struct_size = sizeof r->info;
  return dsopt_step(r->opt, NULL, 0, &r->info);
}

/* Moves before step `k` when moves[k] is set. */
static void run_case(const case_t *c, int handed_over) {
  const int moves[STEPS + 1] = {[1] = 1, [3] = 1, [6] = 1};
  local_run still, moved;
  int ok = CHECK_OK(local_run_open(&still, c->config, c->specs, NUM_TENSORS, 41));
  ok = CHECK_OK(local_run_open(&moved, c->config, c->specs, NUM_TENSORS, 41)) && ok;
  for (int k = 1; ok && k <= STEPS; ++k) {
    if (moves[k]) {
      model_move_params(&moved.m);
      if (!CHECKF(dsopt_rebind_params(moved.opt, moved.m.params, NUM_TENSORS) == DSOPT_OK,
                  "%s: rebind before step %d", c->name, k))
        break;
    }
    gradients_for_step(&still.m, 42, k);
    gradients_for_step(&moved.m, 42, k);
    ok = CHECK_OK(step(&still, handed_over)) && CHECK_OK(step(&moved, handed_over));
    ok = ok && CHECKF(model_params_identical(&still.m, &moved.m),
                      "%s%s step %d: parameters bit-identical to the run that never moved", c->name,
                      handed_over ? " (handed over)" : "", k);
    CHECK_EQ_INT(moved.info.phase, still.info.phase);
  }
  uint64_t a_size, b_size;
  unsigned char *a = state_blob(still.opt, &a_size), *b = state_blob(moved.opt, &b_size);
  CHECKF(same_bytes(a, a_size, b, b_size), "%s: state blobs identical", c->name);
  free(a);
  free(b);
  local_run_close(&still);
  local_run_close(&moved);
}

static void moved_runs_are_bit_identical(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    run_case(&cases[i], 0);
    run_case(&cases[i], 1);
  }
}

/* ---- bad arguments ---------------------------------------------------------- */

/* Each rejected rebind leaves the optimizer on the old buffers: the next
 * step updates them exactly as a run without the attempts, and the new
 * buffers stay untouched. */
static void bad_rebinds_change_nothing(void) {
  const case_t *c = &cases[1]; /* fp16/bf16 masters and fp32 parameters */
  local_run ref, r;
  int ok = CHECK_OK(local_run_open(&ref, c->config, c->specs, NUM_TENSORS, 7));
  if (!(CHECK_OK(local_run_open(&r, c->config, c->specs, NUM_TENSORS, 7)) && ok)) {
    local_run_close(&ref);
    local_run_close(&r);
    return;
  }
  model other;
  model_init(&other, c->specs, NUM_TENSORS, 8); /* the would-be new buffers */
  uint64_t other_size;
  unsigned char *other_before = model_snapshot(&other, &other_size);
  dsopt_tensor t[NUM_TENSORS + 1];

  CHECK_STATUS(dsopt_rebind_params(NULL, other.params, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_rebind_params(r.opt, NULL, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params");
  CHECK_STATUS(dsopt_rebind_params(r.opt, other.params, NUM_TENSORS - 1), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("num_params");
  memcpy(t, other.params, sizeof other.params[0] * NUM_TENSORS);
  t[NUM_TENSORS] = t[0];
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS + 1), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, 0), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, -1), DSOPT_EINVAL);
  /* one bad descriptor, the last: the good ones before it are not applied */
  t[3].data = NULL;
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params[3]");
  t[3] = other.params[3];
  t[3].numel += 1;
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params[3]");
  CHECK_ERROR_MENTIONS("numel");
  t[3] = other.params[3];
  t[3].dtype = DSOPT_FLOAT16; /* bf16 at create */
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("bfloat16");
  t[3].dtype = 7;
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  t[3] = other.params[3];
  t[3].group = 0;
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("group");
  t[3].group = 2; /* out of range */
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  /* shared storage: params[2] moved onto params[1]'s new buffer */
  memcpy(t, other.params, sizeof other.params[0] * NUM_TENSORS);
  t[2].data = t[1].data;
  CHECK_STATUS(dsopt_rebind_params(r.opt, t, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params[1] and params[2]");

  /* while gradients are handed over */
  gradients_for_step(&ref.m, 9, 1);
  gradients_for_step(&r.m, 9, 1);
  CHECK_OK(dsopt_grad_ready(r.opt, 0, &r.m.grads[0]));
  CHECK_STATUS(dsopt_rebind_params(r.opt, other.params, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("handed over");
  for (int i = 1; i < NUM_TENSORS; ++i) CHECK_OK(dsopt_grad_ready(r.opt, i, &r.m.grads[i]));
  CHECK_OK(dsopt_step(r.opt, NULL, 0, NULL));
  CHECK_OK(dsopt_step(ref.opt, ref.m.grads, NUM_TENSORS, NULL));

  for (int k = 2; k <= 3; ++k) {
    gradients_for_step(&ref.m, 9, k);
    gradients_for_step(&r.m, 9, k);
    CHECK_OK(dsopt_step(ref.opt, ref.m.grads, NUM_TENSORS, NULL));
    CHECK_OK(dsopt_step(r.opt, r.m.grads, NUM_TENSORS, NULL));
  }
  CHECK(model_params_identical(&ref.m, &r.m));
  CHECK(model_matches_snapshot(&other, other_before, other_size));
  free(other_before);
  model_free(&other);
  local_run_close(&ref);
  local_run_close(&r);
}

int main(void) {
  RUN_TEST(moved_runs_are_bit_identical);
  RUN_TEST(bad_rebinds_change_nothing);
  return check_finish();
}

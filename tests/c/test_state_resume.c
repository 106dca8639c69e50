/* Save, create a fresh optimizer with the same config, load, continue: the
 * run is bit-identical to one that never stopped (parameters after every
 * step, step info, and the final state blob), with fp16/bf16 parameters
 * (masters in the blob), two groups, learning-rate changes and dynamic loss
 * scaling with overflows on the way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"

#define TOTAL_STEPS 30
#define NUM_TENSORS 4

static const tensor_spec specs[NUM_TENSORS] = {
    {33, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {1000, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
    {7, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
    {4099, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
};

static const char config[] =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
    " \"param_groups\": [{\"betas\": [0.8, 0.99]}, {\"lr\": 0.003, \"eps\": 1e-4}],"
    " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 5, \"loss_scale_window\": 3, \"hysteresis\": 2},"
    " \"gradient_clipping\": 5.0}";

/* The learning-rate schedule, applied before step k: a resumed run sees
 * only the changes after its resume point, the rest comes with the blob. */
static void schedule_for_step(dsopt_optimizer *opt, int k) {
  if (k == 3) CHECK_OK(dsopt_set_group_lr(opt, 1, 0.006));
  if (k == 15) CHECK_OK(dsopt_set_lr(opt, 0.004));
}

/* Step k's gradients, produced with the optimizer's current loss scale; a
 * few steps overflow. The same for every run. */
static void gradients_for_step(model *m, const dsopt_optimizer *opt, int k) {
  double scale = 0.0;
  dsopt_get_loss_scale(opt, &scale);
  rng r = rng_for(501, 0, (uint64_t)k);
  model_random_grads(m, &r, 1.0, scale);
  if (k % 9 == 4 || k % 13 == 11) model_set_grad(m, k % NUM_TENSORS, 3, k % 2 ? INFINITY : NAN);
}

/* What the uninterrupted run left after each step. */
typedef struct recording {
  unsigned char *params[TOTAL_STEPS + 1]; /* [k]: after step k; [0]: initial */
  uint64_t params_size;
  unsigned char *blob[TOTAL_STEPS + 1];
  uint64_t blob_size[TOTAL_STEPS + 1];
  dsopt_step_info info[TOTAL_STEPS + 1];
} recording;

static void check_state_size_matches_written(const dsopt_optimizer *opt, uint64_t written, int k) {
  uint64_t size = 0;
  CHECK_OK(dsopt_state_size(opt, &size));
  CHECKF(size == written, "after step %d: dsopt_state_size %llu, out_written %llu", k, (unsigned long long)size,
         (unsigned long long)written);
}

static int record_uninterrupted_run(recording *rec) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  int ok = 1;
  memset(rec, 0, sizeof *rec);
  model_init(&m, specs, NUM_TENSORS, 502);
  dsopt_comm_create_local(&comm);
  if (!CHECK_OK(dsopt_create(&opt, config, comm, m.params, NUM_TENSORS))) ok = 0;
  for (int k = 0; ok && k <= TOTAL_STEPS; ++k) {
    if (k > 0) {
      schedule_for_step(opt, k);
      gradients_for_step(&m, opt, k);
      rec->info[k].struct_size = sizeof rec->info[k];
      ok = CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &rec->info[k]));
    }
    rec->params[k] = model_snapshot(&m, &rec->params_size);
    rec->blob[k] = state_blob(opt, &rec->blob_size[k]);
    ok = ok && CHECK(rec->blob[k] != NULL);
    if (ok) check_state_size_matches_written(opt, rec->blob_size[k], k);
  }
  int skipped = 0;
  for (int k = 1; k <= TOTAL_STEPS; ++k) skipped += rec->info[k].skipped;
  CHECKF(skipped >= 3, "the recorded run has overflow steps (%d)", skipped);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
  return ok;
}

static void free_recording(recording *rec) {
  for (int k = 0; k <= TOTAL_STEPS; ++k) {
    free(rec->params[k]);
    free(rec->blob[k]);
  }
}

/* Puts the recorded fp32 parameters of step k into the model (the caller
 * owns fp32 parameters; dsopt restores only the 16-bit ones). */
static void restore_fp32_params(model *m, const unsigned char *snapshot) {
  uint64_t at = 0;
  for (int i = 0; i < m->count; ++i) {
    size_t bytes = (size_t)m->spec[i].numel * (m->spec[i].param_dtype == DSOPT_FLOAT32 ? 4 : 2);
    if (m->spec[i].param_dtype == DSOPT_FLOAT32) memcpy(m->params[i].data, snapshot + at, bytes);
    at += bytes;
  }
}

static void check_resume_at(const recording *rec, int k) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  /* Other parameter values than the recorded run's: the 16-bit ones must be
   * written back by the load. */
  model_init(&m, specs, NUM_TENSORS, 503);
  dsopt_comm_create_local(&comm);
  if (CHECK_OK(dsopt_create(&opt, config, comm, m.params, NUM_TENSORS))) {
    restore_fp32_params(&m, rec->params[k]);
    CHECK_OK(dsopt_state_load(opt, rec->blob[k], rec->blob_size[k]));
    CHECKF(model_matches_snapshot(&m, rec->params[k], rec->params_size),
           "resume at %d: parameters after the load equal the saved run's", k);
    uint64_t size;
    unsigned char *again = state_blob(opt, &size);
    CHECKF(same_bytes(again, size, rec->blob[k], rec->blob_size[k]), "resume at %d: saving right after loading gives the same blob", k);
    free(again);

    for (int step = k + 1; step <= TOTAL_STEPS; ++step) {
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      schedule_for_step(opt, step);
      gradients_for_step(&m, opt, step);
      if (!CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info))) break;
      const dsopt_step_info *want = &rec->info[step];
      /* grad_norm compared by its bits: it is NaN on overflow steps. */
      CHECKF(info.skipped == want->skipped && info.step == want->step && info.loss_scale == want->loss_scale &&
                 memcmp(&info.grad_norm, &want->grad_norm, sizeof info.grad_norm) == 0,
             "resume at %d, step %d: info (skipped %d, step %lld, scale %g, norm %.17g) equals the uninterrupted "
             "run's (%d, %lld, %g, %.17g)",
             k, step, info.skipped, (long long)info.step, info.loss_scale, info.grad_norm, want->skipped,
             (long long)want->step, want->loss_scale, want->grad_norm);
      if (!CHECKF(model_matches_snapshot(&m, rec->params[step], rec->params_size),
                  "resume at %d, step %d: parameters bit-identical to the uninterrupted run", k, step))
        break;
    }
    unsigned char *final_blob = state_blob(opt, &size);
    CHECKF(same_bytes(final_blob, size, rec->blob[TOTAL_STEPS], rec->blob_size[TOTAL_STEPS]),
           "resume at %d: final state blob bit-identical to the uninterrupted run", k);
    free(final_blob);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static recording rec;

static void resumed_run_is_bit_identical_to_uninterrupted_run(void) {
  /* 5: between an overflow and the next refill of the hysteresis. */
  const int resume_points[] = {0, 1, 5, 7, 20};
  for (size_t i = 0; i < sizeof resume_points / sizeof resume_points[0]; ++i)
    check_resume_at(&rec, resume_points[i]);
}

/* Loading an earlier blob into the optimizer that went on rewinds it. */
static void loading_rewinds_a_running_optimizer(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, specs, NUM_TENSORS, 502);
  dsopt_comm_create_local(&comm);
  if (CHECK_OK(dsopt_create(&opt, config, comm, m.params, NUM_TENSORS))) {
    for (int step = 1; step <= 10; ++step) {
      schedule_for_step(opt, step);
      gradients_for_step(&m, opt, step);
      CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
    }
    restore_fp32_params(&m, rec.params[7]);
    CHECK_OK(dsopt_state_load(opt, rec.blob[7], rec.blob_size[7]));
    CHECK(model_matches_snapshot(&m, rec.params[7], rec.params_size));
    for (int step = 8; step <= 12; ++step) {
      schedule_for_step(opt, step);
      gradients_for_step(&m, opt, step);
      CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
    }
    CHECK(model_matches_snapshot(&m, rec.params[12], rec.params_size));
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

int main(void) {
  check_current_test = "record_uninterrupted_run";
  if (record_uninterrupted_run(&rec)) {
    RUN_TEST(resumed_run_is_bit_identical_to_uninterrupted_run);
    RUN_TEST(loading_rewinds_a_running_optimizer);
  }
  free_recording(&rec);
  return check_finish();
}

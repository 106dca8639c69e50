/* Every rank saves its blob, fresh optimizers on the same communicator load
 * them, and the continued run is bit-identical to one that never stopped,
 * on every rank (fp16 parameters, dynamic loss scaling, an overflow on one
 * rank on the way). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define TOTAL_STEPS 16
#define RESUME_AT 5 /* after the first overflow, before the hysteresis refills */
#define NUM_TENSORS 3

static const tensor_spec specs[NUM_TENSORS] = {
    {1000, DSOPT_FLOAT32, DSOPT_FLOAT16, 0},
    {33, DSOPT_FLOAT16, DSOPT_FLOAT16, 1},
    {7, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
};

static const char config[] =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
    " \"param_groups\": [{}, {\"lr\": 0.003}], \"threads\": 1,"
    " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 4, \"loss_scale_window\": 2}}";

/* This rank's gradients of step k; at steps 4, 6 and 10 one rank
 * overflows (4 and 6 around the resume point: the second overflow halves the
 * scale only if the saved hysteresis came back). */
static void gradients_for_step(model *m, const dsopt_optimizer *opt, int k) {
  double scale = 0.0;
  dsopt_get_loss_scale(opt, &scale);
  rng r = rng_for(801, (uint64_t)world_rank(), (uint64_t)k);
  model_random_grads(m, &r, 1.0, scale);
  if ((k == 4 || k == 6 || k == 10) && world_rank() == (k / 2) % world_size()) model_set_grad(m, 1, 5, INFINITY);
}

static void resumed_run_is_bit_identical_on_every_rank(void) {
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *opt = NULL, *resumed = NULL;
  model m, r;
  model_init(&m, specs, NUM_TENSORS, 802);
  model_init(&r, specs, NUM_TENSORS, 803); /* other values: the load restores them */
  unsigned char *saved_params = NULL, *saved_blob = NULL;
  uint64_t saved_params_size = 0, saved_blob_size = 0;
  unsigned char *params_after[TOTAL_STEPS + 1] = {0};
  uint64_t params_size = 0;
  int64_t steps_after[TOTAL_STEPS + 1] = {0};
  int skipped = 0;

  int ok = CHECK_OK(dsopt_create(&opt, config, comm, m.params, NUM_TENSORS));
  if (all_ranks(ok)) {
    for (int k = 1; k <= TOTAL_STEPS; ++k) {
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      gradients_for_step(&m, opt, k);
      CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
      skipped += info.skipped;
      steps_after[k] = info.step;
      params_after[k] = model_snapshot(&m, &params_size);
      if (k == RESUME_AT) {
        saved_params = model_snapshot(&m, &saved_params_size);
        saved_blob = state_blob(opt, &saved_blob_size);
        CHECK(saved_blob != NULL);
      }
    }
    CHECKF(skipped == 3, "the recorded run skipped the three overflow steps (%d)", skipped);
    uint64_t final_size;
    unsigned char *final_blob = state_blob(opt, &final_size);

    ok = CHECK_OK(dsopt_create(&resumed, config, comm, r.params, NUM_TENSORS));
    if (all_ranks(ok)) {
      /* fp32 parameters are the caller's to restore. */
      memcpy(r.params[0].data, (const unsigned char *)saved_params, (size_t)specs[0].numel * 4);
      CHECK_OK(dsopt_state_load(resumed, saved_blob, saved_blob_size));
      CHECK(model_matches_snapshot(&r, saved_params, saved_params_size));
      for (int k = RESUME_AT + 1; k <= TOTAL_STEPS; ++k) {
        dsopt_step_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        gradients_for_step(&r, resumed, k);
        CHECK_OK(dsopt_step(resumed, r.grads, NUM_TENSORS, &info));
        CHECK_EQ_INT(info.step, steps_after[k]);
        CHECKF(model_matches_snapshot(&r, params_after[k], params_size),
               "step %d: parameters bit-identical to the uninterrupted run", k);
      }
      uint64_t size;
      unsigned char *blob = state_blob(resumed, &size);
      CHECK(same_bytes(blob, size, final_blob, final_size));
      free(blob);
    }
    free(final_blob);
  }
  dsopt_destroy(resumed);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  for (int k = 0; k <= TOTAL_STEPS; ++k) free(params_after[k]);
  free(saved_params);
  free(saved_blob);
  model_free(&m);
  model_free(&r);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(resumed_run_is_bit_identical_on_every_rank);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

/* Data-parallel Adam over MPI: every rank has its own gradients; after each
 * step the parameters are bit-identical on every rank and match a double
 * reference of Adam on the averaged gradient (docs/optimizers/adam.md step 3); a non-finite
 * gradient on one rank skips the step on every rank; a step sends what a
 * ring allreduce of the gradients sends. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/adam_ref.h"
#include "support/mpi_world.h"

#define STEPS 20
#define NUM_TENSORS 5
#define FP32_REL_TOL 1e-5
#define GRAD_STREAM 601

static const tensor_spec specs[NUM_TENSORS] = {
    {1000, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {33, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
    {7, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {4099, DSOPT_BFLOAT16, DSOPT_FLOAT32, 1},
    {1, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},
};

static adam_config two_group_config(void) {
  const hyper base = {0.01, 0.9, 0.999, 1e-8, 0.01};
  const hyper other = {0.003, 0.8, 0.95, 1e-4, 0.1};
  adam_config c = adamw_config(base);
  c.num_groups = 2;
  c.group[0] = base;
  c.group[1] = other;
  c.extra = "\"threads\": 1";
  return c;
}

/* Rank r's gradients of step k, the same wherever they are generated. */
static void rank_gradients(model *m, int rank, int step) {
  rng r = rng_for(GRAD_STREAM, (uint64_t)rank, (uint64_t)step);
  model_random_grads(m, &r, 1.0, 1.0);
}

/* The mean over ranks of every rank's gradients of step k, in double. */
static void averaged_gradients(double **mean, int ranks, int step) {
  for (int i = 0; i < NUM_TENSORS; ++i) memset(mean[i], 0, (size_t)specs[i].numel * sizeof(double));
  double *values = (double *)malloc(4099 * sizeof(double));
  for (int rank = 0; rank < ranks; ++rank) {
    rng r = rng_for(GRAD_STREAM, (uint64_t)rank, (uint64_t)step);
    for (int i = 0; i < NUM_TENSORS; ++i) {
      random_values(values, specs[i].numel, specs[i].grad_dtype, &r, 1.0, 1.0);
      for (int64_t j = 0; j < specs[i].numel; ++j) mean[i][j] += values[j];
    }
  }
  for (int i = 0; i < NUM_TENSORS; ++i)
    for (int64_t j = 0; j < specs[i].numel; ++j) mean[i][j] /= ranks;
  free(values);
}

static int params_same_on_every_rank(const model *m) {
  uint64_t size;
  unsigned char *bytes = model_snapshot(m, &size);
  int same = same_on_every_rank(bytes, size);
  free(bytes);
  return same;
}

static void steps_match_reference_on_averaged_gradient_and_agree_bitwise(void) {
  const int ranks = world_size(), rank = world_rank();
  char json[2048], msg[256];
  adam_config c = two_group_config();
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, specs, NUM_TENSORS, 602); /* same initial parameters on every rank */
  int created = CHECK_OK(dsopt_create(&opt, adam_config_json(&c, json, sizeof json), comm, m.params, NUM_TENSORS));
  if (all_ranks(created)) {
    adam_ref ref;
    adam_ref_init(&ref, &c, &m);
    double *mean[NUM_TENSORS];
    for (int i = 0; i < NUM_TENSORS; ++i) mean[i] = (double *)malloc((size_t)specs[i].numel * sizeof(double));
    for (int step = 1; step <= STEPS; ++step) {
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      rank_gradients(&m, rank, step);
      if (step == 9) { /* learning-rate schedules apply on every rank alike */
        CHECK_OK(dsopt_set_lr(opt, 0.005));
        adam_ref_set_lr(&ref, 0.005);
      }
      CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
      CHECK_EQ_INT(info.skipped, 0);
      CHECK_EQ_INT(info.step, step);
      averaged_gradients(mean, ranks, step);
      adam_ref_step(&ref, mean, 1.0);
      CHECKF(params_same_on_every_rank(&m), "step %d: parameters bit-identical on every rank", step);
      CHECKF(params_match_ref(&m, &ref, FP32_REL_TOL, msg, sizeof msg), "step %d: %s", step, msg);
    }
    for (int i = 0; i < NUM_TENSORS; ++i) free(mean[i]);
    adam_ref_free(&ref);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void nonfinite_gradient_on_one_rank_skips_the_step_everywhere(void) {
  const int ranks = world_size(), rank = world_rank();
  char json[2048];
  adam_config c = two_group_config();
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, specs, NUM_TENSORS, 603);
  int created = CHECK_OK(dsopt_create(&opt, adam_config_json(&c, json, sizeof json), comm, m.params, NUM_TENSORS));
  if (all_ranks(created)) {
    const double bad_values[3] = {NAN, INFINITY, -INFINITY};
    int64_t applied = 0;
    for (int step = 1; step <= 8; ++step) {
      const int bad_step = step % 2 == 0;
      const int bad_rank = (step / 2) % ranks; /* rank 1 first, then the others */
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      rank_gradients(&m, rank, step);
      if (bad_step && rank == bad_rank) model_set_grad(&m, step % NUM_TENSORS, 0, bad_values[step % 3]);
      uint64_t params_size, state_size, after_size;
      unsigned char *params = model_snapshot(&m, &params_size);
      unsigned char *state = state_blob(opt, &state_size);
      CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
      applied += !bad_step;
      CHECKF(info.skipped == bad_step, "step %d (non-finite on rank %d: %s): skipped %d", step, bad_rank,
             bad_step ? "yes" : "no", info.skipped);
      CHECKF(info.step == applied, "step %d: info.step %lld, expected %lld", step, (long long)info.step,
             (long long)applied);
      if (bad_step) {
        unsigned char *after = state_blob(opt, &after_size);
        CHECKF(model_matches_snapshot(&m, params, params_size), "step %d: parameters unchanged", step);
        CHECKF(same_bytes(after, after_size, state, state_size), "step %d: state unchanged", step);
        free(after);
      }
      CHECKF(params_same_on_every_rank(&m), "step %d: parameters bit-identical on every rank", step);
      free(params);
      free(state);
    }
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* fp32 gradients of N elements: a ring allreduce sends 2(P-1)/P * 4N bytes;
 * the non-finite flag and other control traffic add at most 64. */
static void step_sends_ring_allreduce_bytes(void) {
  static const tensor_spec fp32_specs[3] = {
      {1000, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {4096, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {8, DSOPT_FLOAT16, DSOPT_FLOAT32, 0}};
  const int ranks = world_size(), rank = world_rank();
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, fp32_specs, 3, 604);
  const uint64_t numel = (uint64_t)model_numel(&m);
  const uint64_t expected = 2u * (uint64_t)(ranks - 1) * 4u * numel / (uint64_t)ranks;
  int created = CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"AdamW\"}, \"threads\": 1}", comm, m.params, 3));
  if (all_ranks(created)) {
    for (int step = 1; step <= 3; ++step) {
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      rng r = rng_for(605, (uint64_t)rank, (uint64_t)step);
      model_random_grads(&m, &r, 1.0, 1.0);
      CHECK_OK(dsopt_step(opt, m.grads, 3, &info));
      CHECKF(info.bytes_sent >= expected && info.bytes_sent <= expected + 64,
             "step %d on %d ranks: bytes_sent %llu, ring allreduce of %llu fp32 values sends %llu (+64 allowed)", step,
             ranks, (unsigned long long)info.bytes_sent, (unsigned long long)numel, (unsigned long long)expected);
      CHECK_EQ_INT(info.compressed, 0);
    }
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(steps_match_reference_on_averaged_gradient_and_agree_bitwise);
  RUN_TEST(nonfinite_gradient_on_one_rank_skips_the_step_everywhere);
  RUN_TEST(step_sends_ring_allreduce_bytes);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

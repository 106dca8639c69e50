/* dsopt_rebind_params across ranks: each rank moves its parameters to new
 * buffers (values copied, old buffers freed, then rebound) at steps of its
 * own (rebinding is not collective), and the run stays bit-identical on
 * every rank to one that never moved: ZeRO stage 2 (fp32, fp16 and bf16
 * parameters: the shard update and the allgather write the new buffers)
 * and 1-bit Adam through its compressed stage, with gradients passed to
 * dsopt_step and handed over with dsopt_grad_ready. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define STEPS 7
#define NUM_TENSORS 4

static const tensor_spec specs[NUM_TENSORS] = {
    {515, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {128, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
    {9, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
};

#define GROUPS " \"param_groups\": [{}, {\"lr\": 0.004, \"weight_decay\": 0.02}], \"threads\": 1"

typedef struct case_t {
  const char *name;
  const char *config;
} case_t;

static const case_t cases[] = {
    /* small buckets: several reduce-scatters and allgathers per step */
    {"ZeRO-2", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}," GROUPS
               ", \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 200,"
               " \"allgather_bucket_size\": 300}}"},
    {"1-bit Adam", "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," GROUPS
                   "}"},
};

static void gradients_for_step(model *m, int k) {
  rng r = rng_for(61, (uint64_t)world_rank(), (uint64_t)k);
  model_random_grads(m, &r, 1.0, 1.0);
}

static int step(dsopt_optimizer *opt, model *m, int handed_over, dsopt_step_info *info) {
  memset(info, 0, sizeof *info);
  info->struct_size = sizeof *info;
  if (!handed_over) return dsopt_step(opt, m->grads, NUM_TENSORS, info);
  for (int i = NUM_TENSORS - 1; i >= 0; --i) dsopt_grad_ready(opt, i, &m->grads[i]);
  return dsopt_step(opt, NULL, 0, info);
}

/* Rank r moves before steps r % 3 + 1 and r % 3 + 4 (rank 0 also before
 * step 1, when nothing has run yet). */
static int moves_before(int k) {
  const int first = world_rank() % 3 + 1;
  return k == first || k == first + 3 || (world_rank() == 0 && k == 1);
}

static void run_case(const case_t *c, int handed_over) {
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *still = NULL, *moved = NULL;
  model a, b;
  model_init(&a, specs, NUM_TENSORS, 60);
  model_init(&b, specs, NUM_TENSORS, 60);
  int ok = CHECK_OK(dsopt_create(&still, c->config, comm, a.params, NUM_TENSORS));
  ok = CHECK_OK(dsopt_create(&moved, c->config, comm, b.params, NUM_TENSORS)) && ok;
  int compressed = 0;
  if (all_ranks(ok)) {
    for (int k = 1; k <= STEPS; ++k) {
      if (moves_before(k)) {
        model_move_params(&b);
        CHECKF(dsopt_rebind_params(moved, b.params, NUM_TENSORS) == DSOPT_OK, "%s: rebind before step %d",
               c->name, k);
      }
      dsopt_step_info ia, ib;
      gradients_for_step(&a, k);
      gradients_for_step(&b, k);
      CHECK_OK(step(still, &a, handed_over, &ia));
      CHECK_OK(step(moved, &b, handed_over, &ib));
      compressed += ib.compressed;
      CHECKF(model_params_identical(&a, &b), "%s%s step %d: parameters bit-identical to the run that never moved",
             c->name, handed_over ? " (handed over)" : "", k);
    }
    uint64_t size_a, size_b;
    unsigned char *blob_a = state_blob(still, &size_a), *blob_b = state_blob(moved, &size_b);
    CHECKF(same_bytes(blob_a, size_a, blob_b, size_b), "%s: state blobs identical", c->name);
    free(blob_a);
    free(blob_b);
    uint64_t size;
    unsigned char *params = model_snapshot(&b, &size);
    CHECKF(same_on_every_rank(params, size), "%s: parameters identical on every rank", c->name);
    free(params);
    if (strstr(c->name, "1-bit")) CHECKF(compressed == STEPS - 2, "%s: compressed steps (%d)", c->name, compressed);
  }
  dsopt_destroy(still);
  dsopt_destroy(moved);
  dsopt_comm_destroy(comm);
  model_free(&a);
  model_free(&b);
}

static void moved_runs_are_bit_identical_on_every_rank(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    run_case(&cases[i], 0);
    run_case(&cases[i], 1);
  }
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(moved_runs_are_bit_identical_on_every_rank);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

/* dsopt_step_info.grads_replicated: on the first 3 steps, 1 exactly when
 * every rank's local gradients are bit-identical (something else averaged
 * them already) and not all zero; 0 on every later step and at one rank.
 * Gradients passed to dsopt_step and handed over with dsopt_grad_ready (in
 * another order on each rank, two micro-batches) alike; AdamW, ZeRO-2 and
 * 1-bit Adam into its compressed stage. A caller built against the older
 * header (smaller struct_size) never sees the field. Through a custom
 * communicator that counts its calls: the checked steps make one more
 * allreduce (two int64), later steps exactly the collectives of before. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define STEPS 6
#define CHECKED 3
#define NUM_TENSORS 3

static const tensor_spec specs[NUM_TENSORS] = {
    {700, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, /* more than 1 KiB: the samples do not overlap */
    {40, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {3, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},
};

static const char *const configs[] = {
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1}",
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1,"
    " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 300}}",
    "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 2}}, \"threads\": 1}",
};
#define NUM_CONFIGS (sizeof configs / sizeof configs[0])

enum grads_kind { SAME, PER_RANK, ZERO, ONE_RANK_DIFFERS };

/* Step k's gradients: the same on every rank, each rank's own, zeros, or the
 * same except the first element of tensor 0 on the last rank. */
static void gradients_for_step(model *m, enum grads_kind kind, int k) {
  rng r = rng_for(71, kind == PER_RANK ? (uint64_t)world_rank() : 0u, (uint64_t)k);
  model_random_grads(m, &r, kind == ZERO ? 0.0 : 1.0, 1.0);
  if (kind == ONE_RANK_DIFFERS && world_rank() == world_size() - 1)
    model_set_grad(m, 0, 0, m->grad_values[0][0] * 0.5);
}

/* Steps a fresh optimizer STEPS times; replicated[k] gets step k+1's field. */
static void run(dsopt_comm *comm, const char *config, enum grads_kind kind, int handed_over,
                int32_t *replicated) {
  model m;
  model_init(&m, specs, NUM_TENSORS, 70);
  dsopt_optimizer *opt = NULL;
  memset(replicated, 0x55, sizeof(int32_t) * STEPS);
  if (all_ranks(CHECK_OK(dsopt_create(&opt, config, comm, m.params, NUM_TENSORS)))) {
    for (int k = 1; k <= STEPS; ++k) {
      dsopt_step_info info;
      memset(&info, 0x55, sizeof info);
      info.struct_size = sizeof info;
      gradients_for_step(&m, kind, k);
      if (handed_over) {
        /* two micro-batches, in an order of this rank's own */
        for (int mb = 0; mb < 2; ++mb)
          for (int j = 0; j < NUM_TENSORS; ++j) {
            const int i = (j + world_rank() + mb) % NUM_TENSORS;
            CHECK_OK(dsopt_grad_ready(opt, i, &m.grads[i]));
          }
        CHECK_OK(dsopt_step(opt, NULL, 0, &info));
      } else {
        CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
      }
      CHECK_EQ_INT(info.diverging, 0);
      replicated[k - 1] = info.grads_replicated;
    }
  }
  dsopt_destroy(opt);
  model_free(&m);
}

#define ACCUMULATE ", \"gradient_accumulation_steps\": 2}"

/* configs[i] with gradient accumulation over 2 micro-batches. */
static const char *accumulating(const char *config, char *buf, size_t size) {
  snprintf(buf, size, "%.*s%s", (int)strlen(config) - 1, config, ACCUMULATE);
  return buf;
}

static void check_replication_run(const char *config, enum grads_kind kind, int handed_over, int expected_on_checked) {
  dsopt_comm *comm = world_comm();
  char buf[512];
  int32_t replicated[STEPS];
  run(comm, handed_over ? accumulating(config, buf, sizeof buf) : config, kind, handed_over, replicated);
  for (int k = 1; k <= STEPS; ++k) {
    const int expected = k <= CHECKED ? expected_on_checked : 0;
    CHECKF(replicated[k - 1] == expected, "%s, gradients %d%s, step %d: grads_replicated %d, expected %d", config,
           (int)kind, handed_over ? " handed over" : "", k, replicated[k - 1], expected);
  }
  dsopt_comm_destroy(comm);
}

static void identical_gradients_are_reported_on_the_checked_steps(void) {
  for (size_t i = 0; i < NUM_CONFIGS; ++i)
    for (int handed_over = 0; handed_over <= 1; ++handed_over) check_replication_run(configs[i], SAME, handed_over, 1);
}

static void different_or_zero_gradients_are_not(void) {
  for (size_t i = 0; i < NUM_CONFIGS; ++i)
    for (int handed_over = 0; handed_over <= 1; ++handed_over) {
      check_replication_run(configs[i], PER_RANK, handed_over, 0);
      check_replication_run(configs[i], ONE_RANK_DIFFERS, handed_over, 0);
      check_replication_run(configs[i], ZERO, handed_over, 0);
    }
}

static void one_rank_reports_nothing(void) {
  dsopt_comm *local = NULL;
  CHECK_OK(dsopt_comm_create_local(&local));
  int32_t replicated[STEPS];
  run(local, configs[0], SAME, 0, replicated);
  for (int k = 0; k < STEPS; ++k) CHECK_EQ_INT(replicated[k], 0);
  dsopt_comm_destroy(local);
}

/* A caller of the older header: struct_size ends before the field. */
static void an_older_struct_never_sees_the_field(void) {
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NUM_TENSORS, 70);
  dsopt_optimizer *opt = NULL;
  if (all_ranks(CHECK_OK(dsopt_create(&opt, configs[0], comm, m.params, NUM_TENSORS)))) {
    dsopt_step_info info;
    memset(&info, 0x55, sizeof info);
    info.struct_size = (uint32_t)offsetof(dsopt_step_info, grads_replicated);
    gradients_for_step(&m, SAME, 1);
    CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
    CHECK_EQ_INT(info.step, 1);
    CHECK_EQ_INT(info.grads_replicated, 0x55555555);
    CHECK_EQ_INT(info.diverging, 0x55555555);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* ---- a custom communicator over MPI that counts its calls ------------------ */

enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, ALLTOALL, NUM_KINDS };

typedef struct counting {
  MPI_Comm comm;
  long calls[NUM_KINDS];
  long int64_pairs; /* allreduces of 2 int64 maxima (the handshake and the hashes' shape) */
} counting;

static int op_allreduce(const void *send, void *recv, size_t n, int32_t elem, int32_t op, int32_t device,
                        void *user) {
  counting *c = (counting *)user;
  (void)device;
  ++c->calls[ALLREDUCE];
  c->int64_pairs += n == 2 && elem == DSOPT_COMM_INT64 && op == DSOPT_COMM_MAX;
  return MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)n, mpi_type_of(elem),
                       op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, c->comm);
}
static int op_reduce_scatter(const void *send, void *recv, size_t n, int32_t elem, int32_t op, int32_t device,
                             void *user) {
  counting *c = (counting *)user;
  (void)device;
  ++c->calls[REDUCE_SCATTER];
  return MPI_Reduce_scatter_block(send, recv, (int)n, mpi_type_of(elem), op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM,
                                  c->comm);
}
static int op_allgather(const void *send, void *recv, size_t n, int32_t elem, int32_t device, void *user) {
  counting *c = (counting *)user;
  (void)device;
  ++c->calls[ALLGATHER];
  return MPI_Allgather(send, (int)n, mpi_type_of(elem), recv, (int)n, mpi_type_of(elem), c->comm);
}
static int op_alltoall(const void *send, void *recv, size_t n, int32_t elem, int32_t device, void *user) {
  counting *c = (counting *)user;
  (void)device;
  ++c->calls[ALLTOALL];
  return MPI_Alltoall(send, (int)n, mpi_type_of(elem), recv, (int)n, mpi_type_of(elem), c->comm);
}

static void checked_steps_cost_one_allreduce_then_nothing(void) {
  counting c;
  memset(&c, 0, sizeof c);
  MPI_Comm_dup(MPI_COMM_WORLD, &c.comm);
  dsopt_comm_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.rank = world_rank();
  ops.size = world_size();
  ops.allreduce = op_allreduce;
  ops.reduce_scatter = op_reduce_scatter;
  ops.allgather = op_allgather;
  ops.alltoall = op_alltoall;
  dsopt_comm *comm = NULL;
  CHECK_OK(dsopt_comm_create_custom(&comm, &ops, &c));
  for (size_t i = 0; i < NUM_CONFIGS; ++i) {
    model m;
    model_init(&m, specs, NUM_TENSORS, 70);
    dsopt_optimizer *opt = NULL;
    long calls[STEPS + 2][NUM_KINDS], pairs[STEPS + 2];
    if (all_ranks(CHECK_OK(dsopt_create(&opt, configs[i], comm, m.params, NUM_TENSORS)))) {
      /* 1-bit Adam compresses from step 2 on: compare steps of one stage */
      for (int k = 1; k <= STEPS + 1; ++k) {
        dsopt_step_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        gradients_for_step(&m, SAME, k);
        memset(c.calls, 0, sizeof c.calls);
        c.int64_pairs = 0;
        CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, &info));
        memcpy(calls[k], c.calls, sizeof c.calls);
        pairs[k] = c.int64_pairs;
        CHECK_EQ_INT(info.grads_replicated, k <= CHECKED);
        /* the handshake, and on the checked steps the hashes */
        CHECKF(pairs[k] == (k <= CHECKED ? 2 : 1), "%s step %d: %ld allreduces of 2 int64 maxima", configs[i], k,
               pairs[k]);
      }
      for (int k = 2; k <= STEPS + 1; ++k) {
        const int checked = k <= CHECKED, stage_ref = checked ? CHECKED + 1 : STEPS + 1;
        for (int kind = 0; kind < NUM_KINDS; ++kind) {
          const long expected = calls[stage_ref][kind] + (kind == ALLREDUCE && checked ? 1 : 0);
          CHECKF(calls[k][kind] == expected, "%s step %d: %ld calls of kind %d, expected %ld", configs[i], k,
                 calls[k][kind], kind, expected);
        }
      }
    }
    dsopt_destroy(opt);
    model_free(&m);
  }
  dsopt_comm_destroy(comm);
  MPI_Comm_free(&c.comm);
}

int main(int argc, char **argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(identical_gradients_are_reported_on_the_checked_steps);
  RUN_TEST(different_or_zero_gradients_are_not);
  RUN_TEST(one_rank_reports_nothing);
  RUN_TEST(an_older_struct_never_sees_the_field);
  RUN_TEST(checked_steps_cost_one_allreduce_then_nothing);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

/* Ranks that disagree fail together instead of hanging: dsopt_create with a
 * different config or different shapes on one rank fails on every rank
 * (DSOPT_EMISMATCH; a rank with a local error returns its own error); a
 * dsopt_step with bad arguments on one rank fails on every rank (that rank
 * DSOPT_EINVAL, the others DSOPT_EMISMATCH naming it), changes nothing, and
 * the next good step works. Also the
 * MPI communicator wrapper's argument checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define NUM_TENSORS 3
#define ODD_RANK 1

static const tensor_spec specs[NUM_TENSORS] = {
    {1000, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {7, DSOPT_FLOAT16, DSOPT_FLOAT16, 1},
    {33, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
};

#define GROUPS "\"param_groups\": [{}, {\"weight_decay\": 0}], \"threads\": 1"
static const char good_config[] =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, " GROUPS "}";

/* ---- dsopt_create ---------------------------------------------------------- */

/* Rank ODD_RANK creates with (config_odd, specs_odd, count_odd), the others
 * with the good config and specs. */
static void check_create_fails_everywhere(const char *config_odd, const tensor_spec *specs_odd, int count_odd,
                                          int expected_on_odd_rank, const char *what) {
  const int rank = world_rank();
  const int odd = rank == ODD_RANK;
  dsopt_comm *comm = world_comm();
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, odd ? specs_odd : specs, odd ? count_odd : NUM_TENSORS, 701);
  uint64_t before_size;
  unsigned char *before = model_snapshot(&m, &before_size);
  int status = dsopt_create(&opt, odd ? config_odd : good_config, comm, m.params, m.count);
  int expected = odd ? expected_on_odd_rank : DSOPT_EMISMATCH;
  CHECKF(status == expected, "%s: dsopt_create returned %d (%s), expected %d (%s)", what, status,
         dsopt_status_string(status), expected, dsopt_status_string(expected));
  if (!odd) CHECK_ERROR_MENTIONS("rank|disagree|differ|mismatch");
  CHECKF(model_matches_snapshot(&m, before, before_size), "%s: parameters unchanged", what);
  if (status == DSOPT_OK) dsopt_destroy(opt);
  free(before);
  model_free(&m);
  dsopt_comm_destroy(comm);
}

static void create_fails_on_every_rank_when_config_differs(void) {
  check_create_fails_everywhere(
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.02, \"weight_decay\": 0.01}}, " GROUPS "}", specs,
      NUM_TENSORS, DSOPT_EMISMATCH, "lr differs on one rank");
  check_create_fails_everywhere(
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, " GROUPS
      ", \"fp16\": {\"enabled\": true}}",
      specs, NUM_TENSORS, DSOPT_EMISMATCH, "fp16 on one rank only");
  check_create_fails_everywhere(
      "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01, \"adam_w_mode\": "
      "false}}, " GROUPS "}",
      specs, NUM_TENSORS, DSOPT_EMISMATCH, "L2 on one rank, AdamW on the others");
}

static void create_fails_on_every_rank_when_shapes_differ(void) {
  tensor_spec other[NUM_TENSORS];
  memcpy(other, specs, sizeof other);
  other[0].numel = 1001;
  check_create_fails_everywhere(good_config, other, NUM_TENSORS, DSOPT_EMISMATCH, "numel differs on one rank");
  check_create_fails_everywhere(good_config, specs, NUM_TENSORS - 1, DSOPT_EMISMATCH,
                                "tensor count differs on one rank");
  memcpy(other, specs, sizeof other);
  other[1].param_dtype = DSOPT_FLOAT32;
  check_create_fails_everywhere(good_config, other, NUM_TENSORS, DSOPT_EMISMATCH, "dtype differs on one rank");
  memcpy(other, specs, sizeof other);
  other[2].group = 1;
  check_create_fails_everywhere(good_config, other, NUM_TENSORS, DSOPT_EMISMATCH, "group differs on one rank");
}

static void create_with_a_local_error_on_one_rank_fails_everywhere(void) {
  check_create_fails_everywhere("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"freze_step\": 1}}, " GROUPS "}",
                                specs, NUM_TENSORS, DSOPT_EINVAL, "unknown key on one rank");
  check_create_fails_everywhere("{\"optimizer\": {\"type\": \"AdamW\"", specs, NUM_TENSORS, DSOPT_EINVAL,
                                "invalid JSON on one rank");
  tensor_spec other[NUM_TENSORS];
  memcpy(other, specs, sizeof other);
  other[1].numel = 0;
  check_create_fails_everywhere(good_config, other, NUM_TENSORS, DSOPT_EINVAL, "numel 0 on one rank");
}

/* ---- dsopt_step -------------------------------------------------------------- */

/* `a` gets the bad calls, `b` never does; same config, parameters and
 * gradients on each rank. */
typedef struct twin {
  dsopt_comm *comm;
  model model_a, model_b;
  dsopt_optimizer *a, *b;
  int step;
} twin;

static void twin_gradients(twin *t) {
  rng r = rng_for(702, (uint64_t)world_rank(), (uint64_t)++t->step);
  model_random_grads(&t->model_a, &r, 1.0, 1.0);
}

static int twin_open(twin *t) {
  memset(t, 0, sizeof *t);
  t->comm = world_comm();
  model_init(&t->model_a, specs, NUM_TENSORS, 703);
  model_init(&t->model_b, specs, NUM_TENSORS, 703);
  int ok = CHECK_OK(dsopt_create(&t->a, good_config, t->comm, t->model_a.params, NUM_TENSORS));
  ok &= CHECK_OK(dsopt_create(&t->b, good_config, t->comm, t->model_b.params, NUM_TENSORS));
  if (!all_ranks(ok)) return 0;
  twin_gradients(t);
  CHECK_OK(dsopt_step(t->a, t->model_a.grads, NUM_TENSORS, NULL));
  CHECK_OK(dsopt_step(t->b, t->model_a.grads, NUM_TENSORS, NULL));
  return 1;
}

static void twin_close(twin *t) {
  dsopt_destroy(t->a);
  dsopt_destroy(t->b);
  dsopt_comm_destroy(t->comm);
  model_free(&t->model_a);
  model_free(&t->model_b);
}

/* One rank's side of a step that fails on every rank: `is_bad` on the rank
 * that causes it. Returns dsopt_step's status. */
typedef int (*failing_step)(twin *t, int is_bad, const void *arg);

/* Every rank makes `call` on `a` (rank `bad_rank` the bad side): rank
 * `bad_rank` returns DSOPT_EINVAL with `words_on_bad_rank` in its message,
 * the others DSOPT_EMISMATCH naming it (as for dsopt_create and the loads),
 * and no rank's parameters or state change. */
static void check_fails_everywhere(twin *t, int bad_rank, failing_step call, const void *arg,
                                   const char *words_on_bad_rank, const char *what) {
  const int rank = world_rank();
  twin_gradients(t);
  uint64_t params_size, state_size, after_size;
  unsigned char *params = model_snapshot(&t->model_a, &params_size);
  unsigned char *state = state_blob(t->a, &state_size);
  int status = call(t, rank == bad_rank, arg);
  const int expected = rank == bad_rank ? DSOPT_EINVAL : DSOPT_EMISMATCH;
  CHECKF(status == expected, "%s: status %d (%s), expected %s", what, status,
         dsopt_status_string(status), dsopt_status_string(expected));
  if (rank == bad_rank) {
    CHECK_ERROR_MENTIONS(words_on_bad_rank);
  } else {
    char rank_name[32];
    snprintf(rank_name, sizeof rank_name, "rank %d", bad_rank);
    CHECK_ERROR_MENTIONS(rank_name);
  }
  unsigned char *after = state_blob(t->a, &after_size);
  CHECKF(model_matches_snapshot(&t->model_a, params, params_size), "%s: parameters unchanged", what);
  CHECKF(same_bytes(after, after_size, state, state_size), "%s: state unchanged", what);
  free(params);
  free(state);
  free(after);
}

typedef struct bad_grads {
  const dsopt_tensor *grads;
  int64_t count;
} bad_grads;

static int step_with(twin *t, int is_bad, const void *arg) {
  const bad_grads *bad = arg;
  dsopt_step_info info;
  info.struct_size = sizeof info;
  return is_bad ? dsopt_step(t->a, bad->grads, bad->count, &info)
                : dsopt_step(t->a, t->model_a.grads, NUM_TENSORS, &info);
}

/* Every rank calls dsopt_step on `a`; rank `bad_rank` passes `bad` (count
 * `bad_count`), the others the good gradients. */
static void check_step_fails_everywhere(twin *t, int bad_rank, const dsopt_tensor *bad, int64_t bad_count,
                                        const char *words_on_bad_rank, const char *what) {
  const bad_grads arg = {bad, bad_count};
  check_fails_everywhere(t, bad_rank, step_with, &arg, words_on_bad_rank, what);

  /* The next good step works and matches the twin that never failed. */
  CHECK_OK(dsopt_step(t->a, t->model_a.grads, NUM_TENSORS, NULL));
  CHECK_OK(dsopt_step(t->b, t->model_a.grads, NUM_TENSORS, NULL));
  CHECKF(model_params_identical(&t->model_a, &t->model_b), "%s: the next step equals the twin's", what);
}

static void step_with_bad_arguments_on_one_rank_fails_everywhere(void) {
  twin t;
  const int last = world_size() - 1;
  if (twin_open(&t)) {
    dsopt_tensor bad[NUM_TENSORS];
    check_step_fails_everywhere(&t, ODD_RANK, t.model_a.grads, NUM_TENSORS - 1, "num_grads|grads|gradients",
                                "one gradient missing on rank 1");
    memcpy(bad, t.model_a.grads, sizeof bad);
    bad[2].numel = 34;
    check_step_fails_everywhere(&t, last, bad, NUM_TENSORS, "numel", "gradient numel wrong on the last rank");
    memcpy(bad, t.model_a.grads, sizeof bad);
    bad[0].dtype = 7;
    check_step_fails_everywhere(&t, 0, bad, NUM_TENSORS, "dtype", "gradient dtype 7 on rank 0");
    check_step_fails_everywhere(&t, ODD_RANK, NULL, NUM_TENSORS, "grads|gradients|null", "NULL gradients on rank 1");
  }
  twin_close(&t);
}

/* A rank that cannot use its gradients after handing some over abandons the
 * step (dsopt_step(opt, NULL, -1)); the others complete theirs as usual
 * (dsopt_step(opt, NULL, 0)): the abandoning rank returns DSOPT_EINVAL and
 * the others DSOPT_EMISMATCH once the reductions already started have
 * completed, nothing changes, and the next handed-over step equals the
 * twin's. `handed` gradients are handed over by
 * the abandoning rank first (0: none, after a handed-over step). */
static int abandon_after_handing_over(twin *t, int is_bad, const void *arg) {
  const int count = is_bad ? *(const int *)arg : NUM_TENSORS;
  for (int i = 0; i < count; ++i) CHECK_OK(dsopt_grad_ready(t->a, i, &t->model_a.grads[i]));
  return dsopt_step(t->a, NULL, is_bad ? -1 : 0, NULL);
}

static void check_abandoned_step(twin *t, int bad_rank, int handed, const char *what) {
  check_fails_everywhere(t, bad_rank, abandon_after_handing_over, &handed, "abandoned", what);
  for (int i = 0; i < NUM_TENSORS; ++i) {
    CHECK_OK(dsopt_grad_ready(t->a, i, &t->model_a.grads[i]));
    CHECK_OK(dsopt_grad_ready(t->b, i, &t->model_a.grads[i]));
  }
  CHECK_OK(dsopt_step(t->a, NULL, 0, NULL));
  CHECK_OK(dsopt_step(t->b, NULL, 0, NULL));
  CHECKF(model_params_identical(&t->model_a, &t->model_b), "%s: the next step equals the twin's", what);
}

static void abandoned_handed_over_step_fails_everywhere(void) {
  twin t;
  if (twin_open(&t)) {
    check_abandoned_step(&t, ODD_RANK, 2, "rank 1 abandons after handing 2 gradients over");
    check_abandoned_step(&t, 0, NUM_TENSORS, "rank 0 abandons after handing every gradient over");
    check_abandoned_step(&t, world_size() - 1, 0, "the last rank abandons without handing anything over");
  }
  twin_close(&t);
}

/* ---- dsopt_comm_create_mpi ----------------------------------------------------- */

static void mpi_comm_rejects_handles_that_are_not_communicators(void) {
  dsopt_comm *comm = NULL;
  CHECK_STATUS(dsopt_comm_create_mpi(&comm, 123456), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("communicator|handle");
  CHECK(comm == NULL);
  CHECK_STATUS(dsopt_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_NULL)), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("communicator|handle|null");
  CHECK_STATUS(dsopt_comm_create_mpi(&comm, -5), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_comm_create_mpi(NULL, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("out|null");
}

static void mpi_comm_has_the_communicators_rank_and_size(void) {
  dsopt_comm *comm = world_comm();
  CHECK(comm != NULL);
  CHECK_EQ_INT(dsopt_comm_rank(comm), world_rank());
  CHECK_EQ_INT(dsopt_comm_size(comm), world_size());
  dsopt_comm_destroy(comm);

  /* A split communicator: ranks in it count from 0. */
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &half);
  int half_rank, half_size;
  MPI_Comm_rank(half, &half_rank);
  MPI_Comm_size(half, &half_size);
  if (CHECK_OK(dsopt_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(half)))) {
    CHECK_EQ_INT(dsopt_comm_rank(comm), half_rank);
    CHECK_EQ_INT(dsopt_comm_size(comm), half_size);
    dsopt_comm_destroy(comm);
  }
  MPI_Comm_free(&half);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(create_fails_on_every_rank_when_config_differs);
  RUN_TEST(create_fails_on_every_rank_when_shapes_differ);
  RUN_TEST(create_with_a_local_error_on_one_rank_fails_everywhere);
  RUN_TEST(step_with_bad_arguments_on_one_rank_fails_everywhere);
  RUN_TEST(abandoned_handed_over_step_fails_everywhere);
  RUN_TEST(mpi_comm_rejects_handles_that_are_not_communicators);
  RUN_TEST(mpi_comm_has_the_communicators_rank_and_size);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

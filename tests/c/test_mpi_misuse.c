/* Ranks that make different collective dsopt calls at the same time fail
 * together instead of blocking: every collective call (dsopt_step,
 * dsopt_state_load, dsopt_state_load_shards) starts with a 16-byte handshake
 * in which the ranks compare which call they are in and how many collective
 * calls the optimizer has made; on any difference every rank returns
 * DSOPT_EMISMATCH before anything else is exchanged, and nothing changes.
 * Cases: one rank steps (say, one step more than the others) while the
 * others load a blob; one rank loads shards while the others load a blob.
 * After each, the ranks agree again (every rank counted the failed call)
 * and a step works. Also: an MPI
 * failure inside dsopt returns DSOPT_ECOMM (checked in
 * tests/internal/test_comm_collectives.cpp) and leaves MPI_COMM_WORLD's
 * error handler as it was. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define NUM_TENSORS 2
#define ODD_RANK 1

static const tensor_spec specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {37, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
};

static const char config[] =
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1}";

typedef struct setup {
  dsopt_comm *comm;
  dsopt_optimizer *opt;
  model m;
  rng r;
  unsigned char *blob;
  uint64_t blob_size;
} setup;

static int open_setup(setup *s) {
  memset(s, 0, sizeof *s);
  s->comm = world_comm();
  model_init(&s->m, specs, NUM_TENSORS, 77);
  s->r = rng_seeded(1000 + (uint64_t)world_rank());
  if (!CHECK_OK(dsopt_create(&s->opt, config, s->comm, s->m.params, s->m.count))) return 0;
  model_random_grads(&s->m, &s->r, 1.0, 1.0);
  CHECK_OK(dsopt_step(s->opt, s->m.grads, NUM_TENSORS, NULL));
  s->blob = state_blob(s->opt, &s->blob_size);
  return s->blob != NULL;
}

static void close_setup(setup *s) {
  dsopt_destroy(s->opt);
  free(s->blob);
  model_free(&s->m);
  dsopt_comm_destroy(s->comm);
}

/* Every rank got DSOPT_EMISMATCH naming the calls, nothing changed, and the
 * next step (on every rank) works. */
static void expect_mismatch_everywhere(setup *s, int status, const char *what) {
  CHECKF(status == DSOPT_EMISMATCH, "%s: returned %d (%s), expected DSOPT_EMISMATCH", what, status,
         dsopt_status_string(status));
  CHECKF(strstr(dsopt_last_error(), "not in the same dsopt call") != NULL &&
             strstr(dsopt_last_error(), "collective call #") != NULL,
         "%s: message \"%s\"", what, dsopt_last_error());
  uint64_t size = 0;
  unsigned char *now = state_blob(s->opt, &size);
  CHECKF(now && same_bytes(now, size, s->blob, s->blob_size), "%s: the state is unchanged", what);
  free(now);
  model_random_grads(&s->m, &s->r, 1.0, 1.0);
  CHECKF(dsopt_step(s->opt, s->m.grads, NUM_TENSORS, NULL) == DSOPT_OK, "%s: the next step works", what);
  free(s->blob);
  s->blob = state_blob(s->opt, &s->blob_size);
  CHECKF(all_ranks(1), "%s: every rank got here", what);
}

static void one_rank_steps_while_the_others_load(void) {
  setup s;
  if (open_setup(&s)) {
    const int odd = world_rank() == ODD_RANK;
    model_random_grads(&s.m, &s.r, 1.0, 1.0);
    uint64_t psize;
    unsigned char *before = model_snapshot(&s.m, &psize);
    const int status = odd ? dsopt_step(s.opt, s.m.grads, NUM_TENSORS, NULL)
                           : dsopt_state_load(s.opt, s.blob, s.blob_size);
    CHECKF(model_matches_snapshot(&s.m, before, psize), "step vs load: parameters unchanged");
    free(before);
    expect_mismatch_everywhere(&s, status, "one rank steps, the others load");
  }
  close_setup(&s);
}

static void one_rank_loads_shards_while_the_others_load(void) {
  setup s;
  if (open_setup(&s)) {
    const int odd = world_rank() == ODD_RANK;
    const void *blobs[1] = {s.blob};
    const uint64_t sizes[1] = {s.blob_size};
    const int status = odd ? dsopt_state_load_shards(s.opt, blobs, sizes, 1)
                           : dsopt_state_load(s.opt, s.blob, s.blob_size);
    expect_mismatch_everywhere(&s, status, "one rank loads shards, the others a blob");
  }
  close_setup(&s);
}

static void mpi_error_handler_of_the_caller_is_untouched(void) {
  MPI_Errhandler before, after;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &before);
  setup s;
  if (open_setup(&s)) {
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &after);
    CHECK(after == before);
    CHECK(after == MPI_ERRORS_ARE_FATAL);
    MPI_Errhandler_free(&after);
  }
  MPI_Errhandler_free(&before);
  close_setup(&s);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(one_rank_steps_while_the_others_load);
  RUN_TEST(one_rank_loads_shards_while_the_others_load);
  RUN_TEST(mpi_error_handler_of_the_caller_is_untouched);
  const int rc = check_finish();
  const int ok = all_ranks(rc == 0);
  MPI_Finalize();
  return ok ? 0 : 1;
}

/* Rank-local state never loads on another rank. Every rank saves its blob
 * at a point where the 1-bit optimizers' compression errors are not zero;
 * then:
 *  - each rank loading the next rank's blob (1-bit Adam, 1-bit LAMB, 0/1
 *    Adam, ZeRO-2) fails with DSOPT_EMISMATCH on every rank, saying what to
 *    load instead, and nothing changes (state blob and parameters); so does
 *    a mix of own and foreign blobs, and dsopt_state_load_shards with one
 *    foreign blob; unknown flags are DSOPT_EINVAL;
 *  - with DSOPT_LOAD_RESET_RANK_LOCAL the 1-bit optimizers load a foreign
 *    blob (or a mix: every rank then resets), report the reset on every
 *    rank, and continue bit-identically to a run that loaded its own blob
 *    with the rank-local sections zeroed, as a load at another world size
 *    leaves them; with the errors kept the run differs; ZeRO still refuses;
 *  - own blobs resume bit-identically (flag or not, nothing reset), and
 *    replicated state (AdamW without ZeRO, 1-bit Adam before compressing)
 *    loads on any rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/blob_sections.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define SAVE_AT 5
#define CONTINUE 4
#define NUM_TENSORS 3

static const tensor_spec specs[NUM_TENSORS] = {
    {300, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {40, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {7, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},
};

typedef struct case_t {
  const char *name;
  const char *config;
  const char *rank_local[3]; /* sections a load at another world size zeroes */
} case_t;

static const case_t onebit = {
    "1-bit Adam", "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}, \"threads\": 1}",
    {"onebit.worker_error", "onebit.server_error", NULL}};
static const case_t lamb = {
    "1-bit LAMB", "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}, \"threads\": 1}",
    {"lamb.worker_error", "lamb.server_error", "lamb.momentum_tail"}};
/* Before var_freeze_step (1-bit gradient steps between full ones), where the
 * momenta are the same on every rank and the errors are the rank-local
 * state that matters. */
static const case_t zoadam = {
    "0/1 Adam", "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 100,"
                " \"var_update_scaler\": 1}}, \"threads\": 1}",
    {"zoadam.worker_error", "zoadam.server_error", NULL}};
static const case_t zero2 = {
    "ZeRO-2", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1,"
              " \"zero_optimization\": {\"stage\": 2}}",
    {NULL, NULL, NULL}};
static const case_t adamw = {
    "AdamW", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1}", {NULL, NULL, NULL}};

static const case_t *const one_bit_family[] = {&onebit, &lamb, &zoadam};

static int next_rank(void) { return (world_rank() + 1) % world_size(); }

/* ---- a run and its blobs ------------------------------------------------- */

typedef struct run {
  dsopt_comm *comm;
  dsopt_optimizer *opt;
  model m;
} run;

static int run_open(run *r, const case_t *c) {
  memset(r, 0, sizeof *r);
  r->comm = world_comm();
  model_init(&r->m, specs, NUM_TENSORS, 90);
  return all_ranks(CHECK_OK(dsopt_create(&r->opt, c->config, r->comm, r->m.params, NUM_TENSORS)));
}

static void run_close(run *r) {
  dsopt_destroy(r->opt);
  dsopt_comm_destroy(r->comm);
  model_free(&r->m);
}

/* Steps from..to with this rank's own gradients; snapshots[k] (when given)
 * gets the parameters after step k. */
static void run_steps(run *r, int from, int to, unsigned char **snapshots) {
  for (int k = from; k <= to; ++k) {
    rng g = rng_for(91, (uint64_t)world_rank(), (uint64_t)k);
    model_random_grads(&r->m, &g, 1.0, 1.0);
    CHECK_OK(dsopt_step(r->opt, r->m.grads, NUM_TENSORS, NULL));
    if (snapshots) {
      uint64_t size;
      snapshots[k] = model_snapshot(&r->m, &size);
    }
  }
}

/* Every rank's blob, on every rank. */
typedef struct blob_set {
  unsigned char *blob[16];
  uint64_t size[16];
} blob_set;

static void gather_blobs(const dsopt_optimizer *opt, blob_set *set) {
  uint64_t size = 0;
  unsigned char *mine = state_blob(opt, &size);
  const int world = world_size();
  uint64_t sizes[16];
  MPI_Allgather(&size, 1, MPI_UINT64_T, sizes, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 0; r < world; ++r) {
    set->size[r] = sizes[r];
    set->blob[r] = (unsigned char *)malloc(sizes[r] ? (size_t)sizes[r] : 1);
    if (r == world_rank()) memcpy(set->blob[r], mine, (size_t)size);
    MPI_Bcast(set->blob[r], (int)sizes[r], MPI_UNSIGNED_CHAR, r, MPI_COMM_WORLD);
  }
  free(mine);
}

static void free_blobs(blob_set *set) {
  for (int r = 0; r < world_size(); ++r) free(set->blob[r]);
}

/* The run of case `c` up to SAVE_AT: every rank's blob and this rank's
 * parameters then, and (when given) the parameters of the uninterrupted
 * run's later steps. */
typedef struct saved {
  blob_set blobs;
  unsigned char *params;
  uint64_t params_size;
  unsigned char *later[SAVE_AT + CONTINUE + 1];
} saved;

static int save_run(const case_t *c, saved *s) {
  memset(s, 0, sizeof *s);
  run r;
  int ok = run_open(&r, c);
  if (ok) {
    run_steps(&r, 1, SAVE_AT, NULL);
    gather_blobs(r.opt, &s->blobs);
    s->params = model_snapshot(&r.m, &s->params_size);
    run_steps(&r, SAVE_AT + 1, SAVE_AT + CONTINUE, s->later);
  }
  run_close(&r);
  return ok;
}

static void free_saved(saved *s) {
  if (s->params) free_blobs(&s->blobs);
  free(s->params);
  for (int k = 0; k <= SAVE_AT + CONTINUE; ++k) free(s->later[k]);
}

/* A fresh optimizer with the saved parameters in the caller's buffers (the
 * fp32 ones are the caller's to restore). */
static int resume_open(run *r, const case_t *c, const saved *s) {
  if (!run_open(r, c)) return 0;
  uint64_t at = 0;
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const size_t bytes = (size_t)specs[i].numel * (specs[i].param_dtype == DSOPT_FLOAT32 ? 4 : 2);
    memcpy(r->m.params[i].data, s->params + at, bytes);
    at += bytes;
  }
  return 1;
}

/* ---- rejected loads ---------------------------------------------------------- */

/* `words`, then `also` (each may be NULL): what the error mentions. */
static void rejected_load_changes_nothing(run *r, const void *blob, uint64_t size, uint32_t flags, int expected,
                                          const char *words, const char *also) {
  uint64_t before_size, params_size;
  unsigned char *before = state_blob(r->opt, &before_size);
  unsigned char *params = model_snapshot(&r->m, &params_size);
  int32_t reset = 7;
  CHECK_STATUS(dsopt_state_load_ex(r->opt, blob, size, flags, &reset), expected);
  if (words) CHECK_ERROR_MENTIONS(words);
  if (also) CHECK_ERROR_MENTIONS(also);
  CHECK_EQ_INT(reset, 0);
  uint64_t after_size;
  unsigned char *after = state_blob(r->opt, &after_size);
  CHECK(same_bytes(before, before_size, after, after_size));
  CHECK(model_matches_snapshot(&r->m, params, params_size));
  free(before);
  free(after);
  free(params);
}

static void foreign_blobs_are_rejected(const case_t *c) {
  saved s;
  run r;
  memset(&r, 0, sizeof r);
  if (save_run(c, &s) && resume_open(&r, c, &s)) {
    const int n = next_rank();
    char saved_by[32];
    snprintf(saved_by, sizeof saved_by, "rank %d", n);
    const int zero = c == &zero2;
    rejected_load_changes_nothing(&r, s.blobs.blob[n], s.blobs.size[n], 0, DSOPT_EMISMATCH, saved_by,
                                  "dsopt_state_load_shards");
    CHECK(dsopt_state_load(r.opt, s.blobs.blob[n], s.blobs.size[n]) == DSOPT_EMISMATCH);
    CHECK_ERROR_MENTIONS(zero ? "cannot be reset" : "DSOPT_LOAD_RESET_RANK_LOCAL");
    /* the flag does not reset a ZeRO shard */
    if (zero) rejected_load_changes_nothing(&r, s.blobs.blob[n], s.blobs.size[n], DSOPT_LOAD_RESET_RANK_LOCAL,
                                            DSOPT_EMISMATCH, "dsopt_state_load_shards", "cannot be reset");
    /* rank 0 loads its own blob, the others the next rank's: all fail */
    const int pick = world_rank() == 0 ? 0 : n;
    rejected_load_changes_nothing(&r, s.blobs.blob[pick], s.blobs.size[pick], 0, DSOPT_EMISMATCH,
                                  world_rank() == 0 ? "another rank" : saved_by, NULL);
    /* unknown flags, on every rank */
    const int me = world_rank();
    rejected_load_changes_nothing(&r, s.blobs.blob[me], s.blobs.size[me], 8u, DSOPT_EINVAL, "flags", NULL);
    rejected_load_changes_nothing(&r, s.blobs.blob[me], s.blobs.size[me], DSOPT_LOAD_RESET_RANK_LOCAL | 4u,
                                  DSOPT_EINVAL, "flags", NULL);
    rejected_load_changes_nothing(&r, s.blobs.blob[me], s.blobs.size[me], DSOPT_LOAD_WITHOUT_RANK_LOCAL | 4u,
                                  DSOPT_EINVAL, "flags", NULL);
    /* dsopt_state_load_shards with one blob of another rank of this size */
    if (!zero) {
      const void *one[1] = {s.blobs.blob[n]};
      CHECK_STATUS(dsopt_state_load_shards(r.opt, one, &s.blobs.size[n], 1), DSOPT_EMISMATCH);
      CHECK_ERROR_MENTIONS(saved_by);
    }
    /* every rank's blob: the own one is used, and the run resumes */
    CHECK_OK(dsopt_state_load_shards(r.opt, (const void *const *)s.blobs.blob, s.blobs.size, world_size()));
    unsigned char *later[SAVE_AT + CONTINUE + 1] = {0};
    run_steps(&r, SAVE_AT + 1, SAVE_AT + CONTINUE, later);
    for (int k = SAVE_AT + 1; k <= SAVE_AT + CONTINUE; ++k) {
      CHECKF(same_bytes(later[k], s.params_size, s.later[k], s.params_size),
             "%s step %d: resumed from every rank's blobs as the uninterrupted run", c->name, k);
      free(later[k]);
    }
  }
  run_close(&r);
  free_saved(&s);
}

static void foreign_rank_local_state_is_rejected(void) {
  for (size_t i = 0; i < 3; ++i) foreign_blobs_are_rejected(one_bit_family[i]);
  foreign_blobs_are_rejected(&zero2);
}

/* ---- the reset -------------------------------------------------------------- */

/* The parameters after each continued step of a run resumed from `blob`
 * (flags as given); *reset gets what the load reported. */
static void resume(const case_t *c, const saved *s, const unsigned char *blob, uint64_t size, uint32_t flags,
                   int32_t *reset, unsigned char **later) {
  run r;
  if (resume_open(&r, c, s)) {
    *reset = -1;
    CHECK_OK(dsopt_state_load_ex(r.opt, blob, size, flags, reset));
    run_steps(&r, SAVE_AT + 1, SAVE_AT + CONTINUE, later);
  }
  run_close(&r);
}

static int same_runs(unsigned char **a, unsigned char **b, uint64_t size) {
  for (int k = SAVE_AT + 1; k <= SAVE_AT + CONTINUE; ++k)
    if (!same_bytes(a[k], size, b[k], size)) return 0;
  return 1;
}

static void free_later(unsigned char **later) {
  for (int k = 0; k <= SAVE_AT + CONTINUE; ++k) {
    free(later[k]);
    later[k] = NULL;
  }
}

static void reset_continues_as_a_reset_run(const case_t *c) {
  saved s;
  if (!save_run(c, &s)) {
    free_saved(&s);
    return;
  }
  const int me = world_rank(), n = next_rank();
  /* the reference: this rank's own blob with its rank-local sections zeroed */
  unsigned char *zeroed = (unsigned char *)malloc((size_t)s.blobs.size[me]);
  memcpy(zeroed, s.blobs.blob[me], (size_t)s.blobs.size[me]);
  int nonzero = 0;
  for (int j = 0; j < 3 && c->rank_local[j]; ++j) {
    uint64_t len = 0;
    uint8_t *bytes = blob_section(zeroed, c->rank_local[j], &len);
    CHECKF(bytes != NULL, "%s: the blob has %s", c->name, c->rank_local[j]);
    for (uint64_t b = 0; bytes && b < len; ++b) nonzero |= bytes[b] != 0;
    if (bytes) memset(bytes, 0, (size_t)len);
  }
  CHECKF(nonzero, "%s: the saved compression errors are not zero", c->name);
  blob_fix_checksum(zeroed, s.blobs.size[me]);

  unsigned char *reference[SAVE_AT + CONTINUE + 1] = {0}, *later[SAVE_AT + CONTINUE + 1] = {0};
  int32_t reset = -1;
  resume(c, &s, zeroed, s.blobs.size[me], 0, &reset, reference);
  CHECK_EQ_INT(reset, 0);

  /* the next rank's blob with the flag */
  resume(c, &s, s.blobs.blob[n], s.blobs.size[n], DSOPT_LOAD_RESET_RANK_LOCAL, &reset, later);
  CHECKF(reset == 1, "%s: foreign blob with the flag: reset reported (%d)", c->name, reset);
  CHECKF(same_runs(later, reference, s.params_size), "%s: reset run as the run with zeroed errors", c->name);
  free_later(later);

  /* rank 0 its own blob, the others the next rank's: every rank resets */
  const int pick = me == 0 ? 0 : n;
  resume(c, &s, s.blobs.blob[pick], s.blobs.size[pick], DSOPT_LOAD_RESET_RANK_LOCAL, &reset, later);
  CHECKF(reset == 1, "%s: mixed blobs with the flag: reset reported on every rank (%d)", c->name, reset);
  CHECKF(same_runs(later, reference, s.params_size), "%s: mixed reset run as the run with zeroed errors", c->name);
  free_later(later);

  /* own blobs: nothing reset, bit-identical resume; the errors mattered */
  resume(c, &s, s.blobs.blob[me], s.blobs.size[me], DSOPT_LOAD_RESET_RANK_LOCAL, &reset, later);
  CHECKF(reset == 0, "%s: own blob with the flag: nothing reset (%d)", c->name, reset);
  CHECKF(same_runs(later, s.later, s.params_size), "%s: own blob resumes as the uninterrupted run", c->name);
  CHECKF(!same_runs(later, reference, s.params_size), "%s: keeping the errors differs from resetting them", c->name);
  free_later(later);
  free_later(reference);
  free(zeroed);
  free_saved(&s);
}

static void the_flag_resets_rank_local_state(void) {
  for (size_t i = 0; i < 3; ++i) reset_continues_as_a_reset_run(one_bit_family[i]);
}

/* ---- replicated state ------------------------------------------------------- */

static void replicated_state_loads_on_any_rank(void) {
  saved s;
  if (save_run(&adamw, &s)) {
    unsigned char *later[SAVE_AT + CONTINUE + 1] = {0};
    int32_t reset = -1;
    for (uint32_t flags = 0; flags <= DSOPT_LOAD_RESET_RANK_LOCAL; ++flags) {
      resume(&adamw, &s, s.blobs.blob[next_rank()], s.blobs.size[next_rank()], flags, &reset, later);
      CHECK_EQ_INT(reset, 0);
      CHECKF(same_runs(later, s.later, s.params_size), "AdamW: another rank's blob resumes as the uninterrupted run");
      free_later(later);
    }
  }
  free_saved(&s);
  /* 1-bit Adam saved during its warmup (no errors yet): replicated */
  run r, q;
  if (run_open(&r, &onebit)) {
    run_steps(&r, 1, 1, NULL);
    blob_set blobs;
    gather_blobs(r.opt, &blobs);
    if (run_open(&q, &onebit)) {
      int32_t reset = -1;
      CHECK_OK(dsopt_state_load_ex(q.opt, blobs.blob[next_rank()], blobs.size[next_rank()], 0, &reset));
      CHECK_EQ_INT(reset, 0);
      CHECK_OK(dsopt_state_load(q.opt, blobs.blob[next_rank()], blobs.size[next_rank()]));
    }
    run_close(&q);
    free_blobs(&blobs);
  }
  run_close(&r);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  if (world_size() > 16) return 1;
  RUN_TEST(foreign_rank_local_state_is_rejected);
  RUN_TEST(the_flag_resets_rank_local_state);
  RUN_TEST(replicated_state_loads_on_any_rank);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

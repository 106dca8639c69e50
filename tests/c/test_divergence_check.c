/* dsopt_step_info.diverging (docs/reference/c-api.md "Divergence that stays finite") on
 * synthetic gradient sequences whose global norm follows a chosen course:
 * steady, noisy but healthy, slowly growing (never reported), exploding and
 * spiking (reported within a few steps), climbing faster than the reference
 * follows (reported once 20x above it), for every optimizer (their local
 * norms in compressed stages too), through dsopt_step and dsopt_grad_ready.
 * On every step every rank reports the same, and what support/divergence_ref
 * (the rule of docs/reference/c-api.md fed with info.grad_norm) says. The state travels in
 * the blob: a resumed run continues bit-identically, a blob without the
 * section loads (the check starts over), a damaged one is refused. Config
 * validation, "enabled": false, and callers of the older header. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/blob_sections.h"
#include "support/divergence_ref.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define STEPS 80
#define NUMEL 256
#define ONSET 40 /* the first step of the blow-up in EXPLODING and SPIKES */
#define JUMP_END 60 /* EXPLODING goes back to normal here */

static const tensor_spec specs[1] = {{NUMEL, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}};

enum course { STEADY, NOISY, GROWING, EXPLODING, SPIKES, CLIMBING, NUM_COURSES };
static const char *const course_names[NUM_COURSES] = {"steady", "noisy", "growing", "exploding",
                                                      "spikes", "climbing"};

/* The scale of step k's gradients (k from 1). */
static double course_scale(int course, int k) {
  rng r = rng_for(901, 0, (uint64_t)k);
  switch (course) {
    case NOISY: { /* log-normal, sigma 1: steps differ by e^2 and more */
      const double u1 = rng_unit(&r) + 1e-12, u2 = rng_unit(&r);
      return exp(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    case GROWING: return pow(1.01, k); /* 2.7x per 100 steps: the reference follows */
    case CLIMBING: return k < ONSET ? 1.0 : pow(1.15, k - ONSET); /* faster than it follows */
    case EXPLODING: return k >= ONSET && k < JUMP_END ? 1e3 : 1.0;
    case SPIKES: return k >= ONSET && k % 2 == 0 ? 1e4 : 1.0;
    default: return 1.0;
  }
}

/* This rank's gradient of step k: scale * (a direction every rank shares +
 * this rank's own noise), so the ranks' local gradients differ. */
static void gradient_for_step(model *m, int course, int k) {
  rng shared = rng_for(902, 0, 0), own = rng_for(903, (uint64_t)world_rank(), (uint64_t)k);
  const double s = course_scale(course, k);
  float *g = (float *)m->grads[0].data;
  for (int64_t i = 0; i < NUMEL; ++i) g[i] = (float)(s * (rng_signed(&shared, 1.0) + rng_signed(&own, 0.3)));
}

/* lr 0: the parameters never change, so a resumed run needs no copy of them. */
static const char *const optimizers[] = {
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0}}",
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0}},"
    " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 100}",
    "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0, \"freeze_step\": 20}}",
    "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0, \"freeze_step\": 20}}",
    "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0, \"var_freeze_step\": 20,"
    " \"var_update_scaler\": 4, \"local_step_scaler\": 4, \"local_step_clipper\": 4}}",
};
#define NUM_OPTIMIZERS (int)(sizeof optimizers / sizeof optimizers[0])

typedef struct run_record {
  int32_t diverging[STEPS + 1];
  double norm[STEPS + 1];
  int32_t skipped[STEPS + 1];
  int32_t phase[STEPS + 1];
} run_record;

/* `extra`: more top-level members (after a comma), or "". */
static const char *config_of(char *buf, size_t n, int optimizer, const char *extra) {
  snprintf(buf, n, "%s, \"threads\": 1%s%s}", optimizers[optimizer], *extra ? ", " : "", extra);
  return buf;
}

/* Steps k = first..last of `course` on `opt`; handed_over: through
 * dsopt_grad_ready, one micro-batch. inf_at: that step gets an Inf on rank 0. */
static void run_steps(dsopt_optimizer *opt, model *m, int course, int first, int last, int handed_over,
                      int inf_at, run_record *rec) {
  for (int k = first; k <= last; ++k) {
    dsopt_step_info info;
    memset(&info, 0x55, sizeof info);
    info.struct_size = sizeof info;
    gradient_for_step(m, course, k);
    if (k == inf_at && world_rank() == 0) ((float *)m->grads[0].data)[7] = INFINITY;
    if (handed_over) {
      CHECK_OK(dsopt_grad_ready(opt, 0, &m->grads[0]));
      CHECK_OK(dsopt_step(opt, NULL, 0, &info));
    } else {
      CHECK_OK(dsopt_step(opt, m->grads, 1, &info));
    }
    rec->diverging[k] = info.diverging;
    rec->norm[k] = info.grad_norm;
    rec->skipped[k] = info.skipped;
    rec->phase[k] = info.phase;
  }
}

/* Checks steps first..last of `rec` against the reference rule `ref` (fed
 * with the reported norms of applied steps) and across ranks. */
static int matches_rule(const run_record *rec, divergence_ref *ref, int first, int last, const char *what) {
  int ok = 1;
  for (int k = first; k <= last; ++k) {
    /* the norm is local (sqrt of the mean of the ranks' squared norms) where
     * the gradients stayed the ranks' own */
    const int local = world_size() > 1 && rec->phase[k] != DSOPT_PHASE_FULL;
    const int expected = rec->skipped[k] ? ref->diverging
                                         : divergence_ref_observe(ref, rec->norm[k], local, world_size());
    ok &= CHECKF(rec->diverging[k] == expected, "%s: step %d: diverging %d, the rule says %d (norm %g)", what, k,
                 rec->diverging[k], expected, rec->norm[k]);
  }
  ok &= CHECKF(same_on_every_rank(rec, sizeof *rec), "%s: the ranks report differently", what);
  return ok;
}

static int first_flag(const run_record *rec) {
  for (int k = 1; k <= STEPS; ++k)
    if (rec->diverging[k]) return k;
  return 0;
}

static int flagged_steps(const run_record *rec) {
  int n = 0;
  for (int k = 1; k <= STEPS; ++k) n += rec->diverging[k] == 1;
  return n;
}

/* The world communicator of the program (borrowed by every optimizer). */
static dsopt_comm *the_comm;

static int open_run(dsopt_optimizer **opt, model *m, const char *config) {
  *opt = NULL;
  model_init(m, specs, 1, 904);
  return all_ranks(CHECK_OK(dsopt_create(opt, config, the_comm, m->params, 1)));
}

static void close_run(dsopt_optimizer *opt, model *m) {
  dsopt_destroy(opt);
  model_free(m);
}

/* ---- the courses on every optimizer --------------------------------------- */

static void every_course_on_every_optimizer(void) {
  char config[1024], what[256];
  for (int o = 0; o < NUM_OPTIMIZERS; ++o)
    for (int course = 0; course < NUM_COURSES; ++course)
      for (int handed_over = 0; handed_over < 2; ++handed_over) {
        snprintf(what, sizeof what, "%s, %s%s", optimizers[o], course_names[course],
                 handed_over ? ", handed over" : "");
        dsopt_optimizer *opt;
        model m;
        run_record rec;
        memset(&rec, 0, sizeof rec);
        if (open_run(&opt, &m, config_of(config, sizeof config, o, "\"report_grad_norm\": true"))) {
          run_steps(opt, &m, course, 1, STEPS, handed_over, 0, &rec);
          divergence_ref ref;
          divergence_ref_init(&ref);
          matches_rule(&rec, &ref, 1, STEPS, what);
          const int first = first_flag(&rec);
          if (course == STEADY || course == NOISY || course == GROWING)
            CHECKF(first == 0, "%s: a healthy course is reported at step %d", what, first);
          if (course == EXPLODING) {
            /* the third step of the jump; over 8 steps after it ends */
            CHECKF(first == ONSET + 2, "%s: first reported at step %d, expected %d", what, first, ONSET + 2);
            CHECKF(rec.diverging[JUMP_END + 6] == 1 && rec.diverging[JUMP_END + 7] == 0,
                   "%s: the episode should end at step %d", what, JUMP_END + 7);
          }
          if (course == SPIKES) /* above on every other step: the third spike */
            CHECKF(first == ONSET + 4, "%s: first reported at step %d, expected %d", what, first, ONSET + 4);
          if (course == CLIMBING) /* x1.15 a step: 20x above the lagging reference in about 25 */
            CHECKF(first > ONSET + 10 && first < ONSET + 35, "%s: first reported at step %d", what, first);
        }
        close_run(opt, &m);
      }
}

/* A non-finite gradient in an episode: the skipped step reports the
 * episode and leaves the state alone. */
static void a_skipped_step_keeps_the_episode(void) {
  char config[1024];
  dsopt_optimizer *opt;
  model m;
  run_record rec;
  memset(&rec, 0, sizeof rec);
  if (open_run(&opt, &m, config_of(config, sizeof config, 0, "\"report_grad_norm\": true"))) {
    run_steps(opt, &m, EXPLODING, 1, STEPS, 0, ONSET + 5, &rec);
    CHECK_EQ_INT(rec.skipped[ONSET + 5], 1);
    CHECK_EQ_INT(rec.diverging[ONSET + 5], 1);
    divergence_ref ref;
    divergence_ref_init(&ref);
    matches_rule(&rec, &ref, 1, STEPS, "exploding with a skipped step");
  }
  close_run(opt, &m);
}

/* ---- the state blob --------------------------------------------------------- */

#define SAVE_AT (ONSET + 1) /* one step above so far: the episode starts after the load */

static void the_state_travels_in_the_blob(void) {
  char config[1024];
  config_of(config, sizeof config, 2, "\"report_grad_norm\": true"); /* 1-bit Adam: rank-local state too */
  dsopt_optimizer *a, *b, *c;
  model ma, mb, mc;
  run_record ra, rb, rc;
  memset(&ra, 0, sizeof ra);
  memset(&rb, 0, sizeof rb);
  memset(&rc, 0, sizeof rc);
  unsigned char *saved = NULL, *end_a = NULL, *end_b = NULL;
  uint64_t saved_size = 0, end_a_size = 0, end_b_size = 0;
  if (open_run(&a, &ma, config)) {
    run_steps(a, &ma, EXPLODING, 1, SAVE_AT, 0, 0, &ra);
    saved = state_blob(a, &saved_size);
    run_steps(a, &ma, EXPLODING, SAVE_AT + 1, STEPS, 0, 0, &ra);
    end_a = state_blob(a, &end_a_size);
  }
  CHECK(saved != NULL && blob_section(saved, "common.divergence", NULL) != NULL);

  /* resumed: the same reports and, at the end, the same blob */
  if (open_run(&b, &mb, config) && all_ranks(saved != NULL) &&
      all_ranks(CHECK_OK(dsopt_state_load(b, saved, saved_size)))) {
    run_steps(b, &mb, EXPLODING, SAVE_AT + 1, STEPS, 0, 0, &rb);
    end_b = state_blob(b, &end_b_size);
    for (int k = SAVE_AT + 1; k <= STEPS; ++k)
      CHECKF(rb.diverging[k] == ra.diverging[k], "resumed: step %d: %d, uninterrupted %d", k, rb.diverging[k],
             ra.diverging[k]);
    CHECK(flagged_steps(&rb) > 0);
    CHECK(same_bytes(end_a, end_a_size, end_b, end_b_size));
  }
  close_run(b, &mb);

  /* a blob without the section: the check starts over at the load, so the
   * jump is the new run's first history and nothing is reported */
  unsigned char *old = NULL;
  uint64_t old_size = 0;
  if (saved) {
    old = (unsigned char *)malloc((size_t)saved_size);
    memcpy(old, saved, (size_t)saved_size);
    old_size = blob_drop_section(old, saved_size, "common.divergence");
    CHECK(old_size < saved_size && blob_section(old, "common.divergence", NULL) == NULL);
  }
  if (open_run(&c, &mc, config) && all_ranks(old != NULL) &&
      all_ranks(CHECK_OK(dsopt_state_load(c, old, old_size)))) {
    run_steps(c, &mc, EXPLODING, SAVE_AT + 1, STEPS, 0, 0, &rc);
    divergence_ref fresh;
    divergence_ref_init(&fresh);
    matches_rule(&rc, &fresh, SAVE_AT + 1, STEPS, "loaded without the section");
    CHECK_EQ_INT(flagged_steps(&rc), 0);
    uint64_t size = 0;
    unsigned char *again = state_blob(c, &size);
    CHECK(again && blob_section(again, "common.divergence", NULL) != NULL);
    free(again);
  }
  close_run(c, &mc);

  /* a damaged section (diverging 2) is refused on every rank */
  if (saved) {
    uint64_t len = 0;
    uint8_t *section = blob_section(saved, "common.divergence", &len);
    CHECK_EQ_INT((long long)len, 44);
    const int32_t two = 2;
    memcpy(section + 40, &two, 4); /* diverging, after two (count, reference) pairs and the flags */
    blob_fix_checksum(saved, saved_size);
    CHECK_STATUS(dsopt_state_load(a, saved, saved_size), DSOPT_ECORRUPT);
    CHECK(check_contains_ignoring_case(dsopt_last_error(), "divergence"));
  }
  close_run(a, &ma);
  free(saved);
  free(old);
  free(end_a);
  free(end_b);
}

/* ---- configuration ------------------------------------------------------------ */

static void the_config_tunes_or_turns_off_the_check(void) {
  char config[1024], with_norm[1024];
  run_record off, plain, reported, tuned;
  memset(&off, 0, sizeof off);
  memset(&plain, 0, sizeof plain);
  memset(&reported, 0, sizeof reported);
  memset(&tuned, 0, sizeof tuned);
  dsopt_optimizer *opt;
  model m;
  if (open_run(&opt, &m, config_of(config, sizeof config, 0, "\"divergence_check\": {\"enabled\": false}")))
    run_steps(opt, &m, EXPLODING, 1, STEPS, 0, 0, &off);
  close_run(opt, &m);
  CHECK_EQ_INT(flagged_steps(&off), 0);

  /* on by default; info.grad_norm stays -1 without report_grad_norm */
  if (open_run(&opt, &m, config_of(config, sizeof config, 0, "")))
    run_steps(opt, &m, EXPLODING, 1, STEPS, 0, 0, &plain);
  close_run(opt, &m);
  if (open_run(&opt, &m, config_of(with_norm, sizeof with_norm, 0, "\"report_grad_norm\": true")))
    run_steps(opt, &m, EXPLODING, 1, STEPS, 0, 0, &reported);
  close_run(opt, &m);
  CHECK(plain.norm[1] == -1.0 && plain.norm[STEPS] == -1.0);
  CHECK(memcmp(plain.diverging, reported.diverging, sizeof plain.diverging) == 0);
  CHECK(flagged_steps(&plain) > 0);

  /* factor 10, one step: the first step above reports */
  const char *tuning = "\"report_grad_norm\": true, \"divergence_check\": {\"factor\": 10, \"count\": 1,"
                       " \"window\": 1, \"min_steps\": 5, \"horizon\": 20}";
  if (open_run(&opt, &m, config_of(config, sizeof config, 0, tuning))) {
    run_steps(opt, &m, EXPLODING, 1, STEPS, 0, 0, &tuned);
    divergence_ref ref;
    divergence_ref_init(&ref);
    ref.factor = 10;
    ref.count = ref.window = 1;
    ref.min_steps = 5;
    ref.horizon = 20;
    matches_rule(&tuned, &ref, 1, STEPS, tuning);
    CHECK_EQ_INT(first_flag(&tuned), ONSET);
  }
  close_run(opt, &m);

  static const char *const bad[][2] = {
      {"\"divergence_check\": true", "divergence_check"},
      {"\"divergence_check\": {\"fator\": 10}", "divergence_check.fator"},
      {"\"divergence_check\": {\"factor\": 1}", "divergence_check.factor"},
      {"\"divergence_check\": {\"factor\": \"10\"}", "divergence_check.factor"},
      {"\"divergence_check\": {\"window\": 65}", "divergence_check.window"},
      {"\"divergence_check\": {\"count\": 9}", "divergence_check.count"},
      {"\"divergence_check\": {\"count\": 0}", "divergence_check.count"},
      {"\"divergence_check\": {\"horizon\": 0}", "divergence_check.horizon"},
      {"\"divergence_check\": {\"min_steps\": -1}", "divergence_check.min_steps"},
      {"\"divergence_check\": {\"enabled\": 1}", "divergence_check.enabled"},
  };
  model_init(&m, specs, 1, 905);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    opt = NULL;
    CHECK_STATUS(dsopt_create(&opt, config_of(config, sizeof config, 0, bad[i][0]), the_comm, m.params, 1),
                 DSOPT_EINVAL);
    CHECKF(check_contains_ignoring_case(dsopt_last_error(), bad[i][1]), "%s: the message names %s: %s", bad[i][0],
           bad[i][1], dsopt_last_error());
    dsopt_destroy(opt);
  }
  model_free(&m);
}

/* ---- where the norm is taken ------------------------------------------------ */

/* Tensors around the vector widths and the sum block (4096), every 16-bit
 * kind of parameter and gradient, two groups. */
static const tensor_spec mixed[] = {
    {2 * 4096 + 37, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {17, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {4096, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0},        {1000, DSOPT_FLOAT16, DSOPT_FLOAT16, 1},
    {12345, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},        {3 * 4096 + 5, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
};
#define NUM_MIXED (int)(sizeof mixed / sizeof mixed[0])
#define ABSENT 3 /* this tensor has no gradient on every fifth step */

/* The run of `config` (extra members appended) on the mixed tensors:
 * EXPLODING's scales on random gradients; rec and, at the end, the
 * divergence section and the parameters. */
static int mixed_run(const char *config, int handed_over, run_record *rec, unsigned char **params,
                     uint64_t *params_size, unsigned char **section, uint64_t *section_size) {
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, mixed, NUM_MIXED, 906);
  *params = *section = NULL;
  int ok = all_ranks(CHECK_OK(dsopt_create(&opt, config, the_comm, m.params, NUM_MIXED)));
  for (int k = 1; ok && k <= STEPS; ++k) {
    rng r = rng_for(907, (uint64_t)world_rank(), (uint64_t)k);
    model_random_grads(&m, &r, 1.0, course_scale(EXPLODING, k));
    const int absent = k % 5 == 0;
    dsopt_step_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (handed_over) {
      for (int t = 0; t < NUM_MIXED; ++t)
        if (!(absent && t == ABSENT)) ok &= CHECK_OK(dsopt_grad_ready(opt, t, &m.grads[t]));
      ok &= CHECK_OK(dsopt_step(opt, NULL, 0, &info));
    } else {
      dsopt_tensor grads[NUM_MIXED];
      memcpy(grads, m.grads, sizeof grads);
      if (absent) grads[ABSENT].data = NULL;
      ok &= CHECK_OK(dsopt_step(opt, grads, NUM_MIXED, &info));
    }
    rec->diverging[k] = info.diverging;
    rec->skipped[k] = info.skipped;
  }
  if (ok) {
    uint64_t blob_size = 0, len = 0;
    unsigned char *blob = state_blob(opt, &blob_size);
    const uint8_t *at = blob ? blob_section(blob, "common.divergence", &len) : NULL;
    if (at) {
      *section = (unsigned char *)malloc((size_t)len);
      memcpy(*section, at, (size_t)len);
      *section_size = len;
    }
    free(blob);
    *params = model_snapshot(&m, params_size);
  }
  dsopt_destroy(opt);
  model_free(&m);
  return ok && *section && *params;
}

/* With nothing but the divergence check wanting the norm (no clipping, no
 * report_grad_norm), the CPU update at one rank sums the gradients as it
 * reads them instead of in a pass of their own. The same run with
 * report_grad_norm (the norm from the pass) must report the same on every
 * step and end with the same parameters and divergence state, bit for bit:
 * AdamW, Adam and Lion, with and without the non-finite check, through
 * dsopt_step and dsopt_grad_ready, on 1 and 2 threads. */
static void the_norm_summed_by_the_update_is_the_pass_norm(void) {
  if (world_size() > 1) return; /* both runs take the norm in the gradients' reduction */
  static const char *const types[] = {"AdamW", "Adam", "Lion"};
  char base[512], plain[640], reported[640], what[700];
  for (int t = 0; t < 3; ++t)
    for (int threads = 1; threads <= 2; ++threads)
      for (int skip = 0; skip < 2; ++skip)
        for (int handed_over = 0; handed_over < 2; ++handed_over) {
          snprintf(base, sizeof base,
                   "{\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}},"
                   " \"param_groups\": [{}, {\"lr\": 3e-4}], \"threads\": %d, \"skip_nonfinite\": %s",
                   types[t], threads, skip ? "true" : "false");
          snprintf(plain, sizeof plain, "%s}", base);
          snprintf(reported, sizeof reported, "%s, \"report_grad_norm\": true}", base);
          snprintf(what, sizeof what, "%s%s", plain, handed_over ? ", handed over" : "");
          run_record a, b;
          memset(&a, 0, sizeof a);
          memset(&b, 0, sizeof b);
          unsigned char *pa, *pb, *sa, *sb;
          uint64_t pa_size = 0, pb_size = 0, sa_size = 0, sb_size = 0;
          const int ok_a = mixed_run(plain, handed_over, &a, &pa, &pa_size, &sa, &sa_size);
          const int ok_b = mixed_run(reported, handed_over, &b, &pb, &pb_size, &sb, &sb_size);
          if (ok_a && ok_b) {
            CHECKF(memcmp(a.diverging, b.diverging, sizeof a.diverging) == 0, "%s: reports differ", what);
            CHECKF(flagged_steps(&a) > 0, "%s: the blow-up is never reported", what);
            CHECKF(same_bytes(sa, sa_size, sb, sb_size), "%s: the divergence state differs", what);
            CHECKF(same_bytes(pa, pa_size, pb, pb_size), "%s: the parameters differ", what);
          }
          free(pa);
          free(pb);
          free(sa);
          free(sb);
        }
}

/* A caller of the header before the field: struct_size ends before it. */
static void an_older_struct_never_sees_the_field(void) {
  char config[1024];
  dsopt_optimizer *opt;
  model m;
  if (open_run(&opt, &m, config_of(config, sizeof config, 0, ""))) {
    int32_t last = 0;
    for (int k = 1; k <= ONSET + 5; ++k) {
      dsopt_step_info info;
      memset(&info, 0x55, sizeof info);
      info.struct_size = (uint32_t)offsetof(dsopt_step_info, diverging);
      gradient_for_step(&m, EXPLODING, k);
      CHECK_OK(dsopt_step(opt, m.grads, 1, &info));
      last = info.diverging;
    }
    CHECK_EQ_INT(last, 0x55555555);
  }
  close_run(opt, &m);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  the_comm = world_comm();
  RUN_TEST(every_course_on_every_optimizer);
  RUN_TEST(a_skipped_step_keeps_the_episode);
  RUN_TEST(the_state_travels_in_the_blob);
  RUN_TEST(the_config_tunes_or_turns_off_the_check);
  RUN_TEST(an_older_struct_never_sees_the_field);
  RUN_TEST(the_norm_summed_by_the_update_is_the_pass_norm);
  dsopt_comm_destroy(the_comm);
  const int status = check_finish();
  MPI_Finalize();
  return status;
}

/* dsopt_grad_ready under mpirun: gradients handed over one by one, in any
 * order, give parameters, step reports and state bit-identical to the same
 * gradients passed to dsopt_step at once, for ZeRO stage 0, 1 and 2 (several
 * reduce buckets), mixed dtypes, 1-bit Adam, 1-bit LAMB and 0/1 Adam through
 * their warmup, compression and local stages, and fp16 loss scaling with an overflow on one rank.
 * Gradient accumulation: with dyadic gradients (every sum exact) G = 2 and 4
 * equal a step with the exact mean, and G = 3 gives the same parameters at
 * stage 0, 1 and 2. A parameter without a gradient contributes zeros. The
 * buffer handed over is overwritten right after each call. Misuse fails with
 * DSOPT_EINVAL and changes nothing.
 *
 * argv[1] "serialized" initialises MPI with MPI_THREAD_SERIALIZED, so the
 * reductions run inside the calls; otherwise MPI_THREAD_MULTIPLE, so they run
 * on dsopt's thread behind the caller. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define NUM_TENSORS 5

static const tensor_spec specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {37, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
    {250, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},
    {6, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {513, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
};

enum order { FORWARD, REVERSE, RANDOM };

static size_t grad_bytes(const model *m, int t) {
  return (size_t)m->spec[t].numel * (m->grads[t].dtype == DSOPT_FLOAT32 ? 4 : 2);
}

static void copy_grads(model *dst, const model *src) {
  for (int t = 0; t < src->count; ++t) memcpy(dst->grads[t].data, src->grads[t].data, grad_bytes(src, t));
}

/* Hands over every gradient of `m` (skipping tensor `skip`, -1 for none) in
 * `order`, each from one shared buffer that is overwritten after the call. */
static int hand_over(dsopt_optimizer *opt, const model *m, enum order order, rng *r, int skip) {
  int idx[NUM_TENSORS];
  for (int t = 0; t < m->count; ++t) idx[t] = order == REVERSE ? m->count - 1 - t : t;
  if (order == RANDOM)
    for (int t = m->count - 1; t > 0; --t) {
      const int j = (int)(rng_next(r) % (uint64_t)(t + 1)), tmp = idx[t];
      idx[t] = idx[j];
      idx[j] = tmp;
    }
  static unsigned char shared[4 * 2048];
  int ok = 1;
  for (int k = 0; k < m->count; ++k) {
    const int t = idx[k];
    if (t == skip) continue;
    memcpy(shared, m->grads[t].data, grad_bytes(m, t));
    dsopt_tensor g = m->grads[t];
    g.data = shared;
    ok &= CHECK_OK(dsopt_grad_ready(opt, t, &g));
    memset(shared, 0xff, grad_bytes(m, t)); /* NaN if dsopt read it later */
  }
  return ok;
}

static int same_info(const dsopt_step_info *a, const dsopt_step_info *b) {
  return a->skipped == b->skipped && a->step == b->step && a->loss_scale == b->loss_scale &&
         a->grad_norm == b->grad_norm && a->phase == b->phase && a->compressed == b->compressed;
}

static void fill_dyadic(model *m, rng *r) {
  for (int t = 0; t < m->count; ++t)
    for (int64_t i = 0; i < m->spec[t].numel; ++i)
      model_set_grad(m, t, i, (double)((int64_t)(rng_next(r) % 63) - 31) / 32.0);
}

/* Steps two optimizers of `config` side by side: one with dsopt_step's
 * gradients, one with the same gradients handed over in `order`. */
static void compare_at_once(const char *what, const char *config, enum order order, int steps,
                            int inf_rank, int inf_step) {
  check_current_test = what;
  dsopt_comm *comm = world_comm();
  model a, b;
  model_init(&a, specs, NUM_TENSORS, 5);
  model_init(&b, specs, NUM_TENSORS, 5);
  dsopt_optimizer *oa = NULL, *ob = NULL;
  CHECK_OK(dsopt_create(&oa, config, comm, a.params, a.count));
  CHECK_OK(dsopt_create(&ob, config, comm, b.params, b.count));
  rng r = rng_for(17, (uint64_t)world_rank(), 0);
  rng order_rng = rng_for(23, (uint64_t)world_rank(), 0);
  for (int s = 1; s <= steps; ++s) {
    model_random_grads(&a, &r, 1.0, 1.0);
    if (s == inf_step && world_rank() == inf_rank) model_set_grad(&a, 2, 7, 1.0 / 0.0);
    copy_grads(&b, &a);
    dsopt_step_info ia, ib;
    memset(&ia, 0, sizeof ia);
    memset(&ib, 0, sizeof ib);
    ia.struct_size = ib.struct_size = sizeof ia;
    CHECK_OK(dsopt_step(oa, a.grads, a.count, &ia));
    hand_over(ob, &b, order, &order_rng, -1);
    CHECK_OK(dsopt_step(ob, NULL, 0, &ib));
    CHECKF(model_params_identical(&a, &b), "step %d: parameters bit-identical", s);
    CHECKF(same_info(&ia, &ib), "step %d: same step report (skipped %d/%d, scale %g/%g, norm %g/%g)", s,
           ia.skipped, ib.skipped, ia.loss_scale, ib.loss_scale, ia.grad_norm, ib.grad_norm);
    if (s == inf_step) CHECKF(ia.skipped == 1, "step %d was skipped", s);
    /* The same traffic, plus the 16-byte handshake of the first hand-over. */
    const int p = world_size();
    const uint64_t handshake = p > 1 ? (uint64_t)(2 * (p - 1) * 16 / p) : 0;
    CHECKF(ib.bytes_sent == ia.bytes_sent + handshake, "step %d: bytes_sent %llu, at once %llu", s,
           (unsigned long long)ib.bytes_sent, (unsigned long long)ia.bytes_sent);
  }
  uint64_t na = 0, nb = 0;
  unsigned char *ba = state_blob(oa, &na), *bb = state_blob(ob, &nb);
  CHECKF(ba && bb && same_bytes(ba, na, bb, nb), "state blobs identical");
  free(ba);
  free(bb);
  dsopt_destroy(oa);
  dsopt_destroy(ob);
  model_free(&a);
  model_free(&b);
  dsopt_comm_destroy(comm);
}

static const char *const stage_configs[] = {
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}, "
    "\"threads\": 1, \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 0, "
    "\"reduce_bucket_size\": 300}}",
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
    "\"report_grad_norm\": true}",
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
    "\"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 256}}",
    "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
    "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 200}}",
    "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
    "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 200, \"reduce_scatter\": false}}",
};

static void every_stage_and_order(void) {
  char what[96];
  for (size_t c = 0; c < sizeof stage_configs / sizeof *stage_configs; ++c)
    for (int o = FORWARD; o <= RANDOM; ++o) {
      snprintf(what, sizeof what, "config %zu, order %d", c, o);
      compare_at_once(what, stage_configs[c], (enum order)o, 3, -1, 0);
    }
}

static void onebit_family_every_stage(void) {
  compare_at_once("OneBitAdam",
                  "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.001, "
                  "\"freeze_step\": 2}}, \"threads\": 1, \"zero_optimization\": "
                  "{\"reduce_bucket_size\": 300}}",
                  REVERSE, 5, -1, 0);
  compare_at_once("OneBitLamb",
                  "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.001, "
                  "\"freeze_step\": 2}}, \"threads\": 1}",
                  RANDOM, 5, -1, 0);
  compare_at_once("ZeroOneAdam",
                  "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.001, "
                  "\"var_freeze_step\": 2, \"var_update_scaler\": 1, \"local_step_scaler\": 2, "
                  "\"local_step_clipper\": 2}}, \"threads\": 1, \"zero_optimization\": "
                  "{\"reduce_bucket_size\": 300}}",
                  REVERSE, 8, -1, 0);
}

static void fp16_overflow_on_one_rank(void) {
  compare_at_once("fp16 overflow",
                  "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
                  "\"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 4}, "
                  "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 128}}",
                  RANDOM, 4, 1 % world_size(), 2);
}

/* G micro-batches handed over; returns the optimizer's parameters in `b`.
 * With `exact_mean` a second optimizer steps with the exact means at once. */
static void accumulate(const char *what, int stage, int micro, int exact_mean, model *out) {
  check_current_test = what;
  char config[320];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
           "\"gradient_accumulation_steps\": %d, \"zero_optimization\": {\"stage\": %d, "
           "\"reduce_bucket_size\": 256}}",
           micro, stage);
  char plain[320];
  snprintf(plain, sizeof plain,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
           "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 256}}",
           stage);
  dsopt_comm *comm = world_comm();
  model b, ref, mb;
  model_init(&b, specs, NUM_TENSORS, 9);
  model_init(&ref, specs, NUM_TENSORS, 9);
  model_init(&mb, specs, NUM_TENSORS, 9);
  dsopt_optimizer *ob = NULL, *oref = NULL;
  CHECK_OK(dsopt_create(&ob, config, comm, b.params, b.count));
  if (exact_mean) CHECK_OK(dsopt_create(&oref, plain, comm, ref.params, ref.count));
  rng r = rng_for(31, (uint64_t)world_rank(), 0), order_rng = rng_for(37, (uint64_t)world_rank(), 0);
  for (int s = 1; s <= 3; ++s) {
    double *sum[NUM_TENSORS];
    for (int t = 0; t < NUM_TENSORS; ++t) sum[t] = (double *)calloc((size_t)specs[t].numel, sizeof(double));
    for (int k = 0; k < micro; ++k) {
      fill_dyadic(&mb, &r);
      for (int t = 0; t < NUM_TENSORS; ++t)
        for (int64_t i = 0; i < specs[t].numel; ++i) sum[t][i] += mb.grad_values[t][i];
      hand_over(ob, &mb, k % 2 ? RANDOM : REVERSE, &order_rng, -1);
    }
    dsopt_step_info ib;
    memset(&ib, 0, sizeof ib);
    ib.struct_size = sizeof ib;
    CHECK_OK(dsopt_step(ob, NULL, 0, &ib));
    CHECKF(ib.skipped == 0 && ib.step == s, "step %d applied", s);
    if (exact_mean) {
      for (int t = 0; t < NUM_TENSORS; ++t)
        for (int64_t i = 0; i < specs[t].numel; ++i) model_set_grad(&ref, t, i, sum[t][i] / micro);
      CHECK_OK(dsopt_step(oref, ref.grads, ref.count, NULL));
      CHECKF(model_params_identical(&b, &ref), "step %d: equals a step with the exact mean", s);
    }
    for (int t = 0; t < NUM_TENSORS; ++t) free(sum[t]);
  }
  model_copy_params(out, &b);
  dsopt_destroy(ob);
  if (oref) dsopt_destroy(oref);
  model_free(&b);
  model_free(&ref);
  model_free(&mb);
  dsopt_comm_destroy(comm);
}

static void gradient_accumulation(void) {
  char what[64];
  for (int stage = 0; stage <= 2; ++stage)
    for (int micro = 2; micro <= 4; micro += 2) {
      model out;
      model_init(&out, specs, NUM_TENSORS, 9);
      snprintf(what, sizeof what, "G=%d at stage %d", micro, stage);
      accumulate(what, stage, micro, 1, &out);
      model_free(&out);
    }
  model per_stage[3];
  for (int stage = 0; stage <= 2; ++stage) {
    model_init(&per_stage[stage], specs, NUM_TENSORS, 9);
    snprintf(what, sizeof what, "G=3 at stage %d", stage);
    accumulate(what, stage, 3, 0, &per_stage[stage]);
  }
  check_current_test = "G=3 across stages";
  CHECK(model_params_identical(&per_stage[0], &per_stage[1]));
  CHECK(model_params_identical(&per_stage[0], &per_stage[2]));
  for (int stage = 0; stage <= 2; ++stage) model_free(&per_stage[stage]);
}

/* Rank 0 never hands over tensor 2: the same as an absent (NULL) gradient
 * in dsopt_step. In the third step the last rank hands over nothing at all.
 * Zeros from those ranks where other ranks have gradients; not updated where
 * no rank has (one rank: test_absent_grads checks both). */
static void missing_gradient_is_zero(void) {
  for (int stage = 0; stage <= 2; stage += 2) {
    check_current_test = stage ? "missing gradient, stage 2" : "missing gradient, stage 0";
    char config[256];
    snprintf(config, sizeof config,
             "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}, \"threads\": 1, "
             "\"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 256}}",
             stage);
    dsopt_comm *comm = world_comm();
    model a, b;
    model_init(&a, specs, NUM_TENSORS, 3);
    model_init(&b, specs, NUM_TENSORS, 3);
    dsopt_optimizer *oa = NULL, *ob = NULL;
    CHECK_OK(dsopt_create(&oa, config, comm, a.params, a.count));
    CHECK_OK(dsopt_create(&ob, config, comm, b.params, b.count));
    rng r = rng_for(41, (uint64_t)world_rank(), 0);
    for (int s = 0; s < 3; ++s) {
      model_random_grads(&a, &r, 1.0, 1.0);
      copy_grads(&b, &a);
      const int silent = s == 2 && world_rank() == world_size() - 1;
      dsopt_tensor grads[NUM_TENSORS];
      memcpy(grads, a.grads, sizeof grads);
      for (int t = 0; t < NUM_TENSORS; ++t)
        if (silent || (world_rank() == 0 && t == 2)) grads[t].data = NULL;
      CHECK_OK(dsopt_step(oa, grads, a.count, NULL));
      if (!silent) hand_over(ob, &b, REVERSE, &r, world_rank() == 0 ? 2 : -1);
      CHECK_OK(dsopt_step(ob, NULL, 0, NULL));
      CHECKF(model_params_identical(&a, &b), "step %d", s);
    }
    dsopt_destroy(oa);
    dsopt_destroy(ob);
    model_free(&a);
    model_free(&b);
    dsopt_comm_destroy(comm);
  }
}

static void misuse_is_rejected(void) {
  check_current_test = "misuse";
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NUM_TENSORS, 4);
  dsopt_optimizer *opt = NULL;
  CHECK_OK(dsopt_create(&opt, stage_configs[3], comm, m.params, m.count));
  rng r = rng_for(43, (uint64_t)world_rank(), 0);
  model_random_grads(&m, &r, 1.0, 1.0);
  uint64_t n0 = 0, np = 0;
  unsigned char *before = state_blob(opt, &n0);
  unsigned char *params_before = model_snapshot(&m, &np);
  CHECK_STATUS(dsopt_grad_ready(NULL, 0, &m.grads[0]), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_grad_ready(opt, 0, NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_grad_ready(opt, -1, &m.grads[0]), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_grad_ready(opt, NUM_TENSORS, &m.grads[0]), DSOPT_EINVAL);
  CHECK(strstr(dsopt_last_error(), "out of range") != NULL);
  CHECK_STATUS(dsopt_grad_ready(opt, 1, &m.grads[0]), DSOPT_EINVAL); /* numel 1001 for 37 */
  CHECK(strstr(dsopt_last_error(), "numel") != NULL);
  dsopt_tensor bad = m.grads[0];
  bad.dtype = 99;
  CHECK_STATUS(dsopt_grad_ready(opt, 0, &bad), DSOPT_EINVAL);
  bad = m.grads[0];
  bad.data = NULL;
  CHECK_STATUS(dsopt_grad_ready(opt, 0, &bad), DSOPT_EINVAL);
  /* Nothing was handed over, nothing changed. */
  uint64_t n1 = 0;
  unsigned char *after = state_blob(opt, &n1);
  CHECK(same_bytes(before, n0, after, n1));
  CHECK(model_matches_snapshot(&m, params_before, np));
  /* Twice with G = 1, and dsopt_step with gradients while handing over. */
  CHECK_OK(dsopt_grad_ready(opt, 4, &m.grads[4]));
  CHECK_STATUS(dsopt_grad_ready(opt, 4, &m.grads[4]), DSOPT_EINVAL);
  CHECK(strstr(dsopt_last_error(), "already handed over 1 times") != NULL);
  CHECK_STATUS(dsopt_step(opt, m.grads, m.count, NULL), DSOPT_EINVAL);
  CHECK(strstr(dsopt_last_error(), "complete it with dsopt_step(opt, NULL, 0") != NULL);
  CHECK_STATUS(dsopt_state_load(opt, before, n0), DSOPT_EINVAL);
  CHECK(strstr(dsopt_last_error(), "complete the step") != NULL);
  CHECK(model_matches_snapshot(&m, params_before, np));
  for (int t = 0; t < 4; ++t) CHECK_OK(dsopt_grad_ready(opt, t, &m.grads[t]));
  dsopt_step_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(dsopt_step(opt, NULL, 0, &info));
  CHECK(info.step == 1 && info.skipped == 0 && (world_size() == 1 || info.bytes_sent > 0));
  free(before);
  free(after);
  free(params_before);
  dsopt_destroy(opt);
  model_free(&m);
  dsopt_comm_destroy(comm);
}

/* One rank hands over, the others call dsopt_step with gradients: every
 * rank fails with DSOPT_EMISMATCH instead of blocking, and the ranks then
 * go on together. */
static void handing_over_on_one_rank_only(void) {
  check_current_test = "one rank hands over";
  if (world_size() < 2) return;
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NUM_TENSORS, 4);
  dsopt_optimizer *opt = NULL;
  CHECK_OK(dsopt_create(&opt, stage_configs[0], comm, m.params, m.count));
  rng r = rng_for(47, (uint64_t)world_rank(), 0);
  model_random_grads(&m, &r, 1.0, 1.0);
  int status;
  if (world_rank() == 1) {
    hand_over(opt, &m, REVERSE, &r, -1);
    status = dsopt_step(opt, NULL, 0, NULL);
  } else {
    status = dsopt_step(opt, m.grads, m.count, NULL);
  }
  CHECKF(status == DSOPT_EMISMATCH, "returned %d, expected DSOPT_EMISMATCH", status);
  CHECKF(all_ranks(1), "every rank got here");
  hand_over(opt, &m, REVERSE, &r, -1);
  CHECK_OK(dsopt_step(opt, NULL, 0, NULL));
  dsopt_destroy(opt);
  model_free(&m);
  dsopt_comm_destroy(comm);
}

int main(int argc, char **argv) {
  const int serialized = argc > 1 && strcmp(argv[1], "serialized") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  if (world_rank() == 0) printf("MPI thread level %d (%s)\n", provided, serialized ? "serialized" : "multiple");
  RUN_TEST(every_stage_and_order);
  RUN_TEST(onebit_family_every_stage);
  RUN_TEST(fp16_overflow_on_one_rank);
  RUN_TEST(gradient_accumulation);
  RUN_TEST(missing_gradient_is_zero);
  RUN_TEST(misuse_is_rejected);
  RUN_TEST(handing_over_on_one_rank_only);
  const int rc = check_finish();
  const int ok = all_ranks(rc == 0);
  MPI_Finalize();
  return ok ? 0 : 1;
}

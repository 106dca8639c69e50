/* The deferred parameter allgather of ZeRO ("deferred_allgather"): with it,
 * dsopt_step returns with the buckets' gathers in flight, and after
 * dsopt_gather_wait (parameter by parameter, bucket by bucket, or all at
 * once) the parameters, the step info, the state blob and the memory used
 * are bit-identical to a run without it (ZeRO 1 and 2, fp32, bf16 and fp16
 * parameters, compressed ZeRO). Every other call waits for the gathers
 * first: a step or a state save right after a step sees whole parameters.
 * A collective failing while a gather is in flight fails the wait that
 * meets it with DSOPT_ECOMM on every rank, and the optimizer is marked
 * failed (docs/robustness.md). With an order given (dsopt_gather_order)
 * the buckets are numbered and posted in that order, and values stay
 * bit-identical. argv[1] "serialized": MPI_THREAD_SERIALIZED,
 * where the gather cannot leave dsopt_step (the waits return at once). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"
#include "support/failing_mpi_comm.h"
#include "support/mpi_world.h"

#define STEPS 6
#define NUM_TENSORS 5

static int threaded; /* MPI_THREAD_MULTIPLE: the gathers can be deferred */

static const tensor_spec fp32_specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {257, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {64, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},   {3, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {700, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
};
static const tensor_spec bf16_specs[NUM_TENSORS] = {
    {1001, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0}, {257, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 1},
    {64, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0},   {3, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 1},
    {700, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0},
};
static const tensor_spec mixed_specs[NUM_TENSORS] = {
    {1001, DSOPT_FLOAT16, DSOPT_FLOAT16, 0}, {257, DSOPT_FLOAT32, DSOPT_FLOAT16, 1},
    {64, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0}, {3, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {700, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
};

typedef struct case_t {
  const char *name;
  const char *zero; /* the zero_optimization keys besides deferred_allgather */
  const char *extra;
  const tensor_spec *specs;
} case_t;

static const case_t cases[] = {
    {"ZeRO-1 fp32", "\"stage\": 1, \"allgather_bucket_size\": 256", "", fp32_specs},
    {"ZeRO-2 fp32", "\"stage\": 2, \"allgather_bucket_size\": 300, \"reduce_bucket_size\": 900", "",
     fp32_specs},
    {"ZeRO-2 bf16", "\"stage\": 2, \"allgather_bucket_size\": 200", ", \"bf16\": {\"enabled\": true}",
     bf16_specs},
    {"ZeRO-2 fp16 mixed + clipping", "\"stage\": 2, \"allgather_bucket_size\": 128",
     ", \"gradient_clipping\": 0.5, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 6}",
     mixed_specs},
    {"ZeRO-2 one bucket", "\"stage\": 2", "", fp32_specs},
    {"compressed ZeRO-2 bf16 params + int8 grads",
     "\"stage\": 2, \"allgather_bucket_size\": 256, \"compression\": {\"parameters\": \"bf16\", "
     "\"gradients\": \"int8\"}",
     "", fp32_specs},
    {"compressed ZeRO-1 int8 params",
     "\"stage\": 1, \"allgather_bucket_size\": 512, \"compression\": {\"parameters\": \"int8\", "
     "\"parameter_block_size\": 48}",
     "", bf16_specs},
};

static char *config_of(const case_t *t, int deferred) {
  char *text = (char *)malloc(1024);
  snprintf(text, 1024,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
           " \"param_groups\": [{}, {\"lr\": 0.004}], \"threads\": 1,"
           " \"zero_optimization\": {%s, \"deferred_allgather\": %s}%s}",
           t->zero, deferred ? "true" : "false", t->extra);
  return text;
}

static int tensor_identical(const model *a, const model *b, int i) {
  const dsopt_tensor *x = &a->params[i], *y = &b->params[i];
  size_t es = x->dtype == DSOPT_FLOAT32 ? 4 : 2;
  return x->numel == y->numel && memcmp(x->data, y->data, (size_t)x->numel * es) == 0;
}

/* How the deferred run waits after step k. */
enum { WAIT_PARAMS, WAIT_BUCKETS, WAIT_ALL, WAIT_NONE_STEP, WAIT_NONE_SAVE, WAIT_KINDS };

/* Frees a test's pair of optimizers (ob first: destroying it waits for its
 * gathers in flight), their configs, models and communicators. */
static void free_pair(dsopt_optimizer *oa, dsopt_optimizer *ob, char *plain, char *deferred, model *a,
                      model *b, dsopt_comm *ca, dsopt_comm *cb) {
  dsopt_destroy(ob);
  dsopt_destroy(oa);
  free(plain);
  free(deferred);
  model_free(a);
  model_free(b);
  dsopt_comm_destroy(ca);
  dsopt_comm_destroy(cb);
}

static void bit_identical_with_and_without_deferral(void) {
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int c = 0; c < ncases; ++c) {
    const case_t *t = &cases[c];
    check_current_test = t->name;
    dsopt_comm *ca = world_comm(), *cb = world_comm();
    model a, b;
    model_init(&a, t->specs, NUM_TENSORS, 4001);
    model_init(&b, t->specs, NUM_TENSORS, 4001);
    char *plain = config_of(t, 0), *deferred = config_of(t, 1);
    dsopt_optimizer *oa = NULL, *ob = NULL;
    int ok = CHECK_OK(dsopt_create(&oa, plain, ca, a.params, NUM_TENSORS));
    ok = CHECK_OK(dsopt_create(&ob, deferred, cb, b.params, NUM_TENSORS)) && ok;
    if (!all_ranks(ok)) continue;

    int64_t buckets = -2, buckets_plain = -2;
    CHECK_OK(dsopt_gather_num_buckets(ob, &buckets));
    CHECK_OK(dsopt_gather_num_buckets(oa, &buckets_plain));
    CHECK_EQ_INT(buckets, buckets_plain);
    if (world_size() == 1) CHECK_EQ_INT(buckets, 0);
    else CHECKF(buckets >= 1, "%s: %lld buckets", t->name, (long long)buckets);
    int64_t last = -1;
    for (int i = 0; i < NUM_TENSORS; ++i) {
      int64_t bucket = -2;
      CHECK_OK(dsopt_gather_bucket_of(ob, i, &bucket));
      if (world_size() == 1) CHECK_EQ_INT(bucket, -1);
      else CHECKF(bucket >= 0 && bucket < buckets, "parameter %d in bucket %lld", i, (long long)bucket);
      if (bucket > last) last = bucket;
    }
    if (world_size() > 1) CHECK_EQ_INT(last, buckets - 1);
    int64_t dummy;
    CHECK_STATUS(dsopt_gather_bucket_of(ob, NUM_TENSORS, &dummy), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_gather_wait(ob, NUM_TENSORS), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_gather_wait(ob, -2), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_gather_wait_bucket(ob, buckets > 0 ? buckets : 1), DSOPT_EINVAL);
    CHECK_OK(dsopt_gather_wait(ob, -1)); /* nothing in flight */

    int deferred_seen = 0;
    for (int k = 1; k <= STEPS; ++k) {
      rng ra = rng_for(4002, (uint64_t)world_rank(), (uint64_t)k);
      rng rb = rng_for(4002, (uint64_t)world_rank(), (uint64_t)k);
      model_random_grads(&a, &ra, 1.0, 1.0);
      model_random_grads(&b, &rb, 1.0, 1.0);
      dsopt_step_info ia, ib;
      ia.struct_size = ib.struct_size = sizeof ia;
      CHECK_OK(dsopt_step(oa, a.grads, NUM_TENSORS, &ia));
      CHECK_OK(dsopt_step(ob, b.grads, NUM_TENSORS, &ib));
      CHECKF(ia.bytes_sent == ib.bytes_sent && ia.step == ib.step && ia.skipped == ib.skipped,
             "step %d: bytes_sent %llu/%llu", k, (unsigned long long)ia.bytes_sent,
             (unsigned long long)ib.bytes_sent);
      int64_t pending = -1;
      CHECK_OK(dsopt_gather_pending(ob, &pending));
      CHECKF(pending >= 0 && pending <= buckets, "step %d: %lld pending", k, (long long)pending);
      if (pending > 0) deferred_seen = 1;
      if (!threaded || world_size() == 1) CHECK_EQ_INT(pending, 0);
      const int kind = (k - 1) % WAIT_KINDS;
      if (kind == WAIT_PARAMS) {
        for (int i = 0; i < NUM_TENSORS; ++i) {
          CHECK_OK(dsopt_gather_wait(ob, i));
          CHECKF(tensor_identical(&a, &b, i), "step %d: parameter %d identical after its wait", k, i);
        }
      } else if (kind == WAIT_BUCKETS) {
        for (int64_t q = 0; q < buckets; ++q) {
          CHECK_OK(dsopt_gather_wait_bucket(ob, q));
          for (int i = 0; i < NUM_TENSORS; ++i) {
            int64_t bucket;
            dsopt_gather_bucket_of(ob, i, &bucket);
            if (bucket <= q)
              CHECKF(tensor_identical(&a, &b, i), "step %d: parameter %d identical after bucket %lld", k, i,
                     (long long)q);
          }
        }
        CHECK_OK(dsopt_gather_wait_bucket(ob, -1));
      } else if (kind == WAIT_ALL) {
        CHECK_OK(dsopt_gather_wait(ob, -1));
      } else if (kind == WAIT_NONE_SAVE) {
        /* the state blob and memory_usage wait for the gathers themselves */
        uint64_t sa = 0, sb = 0;
        unsigned char *blob_b = state_blob(ob, &sb), *blob_a = state_blob(oa, &sa);
        CHECKF(same_bytes(blob_a, sa, blob_b, sb), "step %d: state blobs identical", k);
        free(blob_a);
        free(blob_b);
        uint64_t ha = 0, hb = 1;
        CHECK_OK(dsopt_memory_usage(oa, &ha, NULL));
        CHECK_OK(dsopt_memory_usage(ob, &hb, NULL));
        CHECK_EQ_INT((long long)hb, (long long)ha);
      }
      /* WAIT_NONE_STEP: the next dsopt_step waits for them */
      if (kind != WAIT_NONE_STEP) {
        CHECK_OK(dsopt_gather_pending(ob, &pending));
        CHECK_EQ_INT(pending, 0);
        CHECKF(model_params_identical(&a, &b), "step %d: every parameter identical", k);
      }
    }
    CHECK_OK(dsopt_gather_wait(ob, -1));
    CHECKF(model_params_identical(&a, &b), "end: every parameter identical");
    uint64_t sa = 0, sb = 0;
    unsigned char *blob_a = state_blob(oa, &sa), *blob_b = state_blob(ob, &sb);
    CHECKF(same_bytes(blob_a, sa, blob_b, sb), "end: state blobs identical");
    /* A blob loaded while gathers are in flight: the load waits first. */
    rng rb = rng_for(4003, (uint64_t)world_rank(), 0);
    model_random_grads(&b, &rb, 1.0, 1.0);
    CHECK_OK(dsopt_step(ob, b.grads, NUM_TENSORS, NULL));
    CHECK_OK(dsopt_state_load(ob, blob_a, sa));
    free(blob_b);
    blob_b = state_blob(ob, &sb);
    CHECKF(same_bytes(blob_a, sa, blob_b, sb), "after a load: the loaded state");
    free(blob_a);
    free(blob_b);
    (void)deferred_seen; /* whether a query saw one in flight depends on timing */
    /* destroy with the gathers in flight: it waits (no rank hangs) */
    CHECK_OK(dsopt_step(ob, b.grads, NUM_TENSORS, NULL));
    free_pair(oa, ob, plain, deferred, &a, &b, ca, cb);
  }
  check_current_test = "";
}

/* ---- a gather order apart from the layout (dsopt_gather_order) ------------- */

/* The chunks that write each parameter, found independently of dsopt for
 * a layout of one reduce bucket: the parameters end to end, padded to a
 * multiple of 2P, rank r holding the r-th slice of S elements; chunk c
 * covers shard offsets [c L, (c+1) L) on every rank, L =
 * min(S, max(1, allgather_bucket_size / P)), with the int8 parameter codec
 * (block > 0) rounded down to a multiple of its block, at least one block,
 * before the min. Then the reference of the gather
 * positions: chunks placed in the order the parameters of `order` first
 * touch them, chunks no parameter touches last; a parameter's bucket is its
 * chunks' last position. */
static void reference_buckets(const tensor_spec *specs, int64_t bucket_elems, int64_t block,
                              const int64_t *order, int64_t *bucket_of) {
  const int64_t world = world_size();
  int64_t n = 0;
  for (int i = 0; i < NUM_TENSORS; ++i) n += specs[i].numel;
  const int64_t padded = (n + 2 * world - 1) / (2 * world) * (2 * world), shard = padded / world;
  int64_t len = bucket_elems / world;
  if (len < 1) len = 1;
  if (block > 0) len = len < block ? block : len / block * block;
  if (len > shard) len = shard;
  const int64_t chunks = (shard + len - 1) / len;
  int64_t *position = (int64_t *)malloc(sizeof(int64_t) * (size_t)chunks);
  for (int64_t c = 0; c < chunks; ++c) position[c] = -1;
  int64_t placed = 0, offsets[NUM_TENSORS];
  for (int i = 0, at = 0; i < NUM_TENSORS; at += (int)specs[i].numel, ++i) offsets[i] = at;
  for (int k = 0; k < NUM_TENSORS; ++k) {
    const int64_t i = order[k];
    for (int64_t c = 0; c < chunks; ++c) /* chunks in ascending order */
      for (int64_t x = offsets[i]; x < offsets[i] + specs[i].numel; ++x)
        if ((x % shard) / len == c) {
          if (position[c] < 0) position[c] = placed++;
          break;
        }
  }
  for (int i = 0; i < NUM_TENSORS; ++i) {
    bucket_of[i] = -1;
    for (int64_t x = offsets[i]; x < offsets[i] + specs[i].numel; ++x) {
      const int64_t p = position[(x % shard) / len];
      if (p > bucket_of[i]) bucket_of[i] = p;
    }
  }
  free(position);
}

/* The number after `key` in a case's keys (0: none). */
static int64_t zero_key_of(const case_t *t, const char *key) {
  char quoted[64];
  snprintf(quoted, sizeof quoted, "\"%s\": ", key);
  const char *at = strstr(t->zero, quoted);
  return at ? strtoll(at + strlen(quoted), NULL, 10) : 0;
}

/* The int8 parameter codec's block in a case (0: another codec). */
static int64_t int8_block_of(const case_t *t) {
  if (!strstr(t->zero, "\"parameters\": \"int8\"")) return 0;
  const int64_t block = zero_key_of(t, "parameter_block_size");
  return block ? block : 256;
}

/* With an order given, a deferred run posts the buckets in that order:
 * dsopt_gather_bucket_of follows the reference above; waiting parameter by
 * parameter in that order (or bucket by bucket) finds each one whole; and
 * parameters, step infos and blobs are bit-identical to a run without
 * deferral in the default order. The identity permutation gives the
 * default numbering; NULL/0 restores it. */
static void an_order_changes_the_schedule_only(void) {
  static const int64_t orders[3][NUM_TENSORS] = {{4, 3, 2, 1, 0}, {2, 0, 4, 1, 3}, {0, 1, 2, 3, 4}};
  const int ncases = (int)(sizeof cases / sizeof cases[0]);
  for (int c = 0; c < ncases; ++c) {
    const case_t *t = &cases[c];
    check_current_test = t->name;
    for (int o = 0; o < 3; ++o) {
      const int64_t *order = orders[o];
      dsopt_comm *ca = world_comm(), *cb = world_comm();
      model a, b;
      model_init(&a, t->specs, NUM_TENSORS, 4301);
      model_init(&b, t->specs, NUM_TENSORS, 4301);
      char *plain = config_of(t, 0), *deferred = config_of(t, 1);
      dsopt_optimizer *oa = NULL, *ob = NULL;
      int ok = CHECK_OK(dsopt_create(&oa, plain, ca, a.params, NUM_TENSORS));
      ok = CHECK_OK(dsopt_create(&ob, deferred, cb, b.params, NUM_TENSORS)) && ok;
      if (!all_ranks(ok)) continue;
      int64_t buckets = 0, before[NUM_TENSORS], after[NUM_TENSORS], plain_after[NUM_TENSORS];
      CHECK_OK(dsopt_gather_num_buckets(ob, &buckets));
      for (int i = 0; i < NUM_TENSORS; ++i) CHECK_OK(dsopt_gather_bucket_of(ob, i, &before[i]));
      CHECK_OK(dsopt_gather_order(ob, order, NUM_TENSORS));
      CHECK_OK(dsopt_gather_order(oa, order, NUM_TENSORS)); /* not deferred: numbering only */
      int64_t again = 0;
      CHECK_OK(dsopt_gather_num_buckets(ob, &again));
      CHECK_EQ_INT(again, buckets);
      for (int i = 0; i < NUM_TENSORS; ++i) {
        CHECK_OK(dsopt_gather_bucket_of(ob, i, &after[i]));
        CHECK_OK(dsopt_gather_bucket_of(oa, i, &plain_after[i]));
        CHECK_EQ_INT(plain_after[i], after[i]);
      }
      if (world_size() == 1) {
        for (int i = 0; i < NUM_TENSORS; ++i) CHECK_EQ_INT(after[i], -1);
      } else if (!strstr(t->zero, "reduce_bucket_size")) {
        int64_t expected[NUM_TENSORS], identity[NUM_TENSORS] = {0, 1, 2, 3, 4};
        const int64_t ag = zero_key_of(t, "allgather_bucket_size");
        reference_buckets(t->specs, ag ? ag : (int64_t)1 << 40, int8_block_of(t), order, expected);
        for (int i = 0; i < NUM_TENSORS; ++i)
          CHECKF(after[i] == expected[i], "order %d: parameter %d in bucket %lld, reference %lld", o, i,
                 (long long)after[i], (long long)expected[i]);
        reference_buckets(t->specs, ag ? ag : (int64_t)1 << 40, int8_block_of(t), identity, expected);
        for (int i = 0; i < NUM_TENSORS; ++i) CHECK_EQ_INT(before[i], expected[i]);
      }
      if (o == 2)
        for (int i = 0; i < NUM_TENSORS; ++i) CHECK_EQ_INT(after[i], before[i]);
      for (int k = 1; k <= 4; ++k) {
        rng ra = rng_for(4302, (uint64_t)world_rank(), (uint64_t)k), rb = ra;
        model_random_grads(&a, &ra, 1.0, 1.0);
        model_random_grads(&b, &rb, 1.0, 1.0);
        dsopt_step_info ia, ib;
        ia.struct_size = ib.struct_size = sizeof ia;
        CHECK_OK(dsopt_step(oa, a.grads, NUM_TENSORS, &ia));
        CHECK_OK(dsopt_step(ob, b.grads, NUM_TENSORS, &ib));
        CHECKF(ia.bytes_sent == ib.bytes_sent && ia.step == ib.step, "order %d step %d: step infos", o, k);
        if (k % 2) {
          for (int j = 0; j < NUM_TENSORS; ++j) {
            const int i = (int)order[j];
            CHECK_OK(dsopt_gather_wait(ob, i));
            CHECKF(tensor_identical(&a, &b, i), "order %d step %d: parameter %d whole after its wait", o,
                   k, i);
          }
        } else {
          for (int64_t q = 0; q < buckets; ++q) {
            CHECK_OK(dsopt_gather_wait_bucket(ob, q));
            int64_t pending = -1;
            CHECK_OK(dsopt_gather_pending(ob, &pending));
            CHECKF(pending <= buckets - 1 - q, "order %d: %lld pending after bucket %lld", o,
                   (long long)pending, (long long)q);
            for (int i = 0; i < NUM_TENSORS; ++i)
              if (after[i] <= q)
                CHECKF(tensor_identical(&a, &b, i), "order %d step %d: parameter %d after bucket %lld", o,
                       k, i, (long long)q);
          }
        }
        CHECK_OK(dsopt_gather_wait(ob, -1));
        CHECKF(model_params_identical(&a, &b), "order %d step %d: every parameter identical", o, k);
      }
      uint64_t sa = 0, sb = 0;
      unsigned char *blob_a = state_blob(oa, &sa), *blob_b = state_blob(ob, &sb);
      CHECKF(same_bytes(blob_a, sa, blob_b, sb), "order %d: state blobs identical", o);
      free(blob_a);
      free(blob_b);
      /* NULL/0 restores the default numbering */
      CHECK_OK(dsopt_gather_order(ob, NULL, 0));
      for (int i = 0; i < NUM_TENSORS; ++i) {
        int64_t bucket = -2;
        CHECK_OK(dsopt_gather_bucket_of(ob, i, &bucket));
        CHECK_EQ_INT(bucket, before[i]);
      }
      free_pair(oa, ob, plain, deferred, &a, &b, ca, cb);
    }
  }
  check_current_test = "";
}

/* Every bucket's position (dsopt_gather_bucket_of of each parameter). */
static void buckets_now(dsopt_optimizer *opt, int64_t *out) {
  for (int i = 0; i < NUM_TENSORS; ++i) CHECK_OK(dsopt_gather_bucket_of(opt, i, &out[i]));
}

static int same_buckets(const int64_t *x, const int64_t *y) {
  return memcmp(x, y, sizeof(int64_t) * NUM_TENSORS) == 0;
}

/* Bad orders change nothing on any rank: not a permutation (a repeat, an
 * index out of range, the wrong count, NULL) is DSOPT_EINVAL on the rank
 * that passed it and DSOPT_EMISMATCH on the others; orders that differ
 * between ranks are DSOPT_EMISMATCH on every rank. Afterwards the ranks
 * still step together, bit-identical to a run that never set an order. */
static void bad_orders_change_nothing(void) {
  check_current_test = "bad gather orders";
  const case_t *t = &cases[0];
  dsopt_comm *ca = world_comm(), *cb = world_comm();
  model a, b;
  model_init(&a, t->specs, NUM_TENSORS, 4401);
  model_init(&b, t->specs, NUM_TENSORS, 4401);
  char *plain = config_of(t, 0), *deferred = config_of(t, 1);
  dsopt_optimizer *oa = NULL, *ob = NULL;
  int ok = CHECK_OK(dsopt_create(&oa, plain, ca, a.params, NUM_TENSORS));
  ok = CHECK_OK(dsopt_create(&ob, deferred, cb, b.params, NUM_TENSORS)) && ok;
  if (all_ranks(ok)) {
    static const int64_t reversed[NUM_TENSORS] = {4, 3, 2, 1, 0};
    CHECK_OK(dsopt_gather_order(ob, reversed, NUM_TENSORS));
    int64_t set[NUM_TENSORS], now[NUM_TENSORS];
    buckets_now(ob, set);
    static const int64_t repeat[NUM_TENSORS] = {4, 3, 2, 1, 4};
    static const int64_t outside[NUM_TENSORS] = {0, 1, 2, 3, 5};
    static const int64_t negative[NUM_TENSORS] = {0, 1, -1, 3, 4};
    const int64_t *bad[3] = {repeat, outside, negative};
    for (int k = 0; k < 3; ++k) {
      CHECK_STATUS(dsopt_gather_order(ob, bad[k], NUM_TENSORS), DSOPT_EINVAL);
      CHECK(check_contains_ignoring_case(dsopt_last_error(), "dsopt_gather_order"));
    }
    CHECK_STATUS(dsopt_gather_order(ob, reversed, NUM_TENSORS - 1), DSOPT_EINVAL);
    CHECK(check_contains_ignoring_case(dsopt_last_error(), "number of parameters"));
    CHECK_STATUS(dsopt_gather_order(ob, NULL, NUM_TENSORS), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_gather_order(ob, reversed, -1), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_gather_order(NULL, reversed, NUM_TENSORS), DSOPT_EINVAL);
    buckets_now(ob, now);
    CHECKF(same_buckets(now, set), "the order set before the bad ones holds");
    if (world_size() > 1) {
      /* one rank's order is not a permutation */
      const int last = world_size() - 1;
      int status = dsopt_gather_order(ob, world_rank() == last ? repeat : reversed, NUM_TENSORS);
      CHECK_STATUS(status, world_rank() == last ? DSOPT_EINVAL : DSOPT_EMISMATCH);
      if (world_rank() != last) CHECK(check_contains_ignoring_case(dsopt_last_error(), "another rank"));
      buckets_now(ob, now);
      CHECKF(same_buckets(now, set), "nothing changed after one rank's bad order");
      /* the ranks' orders differ */
      static const int64_t other[NUM_TENSORS] = {0, 2, 4, 1, 3};
      status = dsopt_gather_order(ob, world_rank() == last ? other : reversed, NUM_TENSORS);
      CHECK_STATUS(status, DSOPT_EMISMATCH);
      CHECKF(all_ranks(status == DSOPT_EMISMATCH), "every rank returned DSOPT_EMISMATCH");
      CHECK(check_contains_ignoring_case(dsopt_last_error(), "disagree on the gather order"));
      buckets_now(ob, now);
      CHECKF(same_buckets(now, set), "nothing changed after differing orders");
      /* the default on one rank, a permutation on another: they differ too */
      status = dsopt_gather_order(ob, world_rank() == last ? NULL : reversed,
                                  world_rank() == last ? 0 : NUM_TENSORS);
      CHECK_STATUS(status, DSOPT_EMISMATCH);
      buckets_now(ob, now);
      CHECKF(same_buckets(now, set), "nothing changed after default against an order");
    }
    /* the ranks still step together; values as without an order */
    for (int k = 1; k <= 3; ++k) {
      rng ra = rng_for(4402, (uint64_t)world_rank(), (uint64_t)k), rb = ra;
      model_random_grads(&a, &ra, 1.0, 1.0);
      model_random_grads(&b, &rb, 1.0, 1.0);
      CHECK_OK(dsopt_step(oa, a.grads, NUM_TENSORS, NULL));
      CHECK_OK(dsopt_step(ob, b.grads, NUM_TENSORS, NULL));
      for (int i = 4; i >= 0; --i) CHECK_OK(dsopt_gather_wait(ob, i));
      CHECKF(model_params_identical(&a, &b), "step %d after bad orders: parameters identical", k);
    }
    /* the identity on one rank and the default on another are the same order */
    static const int64_t identity[NUM_TENSORS] = {0, 1, 2, 3, 4};
    CHECK_OK(dsopt_gather_order(ob, world_rank() == 0 ? NULL : identity, world_rank() == 0 ? 0 : NUM_TENSORS));
    /* while gradients are handed over the order cannot change */
    rng r = rng_for(4403, (uint64_t)world_rank(), 0);
    model_random_grads(&b, &r, 1.0, 1.0);
    CHECK_OK(dsopt_grad_ready(ob, 0, &b.grads[0]));
    CHECK_STATUS(dsopt_gather_order(ob, reversed, NUM_TENSORS), DSOPT_EINVAL);
    CHECK(check_contains_ignoring_case(dsopt_last_error(), "handed over"));
    for (int i = 1; i < NUM_TENSORS; ++i) CHECK_OK(dsopt_grad_ready(ob, i, &b.grads[i]));
    CHECK_OK(dsopt_step(ob, NULL, 0, NULL));
    CHECK_OK(dsopt_gather_wait(ob, -1));
  }
  free_pair(oa, ob, plain, deferred, &a, &b, ca, cb);
  check_current_test = "";
}

/* ---- two optimizers on one communicator ------------------------------------ */

/* The second optimizer's step runs collectives on the communicator the
 * first one's gathers use: it finishes them first (no two threads call
 * collectives on it at once), and both runs match the runs without
 * deferral. */
static void two_optimizers_on_one_communicator(void) {
  check_current_test = "two optimizers, one communicator";
  dsopt_comm *shared = world_comm(), *plain = world_comm();
  model m1, m2, r1, r2;
  model_init(&m1, fp32_specs, NUM_TENSORS, 4201);
  model_init(&r1, fp32_specs, NUM_TENSORS, 4201);
  model_init(&m2, bf16_specs, NUM_TENSORS, 4202);
  model_init(&r2, bf16_specs, NUM_TENSORS, 4202);
  char *on = config_of(&cases[1], 1), *off = config_of(&cases[1], 0);
  dsopt_optimizer *o1 = NULL, *o2 = NULL, *p1 = NULL, *p2 = NULL;
  int ok = CHECK_OK(dsopt_create(&o1, on, shared, m1.params, NUM_TENSORS));
  ok = CHECK_OK(dsopt_create(&o2, on, shared, m2.params, NUM_TENSORS)) && ok;
  ok = CHECK_OK(dsopt_create(&p1, off, plain, r1.params, NUM_TENSORS)) && ok;
  ok = CHECK_OK(dsopt_create(&p2, off, plain, r2.params, NUM_TENSORS)) && ok;
  if (all_ranks(ok)) {
    for (int k = 1; k <= 4; ++k) {
      rng a = rng_for(4203, (uint64_t)world_rank(), (uint64_t)k), b = a;
      model_random_grads(&m1, &a, 1.0, 1.0);
      model_random_grads(&r1, &b, 1.0, 1.0);
      rng c = rng_for(4204, (uint64_t)world_rank(), (uint64_t)k), d = c;
      model_random_grads(&m2, &c, 1.0, 1.0);
      model_random_grads(&r2, &d, 1.0, 1.0);
      CHECK_OK(dsopt_step(o1, m1.grads, NUM_TENSORS, NULL));
      CHECK_OK(dsopt_step(o2, m2.grads, NUM_TENSORS, NULL)); /* finishes o1's gathers first */
      CHECK_OK(dsopt_step(p1, r1.grads, NUM_TENSORS, NULL));
      CHECK_OK(dsopt_step(p2, r2.grads, NUM_TENSORS, NULL));
      int64_t pending = -1;
      CHECK_OK(dsopt_gather_pending(o1, &pending));
      CHECK_EQ_INT(pending, 0);
      CHECK_OK(dsopt_gather_wait(o2, -1));
      CHECKF(model_params_identical(&m1, &r1) && model_params_identical(&m2, &r2),
             "step %d: both optimizers' parameters identical", k);
    }
  }
  dsopt_destroy(o1);
  dsopt_destroy(o2);
  dsopt_destroy(p1);
  dsopt_destroy(p2);
  free(on);
  free(off);
  model_free(&m1);
  model_free(&m2);
  model_free(&r1);
  model_free(&r2);
  dsopt_comm_destroy(shared);
  dsopt_comm_destroy(plain);
  check_current_test = "";
}

/* ---- a failure while a gather is in flight --------------------------------- */

static void a_failure_in_flight_fails_the_wait_on_every_rank(void) {
  if (!threaded || world_size() == 1) return;
  check_current_test = "failure in flight";
  mpi_ops o;
  dsopt_comm *custom = custom_comm(&o, DSOPT_COMM_CONCURRENT);
  model m;
  model_init(&m, fp32_specs, NUM_TENSORS, 4101);
  dsopt_optimizer *opt = NULL;
  char *config = config_of(&cases[1], 1);
  if (!all_ranks(CHECK_OK(dsopt_create(&opt, config, custom, m.params, NUM_TENSORS)))) return;
  int64_t buckets = 0;
  CHECK_OK(dsopt_gather_num_buckets(opt, &buckets));
  rng r = rng_for(4102, (uint64_t)world_rank(), 1);
  model_random_grads(&m, &r, 1.0, 1.0);
  /* Steps 4 and 5 make the same calls (past the replication check); the
   * gathers are the last `buckets` of them. */
  for (int k = 1; k <= 4; ++k) CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
  CHECK_OK(dsopt_gather_wait(opt, -1)); /* o.calls is read on this thread only now */
  long before = o.calls;
  CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
  CHECK_OK(dsopt_gather_wait(opt, -1));
  long per_step = o.calls - before;
  /* fail the second-to-last bucket's gather of the next step */
  o.fail_at = o.calls + per_step - (buckets > 1 ? 1 : 0);
  o.fail_rank = world_size() - 1;
  CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
  int status = dsopt_gather_wait(opt, -1);
  CHECK_STATUS(status, DSOPT_ECOMM);
  CHECKF(all_ranks(status == DSOPT_ECOMM), "every rank's wait returned DSOPT_ECOMM");
  CHECKF(strstr(dsopt_last_error(), "allgather") != NULL, "the error names the allgather: %s",
         dsopt_last_error());
  /* marked failed: the state is not saved, the next step fails */
  uint64_t size = 0;
  CHECK_STATUS(dsopt_state_size(opt, &size), DSOPT_ECOMM);
  CHECK_STATUS(dsopt_step(opt, m.grads, NUM_TENSORS, NULL), DSOPT_ECOMM);
  CHECK(check_contains_ignoring_case(dsopt_last_error(), "inconsistent"));
  double lr = 0;
  CHECK_OK(dsopt_get_lr(opt, 0, &lr)); /* read-only queries still answer */
  dsopt_destroy(opt);
  free(config);
  model_free(&m);
  dsopt_comm_destroy(custom);
  MPI_Comm_free(&o.comm);
  check_current_test = "";
}

int main(int argc, char **argv) {
  int serialized = argc > 1 && strcmp(argv[1], "serialized") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, serialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE, &provided);
  threaded = provided == MPI_THREAD_MULTIPLE;
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(bit_identical_with_and_without_deferral);
  RUN_TEST(an_order_changes_the_schedule_only);
  RUN_TEST(bad_orders_change_nothing);
  RUN_TEST(two_optimizers_on_one_communicator);
  RUN_TEST(a_failure_in_flight_fails_the_wait_on_every_rank);
  int rc = check_finish();
  MPI_Finalize();
  return rc;
}

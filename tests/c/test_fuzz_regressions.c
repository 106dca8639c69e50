/* What the fuzzers (tests/fuzz) found, one test each: configs and state
 * blobs that crashed, overflowed or returned DSOPT_EINTERNAL. Each blob test
 * takes a valid blob, changes one value, fixes the CRC-32 and checks that the
 * load is rejected and changes nothing (or, where the value is legal, that
 * the optimizer keeps stepping). The inputs the fuzzers found are also in
 * tests/fuzz/corpus/ (regress_*). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/blob_sections.h"

/* ---- a small live optimizer -------------------------------------------- */

typedef struct {
  dsopt_comm *comm;
  dsopt_optimizer *opt;
  float p0[6];
  uint16_t p1[5]; /* fp16 */
  float g0[6], g1[5];
  uint8_t *blob;
  uint64_t size;
} live;

static int live_step(live *L) {
  const dsopt_tensor grads[2] = {{L->g0, 6, DSOPT_FLOAT32, 0}, {L->g1, 5, DSOPT_FLOAT32, 0}};
  return dsopt_step(L->opt, grads, 2, NULL);
}

static uint8_t *save_blob(dsopt_optimizer *opt, uint64_t *size) {
  dsopt_state_size(opt, size);
  uint8_t *b = malloc((size_t)*size);
  dsopt_state_save(opt, b, *size, NULL);
  return b;
}

/* Creates the optimizer, takes `steps` steps and saves its blob. */
static int live_open(live *L, const char *config, int steps) {
  memset(L, 0, sizeof *L);
  for (int i = 0; i < 6; ++i) {
    L->p0[i] = 0.1f * (float)(i - 2);
    L->g0[i] = 0.05f * (float)(3 - i);
  }
  for (int i = 0; i < 5; ++i) {
    L->p1[i] = (uint16_t)(0x3400 + 0x100 * i); /* 0.25 .. */
    L->g1[i] = 0.02f * (float)(i + 1);
  }
  if (!CHECK_OK(dsopt_comm_create_local(&L->comm))) return 0;
  const dsopt_tensor params[2] = {{L->p0, 6, DSOPT_FLOAT32, 0}, {L->p1, 5, DSOPT_FLOAT16, 0}};
  if (!CHECK_OK(dsopt_create(&L->opt, config, L->comm, params, 2))) return 0;
  for (int k = 0; k < steps; ++k)
    if (!CHECK_OK(live_step(L))) return 0;
  L->blob = save_blob(L->opt, &L->size);
  return 1;
}

static void live_close(live *L) {
  dsopt_destroy(L->opt);
  dsopt_comm_destroy(L->comm);
  free(L->blob);
}

/* One change to a blob: `len` bytes at offset `off` of section `name`. */
typedef struct {
  const char *name;
  uint64_t off;
  const void *value;
  size_t len;
} patch;

/* A copy of the blob with the patches applied, CRC fixed; the load of it
 * returns `expected`, and a rejected load leaves the state and parameters as
 * they were. */
static void expect_load_patched(live *L, const patch *patches, int npatches, int expected,
                                const char *words) {
  uint8_t *b = malloc((size_t)L->size);
  memcpy(b, L->blob, (size_t)L->size);
  for (int i = 0; i < npatches; ++i) {
    const patch *pt = &patches[i];
    uint64_t section_len = 0;
    uint8_t *s = blob_section(b, pt->name, &section_len);
    if (!CHECKF(s != NULL && pt->off + pt->len <= section_len, "section %s (%llu bytes) holds offset %llu",
                pt->name, (unsigned long long)section_len, (unsigned long long)pt->off)) {
      free(b);
      return;
    }
    memcpy(s + pt->off, pt->value, pt->len);
  }
  blob_fix_checksum(b, L->size);
  float p0[6];
  uint16_t p1[5];
  memcpy(p0, L->p0, sizeof p0);
  memcpy(p1, L->p1, sizeof p1);
  CHECK_STATUS(dsopt_state_load(L->opt, b, L->size), expected);
  if (words) CHECK_ERROR_MENTIONS(words);
  const void *blobs[1] = {b};
  const uint64_t sizes[1] = {L->size};
  CHECK_STATUS(dsopt_state_load_shards(L->opt, blobs, sizes, 1), expected);
  if (expected != DSOPT_OK) {
    uint64_t size = 0;
    uint8_t *now = save_blob(L->opt, &size);
    CHECK(size == L->size && memcmp(now, L->blob, (size_t)size) == 0);
    CHECK(memcmp(p0, L->p0, sizeof p0) == 0 && memcmp(p1, L->p1, sizeof p1) == 0);
    free(now);
  } else {
    for (int k = 0; k < 3; ++k) CHECK_OK(live_step(L));
    CHECK_OK(dsopt_state_load(L->opt, L->blob, L->size)); /* back to the saved state */
  }
  free(b);
}

static void expect_load(live *L, const char *name, uint64_t off, const void *value, size_t len,
                        int expected, const char *words) {
  const patch p = {name, off, value, len};
  expect_load_patched(L, &p, 1, expected, words);
}

/* ---- configs -------------------------------------------------------------- */

static int create_with(const char *config) {
  dsopt_comm *comm = NULL;
  dsopt_comm_create_local(&comm);
  float p[4] = {0.f, 1.f, 2.f, 3.f};
  const dsopt_tensor t = {p, 4, DSOPT_FLOAT32, 0};
  dsopt_optimizer *opt = NULL;
  const int rc = dsopt_create(&opt, config, comm, &t, 1);
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  return rc;
}

/* nlohmann::json reports numbers beyond double as out_of_range, which
 * dsopt_create passed on as DSOPT_EINTERNAL. */
static void config_numbers_beyond_double_are_einval(void) {
  CHECK_STATUS(create_with("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e400}}}"), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("JSON");
  CHECK_STATUS(create_with("{\"optimizer\": {\"type\": \"AdamW\"}, \"threads\": -1e400}"), DSOPT_EINVAL);
  CHECK_STATUS(create_with("{\"optimizer\": {\"type\": \"AdamW\"}, \"train_batch_size\": 1e999}"), DSOPT_EINVAL);
}

/* Deep nesting under an accepted-and-ignored key reached nlohmann::json's
 * recursive dump() and overflowed the stack (SIGSEGV at ~100,000 levels). */
static char *nested(const char *head, int depth) {
  const size_t n = strlen(head);
  char *s = malloc(n + 2 * (size_t)depth + 2);
  memcpy(s, head, n);
  char *p = s + n;
  for (int i = 0; i < depth; ++i) *p++ = '[';
  for (int i = 0; i < depth; ++i) *p++ = ']';
  *p++ = '}';
  *p = '\0';
  return s;
}

static void config_deep_nesting_is_einval(void) {
  const int depths[3] = {65, 1000, 300000};
  for (int d = 0; d < 3; ++d) {
    char *s = nested("{\"optimizer\": {\"type\": \"AdamW\"}, \"train_batch_size\": ", depths[d]);
    CHECK_STATUS(create_with(s), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("nested");
    free(s);
    /* The same depth as a value dsopt reads (its error message dumps it). */
    s = nested("{\"optimizer\": {\"type\": \"AdamW\"}, \"gradient_clipping\": ", depths[d]);
    CHECK_STATUS(create_with(s), DSOPT_EINVAL);
    free(s);
  }
  /* 64 levels in all (the top-level object and 63 arrays), and brackets
   * inside strings, are fine. */
  char *ok = nested("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"comm_backend_name\": \"[[{{\\\"[[\"}},"
                    " \"train_batch_size\": ", 63);
  CHECK_OK(create_with(ok));
  free(ok);
}

/* ---- state blobs ------------------------------------------------------------ */

/* A compression-error world size from the blob went into
 * CompressedAllreduce::padded_length (8 P^2 per tensor): signed overflow. */
static void blob_error_world_overflow_is_ecorrupt(void) {
  const int32_t huge = 1953853305, too_big = (1 << 24) + 1;
  live L;
  if (live_open(&L, "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"freeze_step\": 2}}, \"threads\": 1}", 3)) {
    expect_load(&L, "onebit.stage", 12, &huge, 4, DSOPT_ECORRUPT, "world");
    expect_load(&L, "onebit.stage", 12, &too_big, 4, DSOPT_ECORRUPT, "world");
  }
  live_close(&L);
  if (live_open(&L, "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"freeze_step\": 2}}, \"threads\": 1}", 3)) {
    expect_load(&L, "lamb.stage", 20, &huge, 4, DSOPT_ECORRUPT, "world");
  }
  live_close(&L);
  if (live_open(&L, "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"var_freeze_step\": 2}}, \"threads\": 1}", 3)) {
    expect_load(&L, "zoadam.schedule", 44, &huge, 4, DSOPT_ECORRUPT, "world");
  }
  live_close(&L);
}

/* 0/1 Adam's local interval doubled past INT64_MAX (signed overflow). Now
 * schedules beyond 2^62 are corrupt, and the doubling saturates. */
static void blob_zero_one_schedule_overflow(void) {
  live L;
  if (live_open(&L, "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"var_freeze_step\": 1, "
                    "\"local_step_scaler\": 1, \"local_step_clipper\": 4, \"var_update_scaler\": 1}}, \"threads\": 1}", 3)) {
    const int64_t beyond = ((int64_t)1 << 62) + 1, max = (int64_t)1 << 62;
    /* Schedule: i32 frozen, i64 var_interval, var_counter, local_interval, local_counter, variance_updates. */
    expect_load(&L, "zoadam.schedule", 4, &beyond, 8, DSOPT_ECORRUPT, "schedule");
    expect_load(&L, "zoadam.schedule", 12, &beyond, 8, DSOPT_ECORRUPT, "schedule");
    expect_load(&L, "zoadam.schedule", 20, &beyond, 8, DSOPT_ECORRUPT, "schedule");
    expect_load(&L, "zoadam.schedule", 28, &beyond, 8, DSOPT_ECORRUPT, "schedule");
    expect_load(&L, "zoadam.schedule", 36, &beyond, 8, DSOPT_ECORRUPT, "schedule");
    /* At the limit the blob loads, and the next doubling saturates. */
    expect_load(&L, "zoadam.schedule", 20, &max, 8, DSOPT_OK, NULL);
  }
  live_close(&L);
}

/* Common sections no optimizer writes: a negative or huge step counter
 * (signed overflow in the step), a NaN learning rate, a loss scaler with a
 * zero or NaN scale or impossible counters. */
static void blob_impossible_common_values_are_ecorrupt(void) {
  live L;
  if (live_open(&L, "{\"optimizer\": {\"type\": \"AdamW\"}, \"fp16\": {\"enabled\": true}, \"threads\": 1}", 2)) {
    const int64_t negative = -1, huge = INT64_MAX, two62 = (int64_t)1 << 62;
    const double nan = NAN, inf = INFINITY, neg_lr = -0.5, zero = 0.0;
    const int32_t hysteresis_zero = 0;
    expect_load(&L, "common.steps", 0, &negative, 8, DSOPT_ECORRUPT, "step");
    expect_load(&L, "common.steps", 0, &huge, 8, DSOPT_ECORRUPT, "step");
    expect_load(&L, "common.lr", 0, &nan, 8, DSOPT_ECORRUPT, "learning rate");
    expect_load(&L, "common.lr", 0, &inf, 8, DSOPT_ECORRUPT, "learning rate");
    expect_load(&L, "common.lr", 0, &neg_lr, 8, DSOPT_ECORRUPT, "learning rate");
    expect_load(&L, "common.loss_scaler", 0, &zero, 8, DSOPT_ECORRUPT, "loss scale");
    expect_load(&L, "common.loss_scaler", 0, &nan, 8, DSOPT_ECORRUPT, "loss scale");
    expect_load(&L, "common.loss_scaler", 8, &negative, 8, DSOPT_ECORRUPT, "loss scale");
    expect_load(&L, "common.loss_scaler", 16, &huge, 8, DSOPT_ECORRUPT, "loss scale");
    expect_load(&L, "common.loss_scaler", 24, &hysteresis_zero, 4, DSOPT_ECORRUPT, "loss scale");
    /* 2^62 steps is legal and keeps stepping. */
    expect_load(&L, "common.steps", 0, &two62, 8, DSOPT_OK, NULL);
  }
  live_close(&L);
}

/* A zero.layout world beyond INT32_MAX became a negative world in the
 * layout built from it, a zero bucket size, and an endless loop allocating
 * buckets (out of memory) in dsopt_state_load_shards. */
static void blob_zero_layout_world_beyond_int32_is_ecorrupt(void) {
  live L;
  if (live_open(&L, "{\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2, "
                    "\"reduce_bucket_size\": 4}, \"threads\": 1}", 2)) {
    /* zero.layout: i32 stage, u32 world, u32 rank, i64 bucket, i64 shard, i64 masters */
    const uint32_t worlds[3] = {0xFFFFFFFFu, 0x80000000u, 0x80000001u};
    const int64_t one = 1; /* bucket 1: rounded to 2P, which was <= 0 */
    for (int i = 0; i < 3; ++i) {
      const patch p[2] = {{"zero.layout", 4, &worlds[i], 4}, {"zero.layout", 12, &one, 8}};
      expect_load_patched(&L, p, 2, DSOPT_ECORRUPT, "zero.layout");
    }
  }
  live_close(&L);
}

int main(void) {
  RUN_TEST(config_numbers_beyond_double_are_einval);
  RUN_TEST(config_deep_nesting_is_einval);
  RUN_TEST(blob_error_world_overflow_is_ecorrupt);
  RUN_TEST(blob_zero_one_schedule_overflow);
  RUN_TEST(blob_impossible_common_values_are_ecorrupt);
  RUN_TEST(blob_zero_layout_world_beyond_int32_is_ecorrupt);
  return check_finish();
}

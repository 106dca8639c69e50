/* 1-bit Adam's and 1-bit LAMB's bad inputs: configs that dsopt_create rejects (DSOPT_EINVAL,
 * the message naming the key), and dsopt_set_momentum_mask calls that fail
 * (wrong numel, dtype, index, NULL handle; DSOPT_EUNSUPPORTED on Adam). A
 * failed call changes nothing: parameters and the state blob are
 * byte-identical, and since masks are not in the blob, the next compressed
 * steps also equal those of a twin optimizer that never saw the bad call
 * (so a failed call did not replace or clear the mask set before it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/model.h"

#define NUM_TENSORS 3
static const tensor_spec model_specs[NUM_TENSORS] = {
    {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {7, DSOPT_FLOAT16, DSOPT_FLOAT16, 1},
    {100, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
};

#define ONEBIT_PARAMS "\"lr\": 0.01, \"weight_decay\": 0.01, \"freeze_step\": 3"
static const char good_config[] =
    "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {" ONEBIT_PARAMS "}},"
    " \"param_groups\": [{}, {\"lr\": 0.02}], \"threads\": 1}";

/* ---- create -------------------------------------------------------------- */

static void check_create_rejected(const char *config, int expected_status, const char *words, const char *file,
                                  int line) {
  dsopt_comm *comm = NULL;
  dsopt_comm_create_local(&comm);
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 21);
  uint64_t before_size;
  unsigned char *before = model_snapshot(&m, &before_size);
  dsopt_optimizer *opt = NULL;
  int status = dsopt_create(&opt, config, comm, m.params, NUM_TENSORS);
  check_report(status == expected_status, file, line, "dsopt_create(%s) returned %d (%s), expected %d (%s)", config,
               status, dsopt_status_string(status), expected_status, dsopt_status_string(expected_status));
  check_report(check_mentions_any(dsopt_last_error(), words), file, line, "message \"%s\" should mention \"%s\"",
               dsopt_last_error(), words);
  check_report(model_matches_snapshot(&m, before, before_size), file, line, "parameters unchanged");
  check_report(status != DSOPT_OK || opt == NULL, file, line, "no optimizer on failure");
  if (status == DSOPT_OK) dsopt_destroy(opt);
  free(before);
  model_free(&m);
  dsopt_comm_destroy(comm);
}

#define CHECK_CONFIG_REJECTED(config, words) \
  check_create_rejected((config), DSOPT_EINVAL, (words), __FILE__, __LINE__)
#define ONEBIT_WITH(params) \
  "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {" params "}}, \"param_groups\": [{}, {}]}"
#define ONEBIT_GROUPS(group1) \
  "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {" ONEBIT_PARAMS "}}, \"param_groups\": [{}, " group1 "]}"

static void create_accepts_the_good_config(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 20);
  CHECK_OK(dsopt_comm_create_local(&comm));
  CHECK_OK(dsopt_create(&opt, good_config, comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  /* accepted and ignored, as DeepSpeed does */
  CHECK_OK(dsopt_create(&opt, ONEBIT_WITH("\"bias_correction\": true, \"eps_inside_sqrt\": false, \"amsgrad\": false,"
                                          " \"comm_backend_name\": \"mpi\", \"cuda_aware\": false"),
                        comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  CHECK_OK(dsopt_create(&opt, ONEBIT_GROUPS("{\"non_freeze\": true}"), comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  CHECK_OK(dsopt_create(&opt, ONEBIT_WITH("\"freeze_step\": 1"), comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  CHECK_OK(dsopt_create(&opt, ONEBIT_WITH("\"stabilize\": false, \"stabilize_limit\": 0.5"), comm, m.params,
                        NUM_TENSORS));
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void create_rejects_bad_onebit_configs(void) {
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"max_grad_norm\": 1.0"), "gradient_clipping");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"max_grad_norm\": 0.0"), "gradient_clipping");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"amsgrad\": true"), "amsgrad");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": 0"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": -4"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": 2.5"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": \"4\""), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": true"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freeze_step\": 18446744073709551617"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"freze_step\": 4"), "optimizer.params.freze_step");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"adam_w_mode\": true"), "optimizer.params.adam_w_mode");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"lr\": -1"), "optimizer.params.lr");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"betas\": [0.9]"), "betas");
  CHECK_CONFIG_REJECTED(ONEBIT_GROUPS("{\"non_freeze\": \"yes\"}"), "param_groups[1].non_freeze");
  CHECK_CONFIG_REJECTED(ONEBIT_GROUPS("{\"non_freeze\": 1}"), "param_groups[1].non_freeze");
  CHECK_CONFIG_REJECTED(ONEBIT_GROUPS("{\"non_frieze\": true}"), "param_groups[1].non_frieze");
  CHECK_CONFIG_REJECTED(ONEBIT_GROUPS("{\"freeze_step\": 5}"), "param_groups[1].freeze_step");
  /* non_freeze means nothing to Adam */
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"Adam\"}, \"param_groups\": [{}, {\"non_freeze\": true}]}",
                        "non_freeze");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\"}, \"param_groups\": [{}, {\"non_freeze\": false}]}",
                        "non_freeze");
  /* the stabilized compression stage: a bool, and a limit > 0 that is an fp32 number ("stabilize:" with
   * its colon, since "stabilize" alone would also match the stabilize_limit key) */
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize\": 1"), "optimizer.params.stabilize:");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize\": \"true\""), "optimizer.params.stabilize:");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize_limit\": 0"), "optimizer.params.stabilize_limit");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize_limit\": -1"), "optimizer.params.stabilize_limit");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize_limit\": 1e40"), "optimizer.params.stabilize_limit");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize_limit\": \"x\""), "optimizer.params.stabilize_limit");
  CHECK_CONFIG_REJECTED(ONEBIT_WITH("\"stabilize_limit\": true"), "optimizer.params.stabilize_limit");
  /* freeze_step is a 1-bit key */
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"freeze_step\": 4}}}",
                        "optimizer.params.freeze_step");
  /* and so are stabilize and stabilize_limit */
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"stabilize\": true}}}",
                        "optimizer.params.stabilize:");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"stabilize_limit\": 1}}}",
                        "optimizer.params.stabilize_limit");
}

#define LAMB_WITH(params) \
  "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {" params "}}, \"param_groups\": [{}, {}]}"

static void create_accepts_lamb_configs(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 24);
  CHECK_OK(dsopt_comm_create_local(&comm));
  CHECK_OK(dsopt_create(&opt, LAMB_WITH("\"lr\": 0.011, \"max_coeff\": 0.3, \"min_coeff\": 0.01, \"freeze_step\": 1000,"
                                        " \"coeff_beta\": 0.9, \"factor_max\": 4.0, \"factor_min\": 0.5,"
                                        " \"factor_threshold\": 0.1, \"weight_decay\": 0.01"),
                        comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  /* accepted and ignored, as DeepSpeed does */
  CHECK_OK(dsopt_create(&opt, LAMB_WITH("\"bias_correction\": false, \"eps_inside_sqrt\": true, \"amsgrad\": false,"
                                        " \"comm_backend_name\": \"nccl\", \"stabilize\": false,"
                                        " \"stabilize_limit\": 2"),
                        comm, m.params, NUM_TENSORS));
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void create_rejects_bad_lamb_configs(void) {
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"max_grad_norm\": 1.0"), "gradient_clipping");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"amsgrad\": true"), "amsgrad");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"max_coef\": 1"), "optimizer.params.max_coef");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"min_coeff\": 0"), "optimizer.params.min_coeff");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"max_coeff\": 0.001"), "optimizer.params.max_coeff");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"coeff_beta\": 1.0"), "optimizer.params.coeff_beta");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"factor_min\": 0"), "optimizer.params.factor_min");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"factor_max\": 0.1"), "optimizer.params.factor_max");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"factor_threshold\": -0.1"), "optimizer.params.factor_threshold");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"factor_threshold\": \"x\""), "optimizer.params.factor_threshold");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"freeze_step\": 0"), "optimizer.params.freeze_step");
  CHECK_CONFIG_REJECTED(LAMB_WITH("\"stabilize_limit\": 0"), "optimizer.params.stabilize_limit");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"OneBitLamb\"}, \"param_groups\": [{}, {\"non_freeze\": true}]}",
                        "non_freeze");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"max_coeff\": 1}}}",
                        "optimizer.params.max_coeff");
}

/* ---- dsopt_set_momentum_mask: a twin that never sees the bad call ---------- */

typedef struct twin {
  dsopt_comm *comm;
  model model_a, model_b;
  dsopt_optimizer *a, *b;
  rng grad_rng;
  float *mask0, *mask2;
  unsigned char *params_before, *state_before;
  uint64_t params_size, state_size;
} twin;

static void twin_step_both(twin *t) {
  model_random_grads(&t->model_a, &t->grad_rng, 1.0, 1.0);
  dsopt_step_info ia, ib;
  memset(&ia, 0, sizeof ia);
  memset(&ib, 0, sizeof ib);
  ia.struct_size = ib.struct_size = sizeof ia;
  CHECK_OK(dsopt_step(t->a, t->model_a.grads, NUM_TENSORS, &ia));
  CHECK_OK(dsopt_step(t->b, t->model_a.grads, NUM_TENSORS, &ib));
  CHECK(ia.compressed == ib.compressed);
}

static dsopt_tensor mask_tensor(float *data, int64_t numel) {
  dsopt_tensor m;
  m.data = data;
  m.numel = numel;
  m.dtype = DSOPT_FLOAT32;
  m.group = 0;
  return m;
}

/* Two optimizers, two warmup steps (the next one is compressed: freeze_step
 * 3), the same masks on parameters 0 and 2. */
static int twin_open(twin *t) {
  memset(t, 0, sizeof *t);
  t->grad_rng = rng_seeded(31);
  model_init(&t->model_a, model_specs, NUM_TENSORS, 32);
  model_init(&t->model_b, model_specs, NUM_TENSORS, 32);
  t->mask0 = (float *)malloc(33 * sizeof(float));
  t->mask2 = (float *)malloc(100 * sizeof(float));
  for (int i = 0; i < 33; ++i) t->mask0[i] = (i % 3) ? 1.0f : 0.0f;
  for (int i = 0; i < 100; ++i) t->mask2[i] = i < 50 ? 1.0f : 0.0f;
  if (!CHECK_OK(dsopt_comm_create_local(&t->comm))) return 0;
  if (!CHECK_OK(dsopt_create(&t->a, good_config, t->comm, t->model_a.params, NUM_TENSORS))) return 0;
  if (!CHECK_OK(dsopt_create(&t->b, good_config, t->comm, t->model_b.params, NUM_TENSORS))) return 0;
  twin_step_both(t);
  twin_step_both(t);
  dsopt_tensor m0 = mask_tensor(t->mask0, 33), m2 = mask_tensor(t->mask2, 100);
  CHECK_OK(dsopt_set_momentum_mask(t->a, 0, &m0));
  CHECK_OK(dsopt_set_momentum_mask(t->b, 0, &m0));
  CHECK_OK(dsopt_set_momentum_mask(t->a, 2, &m2));
  CHECK_OK(dsopt_set_momentum_mask(t->b, 2, &m2));
  /* dsopt keeps a copy: the caller's buffer may change afterwards */
  for (int i = 0; i < 33; ++i) t->mask0[i] = 0.5f;
  return 1;
}

static void twin_close(twin *t) {
  dsopt_destroy(t->a);
  dsopt_destroy(t->b);
  dsopt_comm_destroy(t->comm);
  model_free(&t->model_a);
  model_free(&t->model_b);
  free(t->mask0);
  free(t->mask2);
  free(t->params_before);
  free(t->state_before);
}

static void twin_snapshot(twin *t) {
  free(t->params_before);
  free(t->state_before);
  t->params_before = model_snapshot(&t->model_a, &t->params_size);
  t->state_before = state_blob(t->a, &t->state_size);
}

static void twin_check_unchanged_and_working(twin *t, const char *file, int line) {
  uint64_t state_size;
  unsigned char *state = state_blob(t->a, &state_size);
  check_report(model_matches_snapshot(&t->model_a, t->params_before, t->params_size), file, line,
               "parameters unchanged by the failed call");
  check_report(same_bytes(state, state_size, t->state_before, t->state_size), file, line,
               "state blob unchanged by the failed call");
  free(state);
  twin_step_both(t); /* compressed steps: the masks are applied */
  uint64_t size_a, size_b;
  unsigned char *blob_a = state_blob(t->a, &size_a);
  unsigned char *blob_b = state_blob(t->b, &size_b);
  check_report(model_params_identical(&t->model_a, &t->model_b), file, line,
               "the next step gives the same parameters as on the twin (the masks were kept)");
  check_report(same_bytes(blob_a, size_a, blob_b, size_b), file, line,
               "the next step gives the same state as on the twin");
  free(blob_a);
  free(blob_b);
}

static void check_mask_rejected(twin *t, int64_t index, const dsopt_tensor *mask, int expected, const char *words,
                                const char *file, int line) {
  twin_snapshot(t);
  int status = dsopt_set_momentum_mask(t->a, index, mask);
  check_report(status == expected, file, line, "dsopt_set_momentum_mask(index %lld) returned %d (%s), expected %d (%s)",
               (long long)index, status, dsopt_status_string(status), expected, dsopt_status_string(expected));
  check_report(check_mentions_any(dsopt_last_error(), words), file, line, "message \"%s\" should mention \"%s\"",
               dsopt_last_error(), words);
  twin_check_unchanged_and_working(t, file, line);
}

#define CHECK_MASK_REJECTED(t, index, mask, words) \
  check_mask_rejected((t), (index), (mask), DSOPT_EINVAL, (words), __FILE__, __LINE__)

static void set_momentum_mask_rejects_bad_masks(void) {
  twin t;
  if (!twin_open(&t)) {
    twin_close(&t);
    return;
  }
  float *buf = (float *)calloc(200, sizeof(float));
  dsopt_tensor m = mask_tensor(buf, 32);
  CHECK_MASK_REJECTED(&t, 0, &m, "numel|33");
  m.numel = 34;
  CHECK_MASK_REJECTED(&t, 0, &m, "numel|33");
  m.numel = 0;
  CHECK_MASK_REJECTED(&t, 0, &m, "numel");
  m.numel = -33;
  CHECK_MASK_REJECTED(&t, 0, &m, "numel");
  m.numel = 33;
  m.dtype = DSOPT_FLOAT16;
  CHECK_MASK_REJECTED(&t, 0, &m, "dtype|float32|FLOAT32");
  m.dtype = DSOPT_BFLOAT16;
  CHECK_MASK_REJECTED(&t, 0, &m, "dtype|float32|FLOAT32");
  m.dtype = 7;
  CHECK_MASK_REJECTED(&t, 0, &m, "dtype|float32|FLOAT32");
  /* the mask's dtype is fp32 whatever the parameter's */
  m = mask_tensor(buf, 7);
  m.dtype = DSOPT_FLOAT16;
  CHECK_MASK_REJECTED(&t, 1, &m, "dtype|float32|FLOAT32");
  m = mask_tensor(NULL, 33);
  CHECK_MASK_REJECTED(&t, 0, &m, "data|NULL|null");
  m = mask_tensor(buf, 33);
  CHECK_MASK_REJECTED(&t, -1, &m, "param_index|range");
  CHECK_MASK_REJECTED(&t, NUM_TENSORS, &m, "param_index|range");
  CHECK_MASK_REJECTED(&t, (int64_t)1 << 40, &m, "param_index|range");
  CHECK_MASK_REJECTED(&t, -1, NULL, "param_index|range");

  /* NULL handle */
  CHECK_STATUS(dsopt_set_momentum_mask(NULL, 0, &m), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_momentum_mask(NULL, 0, NULL), DSOPT_EINVAL);

  check_skip("a CUDA device pointer as the mask of a CPU optimizer", "needs a GPU (tests/gpu)");
  free(buf);
  twin_close(&t);
}

static void set_momentum_mask_null_clears_and_a_mask_matters(void) {
  twin t;
  if (!twin_open(&t)) {
    twin_close(&t);
    return;
  }
  /* clearing on one twin only: the next compressed step differs */
  CHECK_OK(dsopt_set_momentum_mask(t.a, 0, NULL));
  CHECK_OK(dsopt_set_momentum_mask(t.a, 0, NULL)); /* clearing twice is fine */
  twin_step_both(&t);
  CHECK(!model_params_identical(&t.model_a, &t.model_b));
  twin_close(&t);
}

static void set_momentum_mask_on_adam_is_unsupported(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 40);
  CHECK_OK(dsopt_comm_create_local(&comm));
  const char *configs[] = {"{\"optimizer\": {\"type\": \"AdamW\"}, \"param_groups\": [{}, {}]}",
                           "{\"optimizer\": {\"type\": \"Adam\"}, \"param_groups\": [{}, {}]}"};
  float ones[33];
  for (int i = 0; i < 33; ++i) ones[i] = 1.0f;
  dsopt_tensor mask = mask_tensor(ones, 33);
  for (int c = 0; c < 2; ++c) {
    if (!CHECK_OK(dsopt_create(&opt, configs[c], comm, m.params, NUM_TENSORS))) continue;
    CHECK_OK(dsopt_step(opt, m.grads, NUM_TENSORS, NULL));
    uint64_t before_size, after_size;
    unsigned char *before = state_blob(opt, &before_size);
    CHECK_STATUS(dsopt_set_momentum_mask(opt, 0, &mask), DSOPT_EUNSUPPORTED);
    CHECK_ERROR_MENTIONS("mask");
    CHECK_STATUS(dsopt_set_momentum_mask(opt, 0, NULL), DSOPT_EUNSUPPORTED);
    unsigned char *after = state_blob(opt, &after_size);
    CHECK(same_bytes(before, before_size, after, after_size));
    free(before);
    free(after);
    dsopt_destroy(opt);
  }
  dsopt_comm_destroy(comm);
  model_free(&m);
}

int main(void) {
  RUN_TEST(create_accepts_the_good_config);
  RUN_TEST(create_rejects_bad_onebit_configs);
  RUN_TEST(create_accepts_lamb_configs);
  RUN_TEST(create_rejects_bad_lamb_configs);
  RUN_TEST(set_momentum_mask_rejects_bad_masks);
  RUN_TEST(set_momentum_mask_null_clears_and_a_mask_matters);
  RUN_TEST(set_momentum_mask_on_adam_is_unsupported);
  return check_finish();
}

/* Every bad input gives its own status, a message naming the problem, and
 * changes nothing: the parameters and the state blob are byte-identical
 * before and after, and the next step equals the step of a twin optimizer
 * that never saw the bad call. */
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

#define GOOD_OPTIMIZER "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}"
#define GOOD_GROUPS "\"param_groups\": [{\"lr\": 0.02}, {\"weight_decay\": 0.0}]"
static const char good_config[] = "{" GOOD_OPTIMIZER ", " GOOD_GROUPS "}";

/* ---- create: nothing is created, the parameters are not touched ---------- */

static void check_create_rejected(const char *config, const dsopt_tensor *params, int64_t num_params,
                                  int expected_status, const char *words, const char *file, int line) {
  dsopt_comm *comm = NULL;
  dsopt_comm_create_local(&comm);
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 21);
  uint64_t before_size;
  unsigned char *before = model_snapshot(&m, &before_size);
  dsopt_optimizer *opt = NULL;
  /* `params` NULL stands for the model's own, valid tensors. */
  int status = dsopt_create(&opt, config, comm, params ? params : m.params, num_params);
  check_report(status == expected_status, file, line, "dsopt_create(%s) returned %d (%s), expected %d (%s)",
               config ? config : "NULL", status, dsopt_status_string(status), expected_status,
               dsopt_status_string(expected_status));
  check_report(check_mentions_any(dsopt_last_error(), words), file, line,
               "message \"%s\" should mention \"%s\"", dsopt_last_error(), words);
  check_report(model_matches_snapshot(&m, before, before_size), file, line, "parameters unchanged");
  if (status == DSOPT_OK) dsopt_destroy(opt);
  free(before);
  model_free(&m);
  dsopt_comm_destroy(comm);
}

#define CHECK_CONFIG_REJECTED(config, status, words) \
  check_create_rejected((config), NULL, NUM_TENSORS, (status), (words), __FILE__, __LINE__)
#define CHECK_TENSORS_REJECTED(params, count, status, words) \
  check_create_rejected(good_config, (params), (count), (status), (words), __FILE__, __LINE__)

static void create_rejects_null_arguments(void) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 22);
  CHECK_OK(dsopt_comm_create_local(&comm));
  CHECK_STATUS(dsopt_create(NULL, good_config, comm, m.params, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("out");
  CHECK_STATUS(dsopt_create(&opt, NULL, comm, m.params, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("config");
  CHECK_STATUS(dsopt_create(&opt, good_config, NULL, m.params, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("comm");
  CHECK_STATUS(dsopt_create(&opt, good_config, comm, NULL, NUM_TENSORS), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params");
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void create_rejects_bad_tensors(void) {
  model m;
  model_init(&m, model_specs, NUM_TENSORS, 23);
  dsopt_tensor bad[NUM_TENSORS];

  CHECK_TENSORS_REJECTED(m.params, 0, DSOPT_EINVAL, "num_params|parameters|params");
  CHECK_TENSORS_REJECTED(m.params, -1, DSOPT_EINVAL, "num_params|parameters|params");

  memcpy(bad, m.params, sizeof bad);
  bad[1].data = NULL;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "data|null");

  memcpy(bad, m.params, sizeof bad);
  bad[1].numel = 0;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "numel");
  bad[1].numel = -7;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "numel");

  memcpy(bad, m.params, sizeof bad);
  bad[2].dtype = 7;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "dtype");
  bad[2].dtype = -1;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "dtype");

  memcpy(bad, m.params, sizeof bad);
  bad[0].group = 2; /* the config has groups 0 and 1 */
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "group");
  bad[0].group = -1;
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "group");

  /* shared storage: every parameter would be updated twice per step */
  memcpy(bad, m.params, sizeof bad);
  bad[2].data = bad[0].data; /* the same buffer twice */
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "params[0] and params[2]");
  float *buffer = calloc(200, sizeof(float));
  memcpy(bad, m.params, sizeof bad);
  bad[0].data = buffer;                   /* 33 floats: bytes [0, 132) */
  bad[2].data = (char *)buffer + 130;     /* 100 bf16: bytes [130, 330) */
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "params[0] and params[2]");
  bad[1].data = (char *)buffer + 328;     /* 7 fp16 overlapping the end of params[2] */
  bad[2].data = (char *)buffer + 132;     /* now adjacent to params[0] */
  CHECK_TENSORS_REJECTED(bad, NUM_TENSORS, DSOPT_EINVAL, "params[1] and params[2]");
  bad[1].data = (char *)buffer + 332;     /* three views back to back: fine */
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  CHECK_OK(dsopt_comm_create_local(&comm));
  CHECK_OK(dsopt_create(&opt, good_config, comm, bad, NUM_TENSORS));
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  free(buffer);
  model_free(&m);
}

static void create_rejects_unknown_keys_naming_their_path(void) {
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"learning_rate\": 0.1}", DSOPT_EINVAL, "learning_rate");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"freze_step\": 10}}}",
                        DSOPT_EINVAL, "optimizer.params.freze_step");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"parms\": {}}}", DSOPT_EINVAL, "optimizer.parms");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"fp16\": {\"enabled\": true, \"loss_scael\": 0}}", DSOPT_EINVAL,
                        "fp16.loss_scael");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"param_groups\": [{\"lr\": 0.1}, {\"momentum\": 0.9}]}",
                        DSOPT_EINVAL, "momentum");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"zero_optimization\": {\"stage\": 0, \"offload_optimiser\": {}}}",
                        DSOPT_EINVAL, "offload_optimiser");
}

static void create_rejects_values_of_the_wrong_type(void) {
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"0.01\"}}}", DSOPT_EINVAL, "lr");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9]}}}", DSOPT_EINVAL,
                        "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, 0.99, 0.999]}}}",
                        DSOPT_EINVAL, "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": 0.9}}}", DSOPT_EINVAL,
                        "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [\"0.9\", 0.999]}}}",
                        DSOPT_EINVAL, "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"eps\": true}}}", DSOPT_EINVAL, "eps");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"bias_correction\": \"yes\"}}}",
                        DSOPT_EINVAL, "bias_correction");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": 5}}", DSOPT_EINVAL, "type");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"param_groups\": {\"lr\": 0.1}}", DSOPT_EINVAL, "param_groups");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"gradient_clipping\": \"1.0\"}", DSOPT_EINVAL, "gradient_clipping");
  CHECK_CONFIG_REJECTED("[1, 2]", DSOPT_EINVAL, "object|config");
}

static void create_rejects_values_out_of_range(void) {
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": -0.001}}}", DSOPT_EINVAL, "lr");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [1.0, 0.999]}}}",
                        DSOPT_EINVAL, "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9, 1.0]}}}", DSOPT_EINVAL,
                        "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [-0.1, 0.999]}}}",
                        DSOPT_EINVAL, "betas");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"eps\": 0}}}", DSOPT_EINVAL, "eps");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"eps\": -1e-8}}}", DSOPT_EINVAL, "eps");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"weight_decay\": -0.01}}}",
                        DSOPT_EINVAL, "weight_decay");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"param_groups\": [{\"lr\": 0.1}, {\"lr\": -1}]}", DSOPT_EINVAL,
                        "lr");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"param_groups\": [{\"betas\": [0.9, 1.5]}, {}]}", DSOPT_EINVAL,
                        "betas");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"gradient_clipping\": -1.0}", DSOPT_EINVAL, "gradient_clipping");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"fp16\": {\"enabled\": true, \"loss_scale\": -1}}", DSOPT_EINVAL,
                        "loss_scale");
  /* A window of 0 would divide by zero in the scaler rule. */
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"fp16\": {\"enabled\": true, \"loss_scale_window\": 0}}",
                        DSOPT_EINVAL, "loss_scale_window");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"fp16\": {\"enabled\": true, \"min_loss_scale\": -1}}", DSOPT_EINVAL,
                        "min_loss_scale");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"threads\": -1}", DSOPT_EINVAL, "threads");
}

static void create_rejects_unsupported_choices(void) {
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"amsgrad\": true}}}", DSOPT_EINVAL,
                        "amsgrad");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"Adamax\"}}", DSOPT_EINVAL, "Adamax");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"params\": {\"lr\": 0.01}}}", DSOPT_EINVAL, "type");
  CHECK_CONFIG_REJECTED("{\"device\": \"cpu\"}", DSOPT_EINVAL, "optimizer");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"OneBitAdam\"}, \"zero_optimization\": {\"stage\": 1}}",
                        DSOPT_EUNSUPPORTED, "Adam, AdamW and SGD");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"device\": \"tpu\"}", DSOPT_EINVAL, "device");
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                        DSOPT_EINVAL, "bf16|fp16");
}

static void create_rejects_invalid_json(void) {
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\",}", DSOPT_EINVAL, "json");
  CHECK_CONFIG_REJECTED("", DSOPT_EINVAL, "json");
  CHECK_CONFIG_REJECTED("{\"optimizer\": {\"type\": \"AdamW\"}} trailing", DSOPT_EINVAL, "json");
}

static void cuda_device_without_cuda_build_is_unsupported(void) {
  if (!strstr(dsopt_build_info(), "cuda=off")) {
    check_skip("cuda_device_without_cuda_build_is_unsupported", "this library is built with CUDA");
    return;
  }
  CHECK_CONFIG_REJECTED("{" GOOD_OPTIMIZER ", \"device\": \"cuda\"}", DSOPT_EUNSUPPORTED, "DSOPT_WITH_CUDA");
}

/* ---- calls on an optimizer: a twin that never sees the bad call ---------- */

typedef struct twin {
  dsopt_comm *comm;
  model model_a, model_b; /* same parameters, separate buffers */
  dsopt_optimizer *a;     /* gets the bad calls */
  dsopt_optimizer *b;     /* never does */
  rng grad_rng;
  unsigned char *params_before, *state_before;
  uint64_t params_size, state_size;
} twin;

static void twin_step_both(twin *t) {
  model_random_grads(&t->model_a, &t->grad_rng, 1.0, 1.0);
  CHECK_OK(dsopt_step(t->a, t->model_a.grads, NUM_TENSORS, NULL));
  CHECK_OK(dsopt_step(t->b, t->model_a.grads, NUM_TENSORS, NULL));
}

/* Two optimizers with the same config and parameters, two steps taken. */
static int twin_open(twin *t, const char *config) {
  memset(t, 0, sizeof *t);
  t->grad_rng = rng_seeded(31);
  model_init(&t->model_a, model_specs, NUM_TENSORS, 32);
  model_init(&t->model_b, model_specs, NUM_TENSORS, 32);
  if (!CHECK_OK(dsopt_comm_create_local(&t->comm))) return 0;
  if (!CHECK_OK(dsopt_create(&t->a, config, t->comm, t->model_a.params, NUM_TENSORS))) return 0;
  if (!CHECK_OK(dsopt_create(&t->b, config, t->comm, t->model_b.params, NUM_TENSORS))) return 0;
  twin_step_both(t);
  twin_step_both(t);
  return 1;
}

static void twin_close(twin *t) {
  dsopt_destroy(t->a);
  dsopt_destroy(t->b);
  dsopt_comm_destroy(t->comm);
  model_free(&t->model_a);
  model_free(&t->model_b);
  free(t->params_before);
  free(t->state_before);
}

static void twin_snapshot(twin *t) {
  free(t->params_before);
  free(t->state_before);
  t->params_before = model_snapshot(&t->model_a, &t->params_size);
  t->state_before = state_blob(t->a, &t->state_size);
}

/* After a failed call on `a`: nothing changed, and a step on both keeps them
 * byte-identical. */
static void twin_check_unchanged_and_working(twin *t, const char *file, int line) {
  uint64_t state_size;
  unsigned char *state = state_blob(t->a, &state_size);
  check_report(model_matches_snapshot(&t->model_a, t->params_before, t->params_size), file, line,
               "parameters unchanged by the failed call");
  check_report(same_bytes(state, state_size, t->state_before, t->state_size), file, line,
               "state blob unchanged by the failed call");
  free(state);

  twin_step_both(t);
  uint64_t size_a, size_b;
  unsigned char *blob_a = state_blob(t->a, &size_a);
  unsigned char *blob_b = state_blob(t->b, &size_b);
  check_report(model_params_identical(&t->model_a, &t->model_b), file, line,
               "the next step gives the same parameters as on the twin that never saw the bad call");
  check_report(same_bytes(blob_a, size_a, blob_b, size_b), file, line,
               "the next step gives the same state as on the twin that never saw the bad call");
  free(blob_a);
  free(blob_b);
}

/* Runs `call` on the twin's `a`; expects `status` and a message with one of
 * `words`; then checks nothing changed and the optimizer still works. */
#define CHECK_REJECTED(t, call, status, words)                  \
  do {                                                          \
    twin_snapshot(t);                                           \
    CHECK_STATUS((call), (status));                             \
    CHECK_ERROR_MENTIONS(words);                                \
    twin_check_unchanged_and_working((t), __FILE__, __LINE__);  \
  } while (0)

static void step_rejects_bad_arguments(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    dsopt_tensor bad[NUM_TENSORS + 1];
    const dsopt_tensor *grads = t.model_a.grads;
    dsopt_step_info info;
    info.struct_size = sizeof info;

    CHECK_REJECTED(&t, dsopt_step(NULL, grads, NUM_TENSORS, &info), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_step(t.a, NULL, NUM_TENSORS, &info), DSOPT_EINVAL, "grads|gradients");
    CHECK_REJECTED(&t, dsopt_step(t.a, grads, NUM_TENSORS - 1, &info), DSOPT_EINVAL, "num_grads|grads|gradients");
    memcpy(bad, grads, NUM_TENSORS * sizeof bad[0]);
    bad[NUM_TENSORS] = grads[0];
    CHECK_REJECTED(&t, dsopt_step(t.a, bad, NUM_TENSORS + 1, &info), DSOPT_EINVAL, "num_grads|grads|gradients");
    CHECK_REJECTED(&t, dsopt_step(t.a, grads, 0, &info), DSOPT_EINVAL, "num_grads|grads|gradients");
    CHECK_REJECTED(&t, dsopt_step(t.a, grads, -1, &info), DSOPT_EINVAL, "num_grads|grads|gradients");

    memcpy(bad, grads, NUM_TENSORS * sizeof bad[0]);
    bad[1].numel = 8; /* the parameter has 7 */
    CHECK_REJECTED(&t, dsopt_step(t.a, bad, NUM_TENSORS, &info), DSOPT_EINVAL, "numel");
    bad[1].numel = 0;
    CHECK_REJECTED(&t, dsopt_step(t.a, bad, NUM_TENSORS, &info), DSOPT_EINVAL, "numel");

    memcpy(bad, grads, NUM_TENSORS * sizeof bad[0]);
    bad[0].dtype = 7;
    CHECK_REJECTED(&t, dsopt_step(t.a, bad, NUM_TENSORS, &info), DSOPT_EINVAL, "dtype");

    /* (data NULL is an absent gradient, not an error: test_absent_grads.) */

    /* "info->struct_size must be set": 0 means the caller forgot. */
    info.struct_size = 0;
    CHECK_REJECTED(&t, dsopt_step(t.a, grads, NUM_TENSORS, &info), DSOPT_EINVAL, "struct_size");
  }
  twin_close(&t);
}

static void learning_rate_setters_reject_bad_values(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    double lr = 0.0;
    int32_t groups = 0;
    CHECK_REJECTED(&t, dsopt_set_lr(NULL, 0.1), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_set_lr(t.a, -0.5), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_lr(t.a, NAN), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_lr(t.a, INFINITY), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_lr(t.a, -INFINITY), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_group_lr(t.a, 2, 0.1), DSOPT_EINVAL, "group");
    CHECK_REJECTED(&t, dsopt_set_group_lr(t.a, -1, 0.1), DSOPT_EINVAL, "group");
    CHECK_REJECTED(&t, dsopt_set_group_lr(t.a, 1, -0.1), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_group_lr(t.a, 1, NAN), DSOPT_EINVAL, "lr|learning rate");
    CHECK_REJECTED(&t, dsopt_set_group_lr(NULL, 0, 0.1), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_get_lr(t.a, 2, &lr), DSOPT_EINVAL, "group");
    CHECK_REJECTED(&t, dsopt_get_lr(t.a, 0, NULL), DSOPT_EINVAL, "out|null");
    CHECK_REJECTED(&t, dsopt_get_lr(NULL, 0, &lr), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_num_groups(NULL, &groups), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_num_groups(t.a, NULL), DSOPT_EINVAL, "out|null");
    CHECK_REJECTED(&t, dsopt_get_loss_scale(NULL, &lr), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_get_loss_scale(t.a, NULL), DSOPT_EINVAL, "out|null");
  }
  twin_close(&t);
}

static void state_size_and_save_reject_bad_arguments(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    uint64_t needed = 0, written = 0;
    CHECK_OK(dsopt_state_size(t.a, &needed));
    unsigned char *buffer = (unsigned char *)malloc(needed + 16);
    CHECK_REJECTED(&t, dsopt_state_size(NULL, &needed), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_state_size(t.a, NULL), DSOPT_EINVAL, "out|null");
    CHECK_REJECTED(&t, dsopt_state_save(NULL, buffer, needed, &written), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_state_save(t.a, NULL, needed, &written), DSOPT_EINVAL, "dst|null");
    free(buffer);
  }
  twin_close(&t);
}

/* Capacity too small: DSOPT_EBUFS, nothing written, *out_written = size. */
static void state_save_into_small_buffer_reports_needed_size(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    uint64_t needed = 0;
    CHECK_OK(dsopt_state_size(t.a, &needed));
    unsigned char *buffer = (unsigned char *)malloc(needed);
    const uint64_t capacities[] = {0, 1, 16, needed / 2, needed - 1};
    for (size_t i = 0; i < sizeof capacities / sizeof capacities[0]; ++i) {
      uint64_t written = 12345;
      memset(buffer, 0x5A, needed);
      CHECK_REJECTED(&t, dsopt_state_save(t.a, buffer, capacities[i], &written), DSOPT_EBUFS,
                     "capacity|buffer|small|bytes");
      CHECKF(written == needed, "capacity %llu: out_written %llu, expected %llu", (unsigned long long)capacities[i],
             (unsigned long long)written, (unsigned long long)needed);
      int untouched = 1;
      for (uint64_t j = 0; j < needed; ++j) untouched &= buffer[j] == 0x5A;
      CHECKF(untouched, "capacity %llu: nothing written", (unsigned long long)capacities[i]);
    }
    CHECK_REJECTED(&t, dsopt_state_save(t.a, buffer, needed - 1, NULL), DSOPT_EBUFS, "capacity|buffer|small|bytes");
    free(buffer);
  }
  twin_close(&t);
}

/* Loads `size` bytes of `blob` into the twin's `a`: `status`, a message
 * with one of `words`, nothing changed. `what` says which blob it was. */
static void check_load_rejected(twin *t, const unsigned char *blob, uint64_t size, int status,
                                const char *words, const char *what, const char *file, int line) {
  twin_snapshot(t);
  int got = dsopt_state_load(t->a, blob, size);
  check_report(got == status, file, line, "%s: status %d (%s), expected %d (%s)", what, got,
               dsopt_status_string(got), status, dsopt_status_string(status));
  check_report(check_mentions_any(dsopt_last_error(), words), file, line, "%s: message \"%s\" should mention \"%s\"",
               what, dsopt_last_error(), words);
  twin_check_unchanged_and_working(t, file, line);
}

static void state_load_rejects_truncated_blobs(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    uint64_t size;
    unsigned char *blob = state_blob(t.a, &size);
    if (CHECK(blob != NULL && size > 64)) {
      const uint64_t lengths[] = {0, 1, 4, 8, 16, 24, 32, 48, 64, size / 2, size - 8, size - 1};
      for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i) {
        char what[64];
        snprintf(what, sizeof what, "blob cut to %llu of %llu bytes", (unsigned long long)lengths[i],
                 (unsigned long long)size);
        check_load_rejected(&t, blob, lengths[i], DSOPT_ECORRUPT, "truncated|short|size|length|corrupt", what,
                            __FILE__, __LINE__);
      }
    }
    CHECK_REJECTED(&t, dsopt_state_load(t.a, NULL, size), DSOPT_EINVAL, "src|null");
    CHECK_REJECTED(&t, dsopt_state_load(NULL, blob, size), DSOPT_EINVAL, "opt|handle|null");
    free(blob);
  }
  twin_close(&t);
}

static void state_load_shards_and_memory_usage_reject_bad_arguments(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    uint64_t size;
    unsigned char *blob = state_blob(t.a, &size);
    const void *blobs[2] = {blob, NULL};
    const uint64_t sizes[2] = {size, size};
    CHECK_REJECTED(&t, dsopt_state_load_shards(NULL, blobs, sizes, 1), DSOPT_EINVAL, "opt|handle|null");
    CHECK_REJECTED(&t, dsopt_state_load_shards(t.a, NULL, sizes, 1), DSOPT_EINVAL, "blobs");
    CHECK_REJECTED(&t, dsopt_state_load_shards(t.a, blobs, NULL, 1), DSOPT_EINVAL, "sizes");
    CHECK_REJECTED(&t, dsopt_state_load_shards(t.a, blobs, sizes, 0), DSOPT_EINVAL, "num_blobs");
    CHECK_REJECTED(&t, dsopt_state_load_shards(t.a, blobs, sizes, -1), DSOPT_EINVAL, "num_blobs");
    CHECK_REJECTED(&t, dsopt_state_load_shards(t.a, blobs, sizes, 2), DSOPT_EINVAL, "blobs[1]");
    uint64_t host = 0, device = 0;
    CHECK_STATUS(dsopt_memory_usage(NULL, &host, &device), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_memory_usage(t.a, NULL, NULL), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_memory_usage(t.a, &host, NULL), DSOPT_OK);
    CHECK(host > 0);
    CHECK_STATUS(dsopt_memory_usage(t.a, NULL, &device), DSOPT_OK);
    CHECK(device == 0);
    uint64_t state_host = 0, state_device = 1;
    CHECK_STATUS(dsopt_state_memory_usage(NULL, &state_host, &state_device), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_state_memory_usage(t.a, NULL, NULL), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_state_memory_usage(t.a, &state_host, &state_device), DSOPT_OK);
    CHECK(state_host > 0 && state_host <= host && state_device == 0);
    free(blob);
  }
  twin_close(&t);
}

static void state_load_rejects_flipped_bytes(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    uint64_t size;
    unsigned char *blob = state_blob(t.a, &size);
    if (CHECK(blob != NULL && size > 64)) {
      const uint64_t positions[] = {0, 1, 3, 5, 8, 12, 17, 24, 33, size / 3, size / 2, size - 9, size - 2, size - 1};
      const unsigned char masks[] = {0xFF, 0x01, 0x80};
      unsigned char *copy = (unsigned char *)malloc(size);
      for (size_t i = 0; i < sizeof positions / sizeof positions[0]; ++i) {
        for (size_t k = 0; k < sizeof masks; ++k) {
          char what[64];
          memcpy(copy, blob, size);
          copy[positions[i]] ^= masks[k];
          snprintf(what, sizeof what, "byte %llu of %llu xor 0x%02X", (unsigned long long)positions[i],
                   (unsigned long long)size, masks[k]);
          check_load_rejected(&t, copy, size, DSOPT_ECORRUPT, "checksum|corrupt|magic|version|size|truncated", what, __FILE__,
                              __LINE__);
        }
      }
      free(copy);
    }
    free(blob);
  }
  twin_close(&t);
}

/* The blob of an optimizer created from `config` on `specs`. */
static unsigned char *blob_of(const char *config, const tensor_spec *specs, int count, uint64_t *size) {
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  unsigned char *blob = NULL;
  model m;
  model_init(&m, specs, count, 41);
  *size = 0;
  dsopt_comm_create_local(&comm);
  if (CHECK_OK(dsopt_create(&opt, config, comm, m.params, count))) {
    CHECK_OK(dsopt_step(opt, m.grads, count, NULL));
    blob = state_blob(opt, size);
    CHECK(blob != NULL);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
  return blob;
}

static void check_blob_mismatch(twin *t, const char *config, const tensor_spec *specs, int count,
                                const char *words, const char *file, int line) {
  uint64_t size;
  unsigned char *blob = blob_of(config, specs, count, &size);
  if (blob) check_load_rejected(t, blob, size, DSOPT_EMISMATCH, words, "blob of another optimizer", file, line);
  free(blob);
}

static void state_load_rejects_blobs_of_other_optimizers(void) {
  twin t;
  if (twin_open(&t, good_config)) {
    tensor_spec other[NUM_TENSORS];
    check_blob_mismatch(&t,
                        "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01, "
                        "\"adam_w_mode\": false}}, " GOOD_GROUPS "}",
                        model_specs, NUM_TENSORS, "adam|mode|algorithm|l2|decay", __FILE__, __LINE__);

    memcpy(other, model_specs, sizeof other);
    other[0].numel = 34;
    check_blob_mismatch(&t, good_config, other, NUM_TENSORS, "numel|shape|size", __FILE__, __LINE__);

    check_blob_mismatch(&t, good_config, model_specs, NUM_TENSORS - 1, "count|number|tensors|param", __FILE__,
                        __LINE__);

    memcpy(other, model_specs, sizeof other);
    other[1].param_dtype = DSOPT_FLOAT32;
    check_blob_mismatch(&t, good_config, other, NUM_TENSORS, "dtype|type", __FILE__, __LINE__);

    memcpy(other, model_specs, sizeof other);
    other[0].group = 1;
    check_blob_mismatch(&t, good_config, other, NUM_TENSORS, "group", __FILE__, __LINE__);

    check_blob_mismatch(&t, "{" GOOD_OPTIMIZER ", \"param_groups\": [{\"lr\": 0.02}, {}, {}]}", model_specs,
                        NUM_TENSORS, "group|section", __FILE__, __LINE__);
  }
  twin_close(&t);
}

/* ---- communicators --------------------------------------------------------- */

static void comm_create_rejects_null_out(void) {
  CHECK_STATUS(dsopt_comm_create_local(NULL), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("out|null");
}

/* Without MPI_Init in this program: DSOPT_EINVAL in an MPI build (MPI not
 * initialised), DSOPT_EUNSUPPORTED saying how to build it in otherwise. */
static void mpi_comm_needs_mpi(void) {
  dsopt_comm *comm = NULL;
  if (strstr(dsopt_build_info(), "mpi=off")) {
    CHECK_STATUS(dsopt_comm_create_mpi(&comm, 0), DSOPT_EUNSUPPORTED);
    CHECK_ERROR_MENTIONS("DSOPT_WITH_MPI");
  } else {
    CHECK_STATUS(dsopt_comm_create_mpi(&comm, 0), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("initiali");
    CHECK_STATUS(dsopt_comm_create_mpi(NULL, 0), DSOPT_EINVAL);
  }
  CHECK(comm == NULL);
}

static void nccl_comm_rejects_null_arguments(void) {
  dsopt_comm *comm = NULL;
  CHECK_STATUS(dsopt_comm_create_nccl(NULL, NULL, NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_comm_create_nccl(&comm, NULL, NULL), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("comm|null");
  CHECK(comm == NULL);
}

static void nccl_comm_without_nccl_build_is_unsupported(void) {
  if (!strstr(dsopt_build_info(), "nccl=off")) {
    check_skip("nccl_comm_without_nccl_build_is_unsupported", "this library is built with NCCL");
    return;
  }
  dsopt_comm *comm = NULL;
  int not_a_comm = 0; /* never dereferenced by a build without NCCL */
  CHECK_STATUS(dsopt_comm_create_nccl(&comm, (struct ncclComm *)(void *)&not_a_comm, NULL), DSOPT_EUNSUPPORTED);
  CHECK_ERROR_MENTIONS("DSOPT_WITH_NCCL");
}

int main(void) {
  RUN_TEST(create_rejects_null_arguments);
  RUN_TEST(create_rejects_bad_tensors);
  RUN_TEST(create_rejects_unknown_keys_naming_their_path);
  RUN_TEST(create_rejects_values_of_the_wrong_type);
  RUN_TEST(create_rejects_values_out_of_range);
  RUN_TEST(create_rejects_unsupported_choices);
  RUN_TEST(create_rejects_invalid_json);
  RUN_TEST(cuda_device_without_cuda_build_is_unsupported);
  RUN_TEST(step_rejects_bad_arguments);
  RUN_TEST(learning_rate_setters_reject_bad_values);
  RUN_TEST(state_size_and_save_reject_bad_arguments);
  RUN_TEST(state_save_into_small_buffer_reports_needed_size);
  RUN_TEST(state_load_rejects_truncated_blobs);
  RUN_TEST(state_load_rejects_flipped_bytes);
  RUN_TEST(state_load_shards_and_memory_usage_reject_bad_arguments);
  RUN_TEST(state_load_rejects_blobs_of_other_optimizers);
  RUN_TEST(comm_create_rejects_null_out);
  RUN_TEST(mpi_comm_needs_mpi);
  RUN_TEST(nccl_comm_rejects_null_arguments);
  RUN_TEST(nccl_comm_without_nccl_build_is_unsupported);
  return check_finish();
}

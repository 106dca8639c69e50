/* SGD on one process against references written from docs/optimizers/sgd.md
 * (torch.optim.SGD's rule): a float64 one within a tolerance, and the fp32
 * operations themselves, which the library must match bit for bit,
 * momentum buffer included. fp32 parameters with gradients of every dtype,
 * odd sizes, three groups (momentum with dampening and weight decay;
 * Nesterov; no momentum, where dampening has no effect), a learning-rate
 * and a momentum change in the middle of the run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/local_run.h"

#define STEPS 25
#define NUM_TENSORS 6
#define NUM_GROUPS 3
#define FP32_REL_TOL 2e-5

typedef struct sgd_hyper {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
} sgd_hyper;

static const sgd_hyper groups[NUM_GROUPS] = {
    {0.01, 0.9, 0.1, 0.02, 0}, {0.003, 0.8, 0.0, 0.0, 1}, {0.02, 0.0, 0.5, 0.01, 0}};
static const char *config_json =
    "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.01, \"momentum\": 0.9, "
    "\"dampening\": 0.1, \"weight_decay\": 0.02}}, \"param_groups\": [{}, {\"lr\": 0.003, "
    "\"momentum\": 0.8, \"dampening\": 0, \"weight_decay\": 0, \"nesterov\": true}, {\"lr\": 0.02, "
    "\"momentum\": 0, \"dampening\": 0.5, \"weight_decay\": 0.01}]}";

static void specs_of(tensor_spec *specs) {
  static const int64_t sizes[NUM_TENSORS] = {1, 7, 33, 1000, 4099, 100003};
  static const int32_t grads[3] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
  for (int i = 0; i < NUM_TENSORS; ++i) {
    specs[i].numel = sizes[i];
    specs[i].param_dtype = DSOPT_FLOAT32;
    specs[i].grad_dtype = grads[i % 3];
    specs[i].group = i % NUM_GROUPS;
  }
}

/* p64 and b64 in float64; p32 and b32 in the documented fp32 operations. */
typedef struct sgd_ref {
  double *p64[NUM_TENSORS], *b64[NUM_TENSORS];
  float *p32[NUM_TENSORS], *b32[NUM_TENSORS];
  sgd_hyper group[NUM_GROUPS];
  int step;
} sgd_ref;

static void ref_init(sgd_ref *ref, const model *mdl) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const int64_t n = mdl->spec[i].numel;
    const float *p = (const float *)mdl->params[i].data;
    ref->p64[i] = malloc((size_t)n * sizeof(double));
    ref->b64[i] = calloc((size_t)n, sizeof(double));
    ref->p32[i] = malloc((size_t)n * sizeof(float));
    ref->b32[i] = calloc((size_t)n, sizeof(float));
    for (int64_t k = 0; k < n; ++k) ref->p64[i][k] = ref->p32[i][k] = p[k];
  }
  memcpy(ref->group, groups, sizeof groups);
  ref->step = 0;
}

static void ref_free(sgd_ref *ref) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    free(ref->p64[i]);
    free(ref->b64[i]);
    free(ref->p32[i]);
    free(ref->b32[i]);
  }
}

static void ref_step(sgd_ref *ref, const model *mdl) {
  ++ref->step;
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const sgd_hyper *h = &ref->group[mdl->spec[i].group];
    const int fresh = ref->step == 1 || h->momentum == 0.0;
    const float mom = (float)h->momentum, keep = (float)(1.0 - h->dampening);
    const float wd = (float)h->weight_decay, step = (float)-h->lr;
    for (int64_t k = 0; k < mdl->spec[i].numel; ++k) {
      const float g = (float)mdl->grad_values[i][k];
      /* float64 */
      double g64 = (double)g + h->weight_decay * ref->p64[i][k];
      double *b64 = &ref->b64[i][k];
      *b64 = fresh ? g64 : h->momentum * *b64 + (1.0 - h->dampening) * g64;
      const double d64 = h->nesterov ? g64 + h->momentum * *b64 : *b64;
      ref->p64[i][k] -= h->lr * d64;
      /* fp32, as torch's kernels form each line */
      float p = ref->p32[i][k], g32 = g;
      if (wd != 0.0f) g32 = fmaf(p, wd, g32);
      float *b = &ref->b32[i][k];
      *b = fresh ? g32 : fmaf(g32, keep, *b * mom);
      const float d = h->nesterov ? fmaf(*b, mom, g32) : *b;
      ref->p32[i][k] = fmaf(d, step, p);
    }
  }
}

/* 1 when every parameter is within tolerance of the float64 reference and
 * equals the fp32 reference bit for bit, its momentum buffer too. */
static int matches(dsopt_optimizer *opt, const model *mdl, const sgd_ref *ref, int step) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const float *p = (const float *)mdl->params[i].data;
    dsopt_state_view view;
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    if (!CHECK_OK(dsopt_get_state_view(opt, i, "momentum_buffer", &view))) return 0;
    const float *b = (const float *)view.tensor.data;
    for (int64_t k = 0; k < mdl->spec[i].numel; ++k) {
      const double want = ref->p64[i][k];
      if (!CHECKF(fabs(p[k] - want) <= FP32_REL_TOL * fabs(want) + 1e-6,
                  "step %d tensor %d element %lld: %.9g, float64 reference %.9g", step, i, (long long)k,
                  p[k], want) ||
          !CHECKF(memcmp(&p[k], &ref->p32[i][k], 4) == 0,
                  "step %d tensor %d element %lld: %.9g, fp32 operations %.9g", step, i, (long long)k,
                  p[k], ref->p32[i][k]) ||
          !CHECKF(memcmp(&b[k], &ref->b32[i][k], 4) == 0,
                  "step %d tensor %d element %lld: momentum_buffer %.9g, reference %.9g", step, i,
                  (long long)k, b[k], ref->b32[i][k]))
        return 0;
    }
  }
  return 1;
}

static void sgd_matches_both_references(void) {
  tensor_spec specs[NUM_TENSORS];
  specs_of(specs);
  local_run r;
  if (CHECK_OK(local_run_open(&r, config_json, specs, NUM_TENSORS, 303))) {
    sgd_ref ref;
    ref_init(&ref, &r.m);
    uint64_t size = 0;
    unsigned char *initial = model_snapshot(&r.m, &size);
    for (int step = 1; step <= STEPS; ++step) {
      if (step == 12) {
        CHECK_OK(dsopt_set_group_lr(r.opt, 1, 0.02));
        ref.group[1].lr = 0.02;
        CHECK_OK(dsopt_set_group_param(r.opt, 0, "momentum", 0.5));
        ref.group[0].momentum = 0.5;
      }
      model_random_grads(&r.m, &r.grad_rng, 1.0, 1.0);
      if (!CHECK_OK(local_run_step(&r))) break;
      CHECK_EQ_INT(r.info.skipped, 0);
      ref_step(&ref, &r.m);
      if (!matches(r.opt, &r.m, &ref, step)) break;
    }
    CHECKF(!model_matches_snapshot(&r.m, initial, size), "the parameters moved");
    free(initial);
    ref_free(&ref);
  }
  local_run_close(&r);
}

/* torch.optim.SGD's defaults, visible in dsopt_get_config; nesterov a
 * boolean that needs momentum and no dampening, checked in the config and
 * by dsopt_set_group_param (which then changes nothing). */
static void defaults_keys_and_nesterov(void) {
  tensor_spec spec = {5, DSOPT_FLOAT32, DSOPT_FLOAT32, 0};
  local_run r;
  if (CHECK_OK(local_run_open(&r, "{\"optimizer\": {\"type\": \"sgd\"}}", &spec, 1, 3))) {
    char text[4096];
    CHECK_OK(dsopt_get_config(r.opt, text, sizeof text, NULL));
    CHECKF(strstr(text, "\"params\":{\"dampening\":0.0,\"lr\":0.001,\"momentum\":0.0,\"nesterov\":false,"
                        "\"weight_decay\":0.0}") != NULL,
           "config: %s", text);
    CHECKF(strstr(text, "\"type\":\"SGD\"") != NULL, "config: %s", text);
    double v = -1;
    CHECK_STATUS(dsopt_set_group_param(r.opt, 0, "nesterov", 1.0), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("nesterov needs momentum > 0 and dampening 0");
    CHECK_OK(dsopt_get_group_param(r.opt, 0, "nesterov", &v));
    CHECK(v == 0.0);
    CHECK_OK(dsopt_set_group_param(r.opt, 0, "momentum", 0.9));
    CHECK_OK(dsopt_set_group_param(r.opt, 0, "nesterov", 1.0));
    CHECK_STATUS(dsopt_set_group_param(r.opt, 0, "dampening", 0.1), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_set_group_param(r.opt, 0, "nesterov", 0.5), DSOPT_EINVAL);
    CHECK_OK(dsopt_get_group_param(r.opt, 0, "dampening", &v));
    CHECK(v == 0.0);
    CHECK_OK(dsopt_get_config(r.opt, text, sizeof text, NULL));
    CHECKF(strstr(text, "\"nesterov\":true") != NULL, "config: %s", text);
  }
  local_run_close(&r);
  static const struct {
    const char *params, *mentions;
  } bad[] = {
      {"{\"nesterov\": true}", "nesterov needs momentum > 0"},
      {"{\"nesterov\": true, \"momentum\": 0.9, \"dampening\": 0.1}", "nesterov needs momentum > 0"},
      {"{\"nesterov\": 1}", "optimizer.params.nesterov"},
      {"{\"momentum\": -0.1}", "optimizer.params.momentum"},
      {"{\"betas\": [0.9, 0.99]}", "optimizer.params.betas"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; ++k) {
    char config[256];
    snprintf(config, sizeof config, "{\"optimizer\": {\"type\": \"SGD\", \"params\": %s}}", bad[k].params);
    CHECK_STATUS(local_run_open(&r, config, &spec, 1, 3), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS(bad[k].mentions);
    local_run_close(&r);
  }
  CHECK_STATUS(local_run_open(&r,
                              "{\"optimizer\": {\"type\": \"SGD\", \"params\": {\"momentum\": 0.9}}, "
                              "\"param_groups\": [{\"nesterov\": true, \"dampening\": 0.5}]}",
                              &spec, 1, 3),
               DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("param_groups[0]");
  local_run_close(&r);
}

int main(void) {
  RUN_TEST(sgd_matches_both_references);
  RUN_TEST(defaults_keys_and_nesterov);
  return check_finish();
}

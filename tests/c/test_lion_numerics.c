/* Lion on one process against references written from docs/optimizers/lion.md
 * ("What one step computes"): a float64 one within a tolerance (the moment
 * and the interpolation formed in fp32 as the contract says, so that the
 * sign is decided alike), and the fp32 operations themselves, which the
 * library must match bit for bit, moment included. fp32 parameters with
 * gradients of every dtype, odd sizes, two groups with different
 * hyperparameters, a learning-rate change in the middle of the run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/local_run.h"

#define STEPS 25
#define NUM_TENSORS 6
#define FP32_REL_TOL 1e-5

typedef struct lion_hyper {
  double lr, beta1, beta2, weight_decay;
} lion_hyper;

static const lion_hyper groups[2] = {{0.01, 0.9, 0.99, 0.1}, {0.003, 0.8, 0.95, 0.0}};
static const char *config_json =
    "{\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}, "
    "\"param_groups\": [{}, {\"lr\": 0.003, \"betas\": [0.8, 0.95], \"weight_decay\": 0.0}]}";

static void specs_of(tensor_spec *specs) {
  static const int64_t sizes[NUM_TENSORS] = {1, 7, 33, 1000, 4099, 100003};
  static const int32_t grads[3] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
  for (int i = 0; i < NUM_TENSORS; ++i) {
    specs[i].numel = sizes[i];
    specs[i].param_dtype = DSOPT_FLOAT32;
    specs[i].grad_dtype = grads[i % 3];
    specs[i].group = i % 2;
  }
}

static float sign_of(float c) { return c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : 0.0f; }

/* The reference: p64 in float64, p32 in the documented fp32 operations, m
 * in fp32 (shared by both: it does not depend on p). */
typedef struct lion_ref {
  double *p64[NUM_TENSORS];
  float *p32[NUM_TENSORS], *m[NUM_TENSORS];
  lion_hyper group[2];
} lion_ref;

static void ref_init(lion_ref *ref, const model *mdl) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const int64_t n = mdl->spec[i].numel;
    const float *p = (const float *)mdl->params[i].data;
    ref->p64[i] = malloc((size_t)n * sizeof(double));
    ref->p32[i] = malloc((size_t)n * sizeof(float));
    ref->m[i] = calloc((size_t)n, sizeof(float));
    for (int64_t k = 0; k < n; ++k) ref->p64[i][k] = ref->p32[i][k] = p[k];
  }
  ref->group[0] = groups[0];
  ref->group[1] = groups[1];
}

static void ref_free(lion_ref *ref) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    free(ref->p64[i]);
    free(ref->p32[i]);
    free(ref->m[i]);
  }
}

static void ref_step(lion_ref *ref, const model *mdl) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const lion_hyper *h = &ref->group[mdl->spec[i].group];
    const float lr = (float)h->lr, b1 = (float)h->beta1, b2 = (float)h->beta2;
    const float decay = -lr * (float)h->weight_decay;
    for (int64_t k = 0; k < mdl->spec[i].numel; ++k) {
      const float g = (float)mdl->grad_values[i][k];
      float *m = &ref->m[i][k];
      const float c = fmaf(g, 1.0f - b1, *m * b1);
      const float s = sign_of(c);
      ref->p64[i][k] = ref->p64[i][k] + ref->p64[i][k] * (double)decay - (double)lr * s;
      float p = ref->p32[i][k];
      if (decay != 0.0f) p = fmaf(p, decay, p);
      ref->p32[i][k] = fmaf(s, -lr, p);
      *m = fmaf(g, 1.0f - b2, *m * b2);
    }
  }
}

/* 1 when every parameter is within tolerance of the float64 reference and
 * equals the fp32 reference bit for bit, its moment too. */
static int matches(dsopt_optimizer *opt, const model *mdl, const lion_ref *ref, int step) {
  for (int i = 0; i < NUM_TENSORS; ++i) {
    const float *p = (const float *)mdl->params[i].data;
    dsopt_state_view view;
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    if (!CHECK_OK(dsopt_get_state_view(opt, i, "exp_avg", &view))) return 0;
    const float *m = (const float *)view.tensor.data;
    for (int64_t k = 0; k < mdl->spec[i].numel; ++k) {
      const double want = ref->p64[i][k];
      if (!CHECKF(fabs(p[k] - want) <= FP32_REL_TOL * fabs(want) + 1e-6,
                  "step %d tensor %d element %lld: %.9g, float64 reference %.9g", step, i, (long long)k,
                  p[k], want) ||
          !CHECKF(memcmp(&p[k], &ref->p32[i][k], 4) == 0, "step %d tensor %d element %lld: %.9g, fp32 operations %.9g",
                  step, i, (long long)k, p[k], ref->p32[i][k]) ||
          !CHECKF(memcmp(&m[k], &ref->m[i][k], 4) == 0, "step %d tensor %d element %lld: exp_avg %.9g, reference %.9g",
                  step, i, (long long)k, m[k], ref->m[i][k]))
        return 0;
    }
  }
  return 1;
}

static void lion_matches_both_references(void) {
  tensor_spec specs[NUM_TENSORS];
  specs_of(specs);
  local_run r;
  if (CHECK_OK(local_run_open(&r, config_json, specs, NUM_TENSORS, 202))) {
    lion_ref ref;
    ref_init(&ref, &r.m);
    uint64_t size = 0;
    unsigned char *initial = model_snapshot(&r.m, &size);
    for (int step = 1; step <= STEPS; ++step) {
      if (step == 12) {
        CHECK_OK(dsopt_set_group_lr(r.opt, 1, 0.02));
        ref.group[1].lr = 0.02;
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

/* The paper's defaults, visible in dsopt_get_config; eps is not Lion's. */
static void defaults_and_keys(void) {
  tensor_spec spec = {5, DSOPT_FLOAT32, DSOPT_FLOAT32, 0};
  local_run r;
  if (CHECK_OK(local_run_open(&r, "{\"optimizer\": {\"type\": \"lion\"}}", &spec, 1, 3))) {
    char text[4096];
    CHECK_OK(dsopt_get_config(r.opt, text, sizeof text, NULL));
    CHECKF(strstr(text, "\"params\":{\"betas\":[0.9,0.99],\"lr\":0.0001,\"weight_decay\":0.0}") != NULL,
           "config: %s", text);
    CHECKF(strstr(text, "\"type\":\"Lion\"") != NULL, "config: %s", text);
  }
  local_run_close(&r);
  CHECK_STATUS(local_run_open(&r, "{\"optimizer\": {\"type\": \"Lion\", \"params\": {\"eps\": 1e-8}}}", &spec, 1, 3),
               DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("optimizer.params.eps");
  local_run_close(&r);
}

int main(void) {
  RUN_TEST(lion_matches_both_references);
  RUN_TEST(defaults_and_keys);
  return check_finish();
}

/* Gradient norm and clipping (docs/optimizers/adam.md step 4): norm = sqrt(sum a^2) / S,
 * coef = min(1, clip / (norm + 1e-6)), gradients multiplied by coef / S;
 * info.grad_norm is the norm before clipping, or -1 when not computed. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "support/adam_ref.h"
#include "support/local_run.h"

#define FP32_REL_TOL 1e-5
#define NORM_REL_TOL 1e-10
#define STEPS 10
#define NUM_TENSORS 4

static const tensor_spec specs[NUM_TENSORS] = {
    {1000, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {33, DSOPT_FLOAT32, DSOPT_FLOAT16, 0},
    {4099, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0},
    {7, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
};

typedef struct clip_case {
  const char *extra;   /* top-level JSON members: clipping, report_grad_norm, fp16 */
  double clip;         /* 0: no clipping */
  int norm_reported;   /* whether info.grad_norm is computed */
  double grad_scale;   /* magnitude of the true gradients */
  double loss_scale;   /* static loss scale, 1 without fp16 */
  int expect_clipped;  /* whether coef < 1 on every step (a check of the test itself) */
} clip_case;

static void check_clip_case_set(const clip_case *k, int set_after_create);

static void check_clip_case(const clip_case *k) { check_clip_case_set(k, 0); }

/* set_after_create: the run is created without clipping and gets k->clip
 * through dsopt_set_gradient_clipping before its first step. */
static void check_clip_case_set(const clip_case *k, int set_after_create) {
  /* Adam's update barely depends on the scale of the gradient (m / sqrt(v))
   * unless eps is comparable to sqrt(v): the large eps makes a wrong clip
   * coefficient visible in the parameters, not only in info.grad_norm. */
  const hyper h = {0.05, 0.9, 0.999, 0.05, 0.01};
  adam_config c = adamw_config(h);
  c.extra = set_after_create ? NULL : k->extra;
  char json[2048], msg[256];
  local_run r;
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), specs, NUM_TENSORS, 401)) &&
      (!set_after_create || CHECK_OK(dsopt_set_gradient_clipping(r.opt, k->clip)))) {
    adam_ref ref;
    adam_ref_init(&ref, &c, &r.m);
    for (int step = 1; step <= STEPS; ++step) {
      model_random_grads(&r.m, &r.grad_rng, k->grad_scale, k->loss_scale);
      if (!CHECK_OK(local_run_step(&r))) break;
      double norm_of_a = sum_squares_norm(r.m.grad_values, ref.numel, NUM_TENSORS);
      double norm = norm_of_a / k->loss_scale;
      double mul = clip_multiplier(norm_of_a, k->loss_scale, k->clip);
      CHECKF((mul * k->loss_scale < 1.0) == k->expect_clipped, "%s: step %d: norm %g against clip %g", json, step,
             norm, k->clip);
      if (k->norm_reported)
        CHECKF(fabs(r.info.grad_norm - norm) <= NORM_REL_TOL * norm, "%s: step %d: info.grad_norm %.17g, reference %.17g",
               json, step, r.info.grad_norm, norm);
      else
        CHECKF(r.info.grad_norm == -1.0, "%s: step %d: info.grad_norm %g, expected -1", json, step, r.info.grad_norm);
      CHECK_EQ_INT(r.info.skipped, 0);
      adam_ref_step(&ref, r.m.grad_values, mul);
      if (!CHECKF(params_match_ref(&r.m, &ref, FP32_REL_TOL, msg, sizeof msg), "%s: step %d: %s", json, step, msg))
        break;
    }
    adam_ref_free(&ref);
  }
  local_run_close(&r);
}

static void large_gradients_are_clipped_to_the_norm(void) {
  clip_case k = {"\"gradient_clipping\": 0.5", 0.5, 1, 10.0, 1.0, 1};
  check_clip_case(&k);
}

static void gradients_below_the_norm_are_not_clipped(void) {
  clip_case k = {"\"gradient_clipping\": 100.0", 100.0, 1, 0.5, 1.0, 0};
  check_clip_case(&k);
}

static void report_grad_norm_reports_without_clipping(void) {
  clip_case k = {"\"report_grad_norm\": true", 0.0, 1, 10.0, 1.0, 0};
  check_clip_case(&k);
}

static void grad_norm_is_minus_one_when_not_computed(void) {
  clip_case k = {"\"gradient_clipping\": 0", 0.0, 0, 10.0, 1.0, 0};
  check_clip_case(&k);
}

/* The norm is of the unscaled gradient; one multiplier coef / S unscales
 * and clips. */
static void clipping_with_loss_scale_uses_the_unscaled_norm(void) {
  clip_case k = {"\"gradient_clipping\": 0.5, \"fp16\": {\"enabled\": true, \"loss_scale\": 8}", 0.5, 1, 4.0, 8.0, 1};
  check_clip_case(&k);
  clip_case loose = {"\"gradient_clipping\": 1000, \"fp16\": {\"enabled\": true, \"loss_scale\": 16}", 1000.0, 1, 1.0,
                     16.0, 0};
  check_clip_case(&loose);
}

/* Set after create, as frameworks do with their own max-norm setting: the
 * same steps as a config that had it; bad values change nothing. */
static void clipping_set_after_create_clips_the_same(void) {
  clip_case k = {"", 0.5, 1, 10.0, 1.0, 1};
  check_clip_case_set(&k, 1);
  local_run r;
  char json[2048];
  adam_config c = adamw_config((hyper){0.05, 0.9, 0.999, 0.05, 0.01});
  c.extra = "\"gradient_clipping\": 2.5";
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), specs, NUM_TENSORS, 5))) {
    double v = 0.0;
    CHECK_STATUS(dsopt_set_gradient_clipping(r.opt, -1.0), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("gradient_clipping");
    CHECK_STATUS(dsopt_set_gradient_clipping(r.opt, NAN), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_set_gradient_clipping(r.opt, INFINITY), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_set_gradient_clipping(NULL, 1.0), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_get_gradient_clipping(r.opt, NULL), DSOPT_EINVAL);
    CHECK_OK(dsopt_get_gradient_clipping(r.opt, &v));
    CHECK(v == 2.5);
    CHECK_OK(dsopt_set_gradient_clipping(r.opt, 0.0));
    CHECK_OK(dsopt_get_gradient_clipping(r.opt, &v));
    CHECK(v == 0.0);
  }
  local_run_close(&r);
}

int main(void) {
  RUN_TEST(large_gradients_are_clipped_to_the_norm);
  RUN_TEST(gradients_below_the_norm_are_not_clipped);
  RUN_TEST(report_grad_norm_reports_without_clipping);
  RUN_TEST(grad_norm_is_minus_one_when_not_computed);
  RUN_TEST(clipping_with_loss_scale_uses_the_unscaled_norm);
  RUN_TEST(clipping_set_after_create_clips_the_same);
  return check_finish();
}

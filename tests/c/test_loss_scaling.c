/* The loss scaler and non-finite skipping (docs/optimizers/adam.md "Loss scaling" and step
 * 2): after every step info.loss_scale, info.skipped and info.step follow a
 * reference of docs/optimizers/adam.md's rule; applied steps unscale by the scale the
 * gradients were produced with; skipped steps change nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/adam_ref.h"
#include "support/local_run.h"
#include "support/scaler_ref.h"

#define FP32_REL_TOL 1e-5
#define NUM_TENSORS 4

static const tensor_spec fp16_specs[NUM_TENSORS] = {
    {33, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {1000, DSOPT_FLOAT16, DSOPT_FLOAT16, 0},
    {7, DSOPT_FLOAT32, DSOPT_FLOAT16, 0},
    {129, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
};

static adam_config scaled_config(const char *fp16_section) {
  /* eps comparable to sqrt(v): Adam's update then depends on the scale of
   * the gradient, so unscaling by a wrong factor shows in the parameters. */
  const hyper h = {0.05, 0.9, 0.999, 0.05, 0.01};
  adam_config c = adamw_config(h);
  c.extra = fp16_section;
  return c;
}

/* Feeds `events` ('C' clean, 'I' +Inf, 'i' -Inf, 'N' NaN in one gradient
 * element), gradients produced with the current scale, and checks every
 * step against the scaler reference and the Adam reference. */
static void check_sequence(const adam_config *c, scaler_ref *scaler, const char *events) {
  char json[2048], msg[256];
  local_run r;
  if (CHECK_OK(local_run_open(&r, adam_config_json(c, json, sizeof json), fp16_specs, NUM_TENSORS, 301))) {
    adam_ref ref;
    adam_ref_init(&ref, c, &r.m);
    int64_t applied = 0;
    for (int k = 0; events[k]; ++k) {
      const char event = events[k];
      const int overflow = event != 'C';
      const double scale_used = scaler->scale;
      double current = 0.0;
      CHECK_OK(dsopt_get_loss_scale(r.opt, &current));
      CHECKF(current == scale_used, "step %d: loss scale before the step %g, reference %g", k, current, scale_used);

      model_random_grads(&r.m, &r.grad_rng, 1.0, scale_used);
      if (overflow) {
        int tensor = k % NUM_TENSORS;
        double bad = event == 'I' ? INFINITY : event == 'i' ? -INFINITY : NAN;
        model_set_grad(&r.m, tensor, fp16_specs[tensor].numel / 2, bad);
      }
      uint64_t before_size;
      unsigned char *before = model_snapshot(&r.m, &before_size);
      /* An overflow where the scale would halve but is at its minimum is
       * reported (DSOPT_ENONFINITE); the step is skipped all the same. */
      const int stuck = overflow && scaler->dynamic && (scaler->hysteresis == 1 || scaler->hyst == 1) &&
                        scaler->scale <= scaler->min_scale;
      const int rc = local_run_step(&r);
      if (!CHECKF(rc == (stuck ? DSOPT_ENONFINITE : DSOPT_OK), "step %d (%c): status %d, expected %d (%s)", k,
                  event, rc, stuck ? DSOPT_ENONFINITE : DSOPT_OK, dsopt_last_error())) {
        free(before);
        break;
      }
      if (stuck)
        CHECKF(strstr(dsopt_last_error(), "minimum loss scale") != NULL, "step %d: message names the cause: %s", k,
               dsopt_last_error());
      scaler_ref_update(scaler, overflow);
      applied += !overflow;
      CHECKF(r.info.skipped == overflow, "step %d (%c): skipped %d, expected %d", k, event, r.info.skipped, overflow);
      CHECKF(r.info.step == applied, "step %d (%c): info.step %lld, expected %lld", k, event, (long long)r.info.step,
             (long long)applied);
      CHECKF(r.info.loss_scale == scaler->scale, "step %d (%c): info.loss_scale %g, reference %g", k, event,
             r.info.loss_scale, scaler->scale);
      CHECK_OK(dsopt_get_loss_scale(r.opt, &current));
      CHECKF(current == scaler->scale, "step %d: dsopt_get_loss_scale %g, reference %g", k, current, scaler->scale);
      if (overflow) {
        CHECKF(model_matches_snapshot(&r.m, before, before_size), "step %d (%c): parameters unchanged", k, event);
      } else {
        adam_ref_step(&ref, r.m.grad_values, 1.0 / scale_used);
        CHECKF(params_match_ref(&r.m, &ref, FP32_REL_TOL, msg, sizeof msg), "step %d: %s", k, msg);
      }
      free(before);
    }
    adam_ref_free(&ref);
  }
  local_run_close(&r);
}

static void dynamic_scale_follows_readme_rule(void) {
  adam_config c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 4, \"loss_scale_window\": 2, \"hysteresis\": 2, "
      "\"min_loss_scale\": 1}");
  scaler_ref scaler;
  scaler_ref_init_dynamic(&scaler, 4, 2, 2, 0, 1.0);
  check_sequence(&c, &scaler, "CCCCCICNCCCIiNNNNNNCCCCCICICNCCCCC");
}

static void consecutive_hysteresis_refills_after_every_clean_step(void) {
  const char *events = "ICICICICNCCINCC";
  adam_config c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 5, \"loss_scale_window\": 4, \"hysteresis\": 2, "
      "\"consecutive_hysteresis\": true}");
  scaler_ref with, without;
  scaler_ref_init_dynamic(&with, 5, 4, 2, 1, 1.0);
  check_sequence(&c, &with, events);

  c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 5, \"loss_scale_window\": 4, \"hysteresis\": 2, "
      "\"consecutive_hysteresis\": false}");
  scaler_ref_init_dynamic(&without, 5, 4, 2, 0, 1.0);
  check_sequence(&c, &without, events);
  /* The sequence tells the two rules apart. */
  CHECK(with.scale != without.scale);
}

static void scale_never_drops_below_min_loss_scale(void) {
  adam_config c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 3, \"loss_scale_window\": 3, \"hysteresis\": 1, "
      "\"min_loss_scale\": 2}");
  scaler_ref scaler;
  scaler_ref_init_dynamic(&scaler, 3, 3, 1, 0, 2.0);
  check_sequence(&c, &scaler, "INIiNNCCCCINNNN");
  CHECK(scaler.scale == 2.0);

  c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 2, \"loss_scale_window\": 2, \"hysteresis\": 1}");
  scaler_ref_init_dynamic(&scaler, 2, 2, 1, 0, 1.0);
  check_sequence(&c, &scaler, "NNNNCCNNN");
  CHECK(scaler.scale == 1.0);
}

/* max_consecutive_skips 0 turns the report off: the same sequence steps
 * through the minimum without an error. */
static void overflow_at_min_scale_is_not_reported_when_turned_off(void) {
  adam_config c = scaled_config(
      "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 1, \"loss_scale_window\": 3, \"hysteresis\": 1, "
      "\"min_loss_scale\": 1}, \"max_consecutive_skips\": 0");
  char json[2048];
  local_run r;
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), fp16_specs, NUM_TENSORS, 305))) {
    for (int k = 0; k < 5; ++k) {
      model_random_grads(&r.m, &r.grad_rng, 1.0, 1.0);
      model_set_grad(&r.m, 0, 1, NAN);
      CHECK_OK(local_run_step(&r));
      CHECK_EQ_INT(r.info.skipped, 1);
      CHECK_EQ_INT(r.info.consecutive_skips, k + 1);
    }
  }
  local_run_close(&r);
}

/* Without loss scaling: the max_consecutive_skips-th skipped step in a row
 * returns DSOPT_ENONFINITE (every further one too), info is written, nothing
 * changes; one applied step resets the count. */
static void consecutive_skips_past_the_limit_are_reported(void) {
  adam_config c = scaled_config("\"max_consecutive_skips\": 3");
  char json[2048];
  local_run r;
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), fp16_specs, NUM_TENSORS, 306))) {
    const char *events = "CNNNNCNNNC";
    const int expected_count[] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 0};
    for (int k = 0; events[k]; ++k) {
      model_random_grads(&r.m, &r.grad_rng, 1.0, 1.0);
      if (events[k] == 'N') model_set_grad(&r.m, 2, 3, NAN);
      uint64_t before_size;
      unsigned char *before = model_snapshot(&r.m, &before_size);
      const int expected = expected_count[k] >= 3 ? DSOPT_ENONFINITE : DSOPT_OK;
      const int rc = local_run_step(&r);
      CHECKF(rc == expected, "step %d: status %d, expected %d", k, rc, expected);
      CHECKF(r.info.consecutive_skips == expected_count[k], "step %d: consecutive_skips %lld, expected %d", k,
             (long long)r.info.consecutive_skips, expected_count[k]);
      CHECK_EQ_INT(r.info.skipped, events[k] == 'N');
      if (events[k] == 'N')
        CHECKF(model_matches_snapshot(&r.m, before, before_size), "step %d: parameters unchanged", k);
      if (expected == DSOPT_ENONFINITE) {
        CHECKF(strstr(dsopt_last_error(), "in a row were skipped") != NULL, "message: %s", dsopt_last_error());
        CHECKF(strstr(dsopt_last_error(), "max_consecutive_skips") != NULL, "message names the key: %s",
               dsopt_last_error());
      }
      free(before);
    }
  }
  local_run_close(&r);
}

static void static_loss_scale_never_changes_and_overflows_are_skipped(void) {
  adam_config c = scaled_config("\"fp16\": {\"enabled\": true, \"loss_scale\": 64, \"loss_scale_window\": 1}");
  scaler_ref scaler;
  scaler_ref_init_static(&scaler, 64.0);
  check_sequence(&c, &scaler, "CCNCICCCNNC");
}

/* fp16.enabled alone: 2^16, window 1000, hysteresis 2. */
static void omitted_scaler_keys_take_readme_defaults(void) {
  adam_config c = scaled_config("\"fp16\": {\"enabled\": true}");
  scaler_ref scaler;
  scaler_ref_init_dynamic(&scaler, 16, 1000, 2, 0, 1.0);
  double scale = 0.0;
  local_run r;
  char json[2048];
  static const tensor_spec fp32_grads[1] = {{64, DSOPT_FLOAT16, DSOPT_FLOAT32, 0}};
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), fp32_grads, 1, 302))) {
    CHECK_OK(dsopt_get_loss_scale(r.opt, &scale));
    CHECK(scale == 65536.0);
    const char *events = "CCNCCN";
    for (int k = 0; events[k]; ++k) {
      model_random_grads(&r.m, &r.grad_rng, 1.0, scaler.scale);
      if (events[k] == 'N') model_set_grad(&r.m, 0, 3, NAN);
      CHECK_OK(local_run_step(&r));
      scaler_ref_update(&scaler, events[k] == 'N');
      CHECKF(r.info.loss_scale == scaler.scale, "step %d: loss scale %g, reference %g", k, r.info.loss_scale,
             scaler.scale);
    }
    CHECK(scaler.scale == 32768.0); /* the second overflow halved it */
  }
  local_run_close(&r);
}

static void without_fp16_the_loss_scale_is_one(void) {
  const char *configs[] = {"{\"optimizer\": {\"type\": \"AdamW\"}}",
                           "{\"optimizer\": {\"type\": \"AdamW\"}, \"fp16\": {\"enabled\": false}}",
                           "{\"optimizer\": {\"type\": \"AdamW\"}, \"bf16\": {\"enabled\": true}}"};
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; ++i) {
    local_run r;
    double scale = 0.0;
    if (CHECK_OK(local_run_open(&r, configs[i], fp16_specs, NUM_TENSORS, 303))) {
      CHECK_OK(dsopt_get_loss_scale(r.opt, &scale));
      CHECKF(scale == 1.0, "%s: scale %g", configs[i], scale);
      CHECK_OK(local_run_step(&r));
      CHECKF(r.info.loss_scale == 1.0, "%s: info.loss_scale %g", configs[i], r.info.loss_scale);
      model_set_grad(&r.m, 1, 0, INFINITY);
      CHECK_OK(local_run_step(&r));
      CHECK_EQ_INT(r.info.skipped, 1);
      CHECKF(r.info.loss_scale == 1.0, "%s: info.loss_scale %g after an overflow", configs[i], r.info.loss_scale);
    }
    local_run_close(&r);
  }
}

/* skip_nonfinite (default on, no loss scaling): Inf or NaN anywhere skips
 * the step; parameters and state stay byte-identical; the step count does
 * not move; the next clean step is the reference's next step. */
static void nonfinite_gradient_skips_the_step_and_changes_nothing(void) {
  static const tensor_spec specs[3] = {
      {1000, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {7, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0}, {33, DSOPT_FLOAT32, DSOPT_FLOAT16, 0}};
  const double bad_values[3] = {NAN, INFINITY, -INFINITY};
  adam_config c = scaled_config(NULL);
  char json[2048], msg[256];
  local_run r;
  if (CHECK_OK(local_run_open(&r, adam_config_json(&c, json, sizeof json), specs, 3, 304))) {
    adam_ref ref;
    adam_ref_init(&ref, &c, &r.m);
    for (int k = 0; k < 9; ++k) {
      model_random_grads(&r.m, &r.grad_rng, 1.0, 1.0);
      CHECK_OK(local_run_step(&r));
      adam_ref_step(&ref, r.m.grad_values, 1.0);

      uint64_t params_size, state_size, after_size;
      unsigned char *params = model_snapshot(&r.m, &params_size);
      unsigned char *state = state_blob(r.opt, &state_size);
      model_random_grads(&r.m, &r.grad_rng, 1.0, 1.0);
      model_set_grad(&r.m, k % 3, specs[k % 3].numel - 1, bad_values[k % 3]);
      CHECK_OK(local_run_step(&r));
      CHECK_EQ_INT(r.info.skipped, 1);
      CHECK_EQ_INT(r.info.step, k + 1);
      CHECK(model_matches_snapshot(&r.m, params, params_size));
      unsigned char *after = state_blob(r.opt, &after_size);
      CHECK(same_bytes(after, after_size, state, state_size));
      free(params);
      free(state);
      free(after);
    }
    CHECKF(params_match_ref(&r.m, &ref, FP32_REL_TOL, msg, sizeof msg), "%s", msg);
    adam_ref_free(&ref);
  }
  local_run_close(&r);
}

static void skip_nonfinite_false_applies_the_step(void) {
  static const tensor_spec specs[1] = {{100, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}};
  local_run r;
  if (CHECK_OK(local_run_open(&r, "{\"optimizer\": {\"type\": \"AdamW\"}, \"skip_nonfinite\": false}", specs, 1, 305))) {
    const float *p = (const float *)r.m.params[0].data;
    float before = p[10];
    model_set_grad(&r.m, 0, 50, NAN);
    CHECK_OK(local_run_step(&r));
    CHECK_EQ_INT(r.info.skipped, 0);
    CHECK_EQ_INT(r.info.step, 1);
    CHECK(isnan(p[50]));
    CHECK(!isnan(p[10]) && p[10] != before);
  }
  local_run_close(&r);
}

int main(void) {
  RUN_TEST(dynamic_scale_follows_readme_rule);
  RUN_TEST(consecutive_hysteresis_refills_after_every_clean_step);
  RUN_TEST(scale_never_drops_below_min_loss_scale);
  RUN_TEST(static_loss_scale_never_changes_and_overflows_are_skipped);
  RUN_TEST(overflow_at_min_scale_is_not_reported_when_turned_off);
  RUN_TEST(consecutive_skips_past_the_limit_are_reported);
  RUN_TEST(omitted_scaler_keys_take_readme_defaults);
  RUN_TEST(without_fp16_the_loss_scale_is_one);
  RUN_TEST(nonfinite_gradient_skips_the_step_and_changes_nothing);
  RUN_TEST(skip_nonfinite_false_applies_the_step);
  return check_finish();
}

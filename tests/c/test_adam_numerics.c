/* Adam and AdamW on one process against references written from docs/optimizers/adam.md
 * ("What one step computes"): a double-precision one within a tolerance,
 * and its fp32 operations, which the library must match bit for
 * bit. Every (parameter dtype, gradient dtype) pair, odd sizes, two
 * parameter groups with different hyperparameters, learning-rate changes in
 * the middle of the run. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "support/adam_exact.h"
#include "support/adam_ref.h"
#include "support/local_run.h"

#define STEPS 25
#define NUM_TENSORS 9
#define FP32_REL_TOL 1e-5

static const int32_t all_dtypes[3] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
static const int64_t odd_sizes[5] = {1, 7, 33, 1000, 4099};

/* Every (param, grad) dtype pair once, sizes cycling, groups alternating. */
static void mixed_specs(tensor_spec *specs, int num_groups) {
  int k = 0;
  for (int p = 0; p < 3; ++p)
    for (int g = 0; g < 3; ++g, ++k) {
      specs[k].numel = odd_sizes[k % 5];
      specs[k].param_dtype = all_dtypes[p];
      specs[k].grad_dtype = all_dtypes[g];
      specs[k].group = k % num_groups;
    }
}

/* Two groups that differ in every hyperparameter; group 1's large eps makes
 * where eps enters the update visible. */
static adam_config two_group_config(const char *type, int l2, int bias_correction) {
  const hyper base = {0.005, 0.85, 0.99, 1e-6, 0.05};
  const hyper group0 = {0.01, 0.9, 0.999, 1e-8, 0.01};
  const hyper group1 = {0.003, 0.8, 0.95, 1e-3, 0.1};
  adam_config c = adamw_config(base);
  c.type = type;
  c.l2 = l2;
  c.bias_correction = bias_correction;
  c.num_groups = 2;
  c.group[0] = group0;
  c.group[1] = group1;
  return c;
}

/* One step with fresh random gradients; checks the step info. */
static int run_step(local_run *r, int expected_step) {
  model_random_grads(&r->m, &r->grad_rng, 1.0, 1.0);
  if (!CHECK_OK(local_run_step(r))) return 0;
  CHECK_EQ_INT(r->info.skipped, 0);
  CHECK_EQ_INT(r->info.step, expected_step);
  return 1;
}

static int run_open(local_run *r, const char *config_json, const tensor_spec *specs, int count) {
  return CHECK_OK(local_run_open(r, config_json, specs, count, 101));
}

/* The learning-rate changes of a run: all groups at step 12, group 1 alone
 * at step 18 when there are two groups. */
static void change_lr_mid_run(local_run *r, int step, adam_ref *ref, adam_exact *exact) {
  if (step == 12) {
    CHECK_OK(dsopt_set_lr(r->opt, 0.004));
    if (ref) adam_ref_set_lr(ref, 0.004);
    if (exact) adam_exact_set_lr(exact, 0.004);
  }
  int groups = ref ? ref->num_groups : exact->num_groups;
  if (step == 18 && groups > 1) {
    CHECK_OK(dsopt_set_group_lr(r->opt, 1, 0.02));
    if (ref) ref->group[1].lr = 0.02;
    if (exact) exact->group[1].lr = 0.02;
  }
}

static void check_against_double_reference(const adam_config *c) {
  char json[2048], msg[256];
  tensor_spec specs[NUM_TENSORS];
  mixed_specs(specs, config_num_groups(c));
  local_run r;
  if (run_open(&r, adam_config_json(c, json, sizeof json), specs, NUM_TENSORS)) {
    adam_ref ref;
    adam_ref_init(&ref, c, &r.m);
    for (int step = 1; step <= STEPS; ++step) {
      change_lr_mid_run(&r, step, &ref, NULL);
      if (!run_step(&r, step)) break;
      adam_ref_step(&ref, r.m.grad_values, 1.0);
      if (!CHECKF(params_match_ref(&r.m, &ref, FP32_REL_TOL, msg, sizeof msg), "%s: step %d: %s", json, step, msg))
        break;
    }
    adam_ref_free(&ref);
  }
  local_run_close(&r);
}

static void check_bit_identical_to_readme_operations(const adam_config *c, const char *config_json) {
  char json[2048], msg[256];
  tensor_spec specs[NUM_TENSORS];
  mixed_specs(specs, config_num_groups(c));
  if (!config_json) config_json = adam_config_json(c, json, sizeof json);
  local_run r;
  if (run_open(&r, config_json, specs, NUM_TENSORS)) {
    adam_exact exact;
    adam_exact_init(&exact, c, &r.m);
    for (int step = 1; step <= STEPS; ++step) {
      change_lr_mid_run(&r, step, NULL, &exact);
      if (!run_step(&r, step)) break;
      adam_exact_step(&exact, r.m.grad_values, 1.0f);
      if (!CHECKF(params_match_exact(&r.m, &exact, msg, sizeof msg), "%s: step %d: %s", config_json, step, msg))
        break;
    }
    adam_exact_free(&exact);
  }
  local_run_close(&r);
}

static void adam_l2_with_bias_correction_matches_reference(void) {
  adam_config c = two_group_config("Adam", 1, 1);
  check_against_double_reference(&c);
}

static void adam_l2_without_bias_correction_matches_reference(void) {
  adam_config c = two_group_config("Adam", 1, 0);
  check_against_double_reference(&c);
}

static void adamw_with_bias_correction_matches_reference(void) {
  adam_config c = two_group_config("AdamW", 0, 1);
  check_against_double_reference(&c);
}

static void adamw_without_bias_correction_matches_reference(void) {
  adam_config c = two_group_config("AdamW", 0, 0);
  check_against_double_reference(&c);
}

static void adam_l2_is_bit_identical_to_readme_fp32_operations(void) {
  adam_config c = two_group_config("Adam", 1, 1);
  check_bit_identical_to_readme_operations(&c, NULL);
}

static void adamw_is_bit_identical_to_readme_fp32_operations(void) {
  adam_config c = two_group_config("AdamW", 0, 1);
  check_bit_identical_to_readme_operations(&c, NULL);
  c.bias_correction = 0;
  check_bit_identical_to_readme_operations(&c, NULL);
}

/* DeepSpeed's mapping: "Adam" is AdamW unless adam_w_mode is false. */
static void type_adam_without_adam_w_mode_is_adamw(void) {
  adam_config c = two_group_config("Adam", 0, 1);
  check_bit_identical_to_readme_operations(&c, NULL);
}

static void type_names_are_case_insensitive(void) {
  adam_config c = two_group_config("aDaMw", 0, 1);
  check_bit_identical_to_readme_operations(&c, NULL);
  c = two_group_config("ADAM", 1, 1);
  check_bit_identical_to_readme_operations(&c, NULL);
}

static void omitted_keys_take_readme_defaults(void) {
  adam_config c = adamw_config(default_hyper());
  check_bit_identical_to_readme_operations(&c, "{\"optimizer\": {\"type\": \"AdamW\"}}");
}

/* A group lists only what it overrides; the rest comes from
 * optimizer.params. */
static void param_groups_override_only_the_keys_they_name(void) {
  const hyper base = {0.01, 0.9, 0.99, 1e-6, 0.05};
  adam_config c = adamw_config(base);
  c.num_groups = 2;
  c.group[0] = base;
  c.group[0].lr = 0.02;
  c.group[0].beta2 = 0.95;
  c.group[1] = base;
  c.group[1].weight_decay = 0.0;
  c.group[1].eps = 1e-3;
  check_bit_identical_to_readme_operations(
      &c,
      "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.99], \"eps\": 1e-6, "
      "\"weight_decay\": 0.05}}, \"param_groups\": [{\"lr\": 0.02, \"betas\": [0.9, 0.95]}, "
      "{\"weight_decay\": 0, \"eps\": 1e-3}]}");
}

static void learning_rate_setters_change_the_named_groups(void) {
  char json[2048];
  tensor_spec specs[NUM_TENSORS];
  mixed_specs(specs, 2);
  adam_config c = two_group_config("AdamW", 0, 1);
  local_run r;
  if (run_open(&r, adam_config_json(&c, json, sizeof json), specs, NUM_TENSORS)) {
    int32_t groups = 0;
    double lr0 = 0, lr1 = 0;
    CHECK_OK(dsopt_num_groups(r.opt, &groups));
    CHECK_EQ_INT(groups, 2);
    CHECK_OK(dsopt_get_lr(r.opt, 0, &lr0));
    CHECK_OK(dsopt_get_lr(r.opt, 1, &lr1));
    CHECK(lr0 == c.group[0].lr && lr1 == c.group[1].lr);
    CHECK_OK(dsopt_set_lr(r.opt, 0.5));
    CHECK_OK(dsopt_get_lr(r.opt, 0, &lr0));
    CHECK_OK(dsopt_get_lr(r.opt, 1, &lr1));
    CHECK(lr0 == 0.5 && lr1 == 0.5);
    CHECK_OK(dsopt_set_group_lr(r.opt, 1, 0.25));
    CHECK_OK(dsopt_get_lr(r.opt, 0, &lr0));
    CHECK_OK(dsopt_get_lr(r.opt, 1, &lr1));
    CHECK(lr0 == 0.5 && lr1 == 0.25);
    CHECK_OK(dsopt_set_lr(r.opt, 0.0)); /* zero is a valid rate: parameters then only decay */
  }
  local_run_close(&r);

  local_run single;
  mixed_specs(specs, 1);
  if (run_open(&single, "{\"optimizer\": {\"type\": \"AdamW\"}}", specs, NUM_TENSORS)) {
    int32_t groups = 0;
    CHECK_OK(dsopt_num_groups(single.opt, &groups));
    CHECK_EQ_INT(groups, 1);
  }
  local_run_close(&single);
}

int main(void) {
  RUN_TEST(adam_l2_with_bias_correction_matches_reference);
  RUN_TEST(adam_l2_without_bias_correction_matches_reference);
  RUN_TEST(adamw_with_bias_correction_matches_reference);
  RUN_TEST(adamw_without_bias_correction_matches_reference);
  RUN_TEST(adam_l2_is_bit_identical_to_readme_fp32_operations);
  RUN_TEST(adamw_is_bit_identical_to_readme_fp32_operations);
  RUN_TEST(type_adam_without_adam_w_mode_is_adamw);
  RUN_TEST(type_names_are_case_insensitive);
  RUN_TEST(omitted_keys_take_readme_defaults);
  RUN_TEST(param_groups_override_only_the_keys_they_name);
  RUN_TEST(learning_rate_setters_change_the_named_groups);
  return check_finish();
}

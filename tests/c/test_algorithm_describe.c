/* dsopt_algorithm_names and dsopt_algorithm_describe: every algorithm the
 * library has is described, and what the description says is what an
 * optimizer of that type does: the hyperparameters dsopt_group_param_names
 * and dsopt_get_group_param know (with the described defaults), the moments
 * dsopt_get_state_view shows, ZeRO stage 1 accepted or refused, per-parameter
 * steps settable or not, momentum masks accepted or not. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define MAX_WORDS 16
#define N 64

static int split(const char *text, char words[MAX_WORDS][40]) {
  int n = 0;
  while (*text && n < MAX_WORDS) {
    while (*text == ' ') ++text;
    size_t len = strcspn(text, " ");
    if (len == 0) break;
    memcpy(words[n], text, len < 39 ? len : 39);
    words[n][len < 39 ? len : 39] = '\0';
    ++n;
    text += len;
  }
  return n;
}

static float param_data[N], mask_data[N];

static dsopt_optimizer *create(dsopt_comm *comm, const char *type, int stage) {
  char config[256];
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"%s\"}, \"zero_optimization\": {\"stage\": %d}, \"threads\": 1}",
           type, stage);
  dsopt_tensor p = {param_data, N, DSOPT_FLOAT32, 0};
  dsopt_optimizer *opt = NULL;
  return dsopt_create(&opt, config, comm, &p, 1) == DSOPT_OK ? opt : NULL;
}

/* The description of one type against an optimizer of that type. */
static void check_behaviour(dsopt_comm *comm, const dsopt_algorithm_info *info) {
  char names[MAX_WORDS][40], keys[MAX_WORDS][40], moments[MAX_WORDS][40];
  const int n = split(info->hyper_names, names);
  CHECKF(n == info->num_hyper, "%s: %d names for %d hyperparameters", info->type, n, info->num_hyper);
  CHECKF(split(info->hyper_keys, keys) == n, "%s: one key per hyperparameter", info->type);
  CHECKF(n > 0 && !strcmp(names[0], "lr"), "%s: lr first", info->type);
  CHECKF(split(info->moment_names, moments) == info->moments, "%s: one name per moment", info->type);
  const char *group_names = NULL, *group_keys = NULL;
  CHECK_OK(dsopt_group_param_names(info->type, &group_names, &group_keys));
  CHECKF(!strcmp(group_names, info->hyper_names) && !strcmp(group_keys, info->hyper_keys),
         "%s: the names of dsopt_group_param_names", info->type);

  dsopt_optimizer *opt = create(comm, info->type, 0);
  CHECKF(opt != NULL, "%s: created with its defaults (%s)", info->type, dsopt_last_error());
  if (!opt) return;
  for (int i = 0; i < n; ++i) {
    double v = NAN;
    CHECK_OK(dsopt_get_group_param(opt, 0, names[i], &v));
    CHECKF(v == info->hyper_defaults[i], "%s: %s is %g, described default %g", info->type, names[i],
           v, info->hyper_defaults[i]);
    const int32_t r = info->hyper_ranges[i];
    CHECKF(r == DSOPT_HYPER_BETA || r == DSOPT_HYPER_NONNEGATIVE || r == DSOPT_HYPER_FLAG,
           "%s: %s has a range", info->type, names[i]);
    /* A value outside the described range is refused. */
    const double outside = r == DSOPT_HYPER_BETA ? 1.0 : r == DSOPT_HYPER_FLAG ? 0.5 : -1.0;
    CHECKF(dsopt_set_group_param(opt, 0, names[i], outside) == DSOPT_EINVAL, "%s: %s = %g refused",
           info->type, names[i], outside);
  }
  for (int k = 0; k < info->moments; ++k) {
    dsopt_state_view view;
    memset(&view, 0, sizeof view);
    view.struct_size = sizeof view;
    CHECKF(dsopt_get_state_view(opt, 0, moments[k], &view) == DSOPT_OK && view.tensor.numel == N,
           "%s: state view %s (%s)", info->type, moments[k], dsopt_last_error());
  }
  const int param_steps = dsopt_set_param_step(opt, 0, 3) == DSOPT_OK;
  CHECKF(param_steps == !!(info->flags & DSOPT_ALGORITHM_PARAM_STEPS), "%s: set_param_step %s",
         info->type, param_steps ? "works" : "is refused");
  dsopt_tensor mask = {mask_data, N, DSOPT_FLOAT32, 0};
  const int masks = dsopt_set_momentum_mask(opt, 0, &mask) == DSOPT_OK;
  CHECKF(masks == !!(info->flags & DSOPT_ALGORITHM_COMPRESSED), "%s: momentum mask %s", info->type,
         masks ? "taken" : "refused");
  dsopt_destroy(opt);

  opt = create(comm, info->type, 1);
  CHECKF((opt != NULL) == !!(info->flags & DSOPT_ALGORITHM_ZERO), "%s: ZeRO stage 1 %s",
         info->type, opt ? "accepted" : "refused");
  dsopt_destroy(opt);
}

static void test_every_algorithm_is_described_as_it_behaves(void) {
  const char *all = NULL;
  if (!CHECK_OK(dsopt_algorithm_names(&all))) return;
  char types[MAX_WORDS][40];
  const int count = split(all, types);
  CHECKF(count >= 8, "%d algorithms: %s", count, all);
  dsopt_comm *comm = NULL;
  if (!CHECK_OK(dsopt_comm_create_local(&comm))) return;
  for (int i = 0; i < N; ++i) {
    param_data[i] = 0.01f * (float)(i % 7) - 0.02f;
    mask_data[i] = (float)(i % 2);
  }
  for (int t = 0; t < count; ++t) {
    dsopt_algorithm_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (!CHECK_OK(dsopt_algorithm_describe(types[t], &info))) continue;
    CHECKF(!strcmp(info.type, types[t]), "%s described as %s", types[t], info.type);
    check_behaviour(comm, &info);
  }
  dsopt_comm_destroy(comm);
}

static void test_types_any_case_and_aliases(void) {
  dsopt_algorithm_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(dsopt_algorithm_describe("sgd", &info));
  CHECK(!strcmp(info.type, "SGD"));
  CHECK(!strcmp(info.moment_names, "momentum_buffer"));
  CHECK(info.hyper_ranges[4] == DSOPT_HYPER_FLAG);
  CHECK_OK(dsopt_algorithm_describe("ADAMW", &info));
  CHECK(!strcmp(info.type, "AdamW") && info.moments == 2);
  CHECK(info.flags == (DSOPT_ALGORITHM_PARAM_STEPS | DSOPT_ALGORITHM_ZERO | DSOPT_ALGORITHM_OFFLOAD));
}

/* Bad input changes nothing; a caller built against a smaller struct gets
 * its fields and nothing past them. */
static void test_bad_input_and_struct_sizes(void) {
  dsopt_algorithm_info info;
  memset(&info, 0x5A, sizeof info);
  info.struct_size = sizeof info;
  const dsopt_algorithm_info before = info;
  CHECK_STATUS(dsopt_algorithm_describe("Adagrad", &info), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("Adagrad");
  CHECK(!memcmp(&info, &before, sizeof info));
  CHECK_STATUS(dsopt_algorithm_describe(NULL, &info), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_algorithm_describe("Adam", NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_algorithm_names(NULL), DSOPT_EINVAL);
  info.struct_size = 8;
  CHECK_STATUS(dsopt_algorithm_describe("Adam", &info), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("struct_size");

  unsigned char buf[sizeof(dsopt_algorithm_info) + 16];
  memset(buf, 0xA5, sizeof buf);
  dsopt_algorithm_info *big = (dsopt_algorithm_info *)(void *)buf;
  big->struct_size = (uint32_t)sizeof buf; /* a newer caller's larger struct */
  CHECK_OK(dsopt_algorithm_describe("Lion", big));
  CHECK(!strcmp(big->type, "Lion") && big->struct_size == sizeof buf);
  for (size_t i = sizeof(dsopt_algorithm_info); i < sizeof buf; ++i)
    if (buf[i] != 0xA5) {
      CHECKF(0, "byte %zu past the struct written", i);
      break;
    }
}

int main(void) {
  RUN_TEST(test_every_algorithm_is_described_as_it_behaves);
  RUN_TEST(test_types_any_case_and_aliases);
  RUN_TEST(test_bad_input_and_struct_sizes);
  return check_finish();
}

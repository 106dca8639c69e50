/* Group hyperparameters by name, for every algorithm: the names and config
 * keys dsopt_group_param_names lists (written out below by hand, from
 * docs/reference/config.md), get and set of each, names the algorithm lacks
 * and invalid values refused with DSOPT_EINVAL changing nothing, the values
 * travelling in the state blob (its hyper section holding the algorithm's
 * own, in order), and a damaged hyper section refused with DSOPT_ECORRUPT
 * changing nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/blob_sections.h"
#include "support/model.h"

#define NUM_TENSORS 3
#define NUM_GROUPS 2
#define MAX_NAMES 8

static const tensor_spec specs[NUM_TENSORS] = {
    {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {100, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {7, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
};

typedef struct algorithm {
  const char *type;
  const char *names;
  const char *keys;
  int has_eps;
} algorithm;

static const char adam_names[] = "lr beta1 beta2 eps weight_decay";
static const char adam_keys[] = "lr betas betas eps weight_decay";

static const algorithm algorithms[] = {
    {"Adam", adam_names, adam_keys, 1},
    {"AdamW", adam_names, adam_keys, 1},
    {"Lamb", adam_names, adam_keys, 1},
    {"OneBitAdam", adam_names, adam_keys, 1},
    {"OneBitLamb", adam_names, adam_keys, 1},
    {"ZeroOneAdam", adam_names, adam_keys, 1},
    {"Lion", "lr beta1 beta2 weight_decay", "lr betas betas weight_decay", 0},
};
#define NUM_ALGORITHMS ((int)(sizeof algorithms / sizeof *algorithms))

/* The space-separated words of `text` (at most MAX_NAMES, each < 32 chars). */
static int split(const char *text, char words[MAX_NAMES][32]) {
  int n = 0;
  while (*text && n < MAX_NAMES) {
    while (*text == ' ') ++text;
    size_t len = strcspn(text, " ");
    if (len == 0) break;
    memcpy(words[n], text, len < 31 ? len : 31);
    words[n][len < 31 ? len : 31] = '\0';
    ++n;
    text += len;
  }
  return n;
}

/* A config of `type` with distinct values in both groups. */
static void config_of(const algorithm *a, char *out, size_t size) {
  const char *eps0 = a->has_eps ? ", \"eps\": 1e-6" : "";
  const char *eps1 = a->has_eps ? ", \"eps\": 1e-4" : "";
  snprintf(out, size,
           "{\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.02}},"
           " \"param_groups\": [{\"betas\": [0.8, 0.95]%s},"
           " {\"lr\": 0.003, \"betas\": [0.7, 0.9], \"weight_decay\": 0.1%s}], \"threads\": 1}",
           a->type, eps0, eps1);
}

/* The value a config_of optimizer has for `name` in `group`. */
static double configured(const char *name, int group) {
  if (!strcmp(name, "lr")) return group ? 0.003 : 0.01;
  if (!strcmp(name, "beta1")) return group ? 0.7 : 0.8;
  if (!strcmp(name, "beta2")) return group ? 0.9 : 0.95;
  if (!strcmp(name, "eps")) return group ? 1e-4 : 1e-6;
  return group ? 0.1 : 0.02; /* weight_decay */
}

/* Every group's value of each of the n names. */
static void read_all(const dsopt_optimizer *opt, char names[MAX_NAMES][32], int n,
                     double out[NUM_GROUPS][MAX_NAMES]) {
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 0; i < n; ++i) {
      out[g][i] = NAN;
      CHECK_OK(dsopt_get_group_param(opt, g, names[i], &out[g][i]));
    }
}

static int same_values(double a[NUM_GROUPS][MAX_NAMES], double b[NUM_GROUPS][MAX_NAMES], int n) {
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 0; i < n; ++i)
      if (a[g][i] != b[g][i]) return 0;
  return 1;
}

static dsopt_optimizer *create(const char *config, dsopt_comm *comm, model *m) {
  dsopt_optimizer *opt = NULL;
  if (!CHECK_OK(dsopt_create(&opt, config, comm, m->params, NUM_TENSORS))) return NULL;
  return opt;
}

static void test_names_and_keys(void) {
  for (int k = 0; k < NUM_ALGORITHMS; ++k) {
    const char *names = NULL, *keys = NULL;
    CHECK_OK(dsopt_group_param_names(algorithms[k].type, &names, &keys));
    CHECKF(names && !strcmp(names, algorithms[k].names), "%s: names \"%s\"", algorithms[k].type,
           names ? names : "(null)");
    CHECKF(keys && !strcmp(keys, algorithms[k].keys), "%s: keys \"%s\"", algorithms[k].type,
           keys ? keys : "(null)");
  }
  const char *names = NULL, *keys = NULL;
  CHECK_OK(dsopt_group_param_names("adamw", &names, NULL)); /* any case, one output */
  CHECK(names && !strcmp(names, adam_names));
  CHECK_OK(dsopt_group_param_names("lion", NULL, &keys));
  CHECK(keys && !strcmp(keys, algorithms[NUM_ALGORITHMS - 1].keys));
  names = "unchanged";
  CHECK_STATUS(dsopt_group_param_names("Adagrad", &names, &keys), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("Adagrad");
  CHECK(!strcmp(names, "unchanged"));
  CHECK_STATUS(dsopt_group_param_names(NULL, &names, &keys), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_group_param_names("Adam", NULL, NULL), DSOPT_EINVAL);
}

/* Get and set by name; what the algorithm lacks and bad values refused. */
static void test_get_set(const algorithm *a, dsopt_comm *comm) {
  char config[512], names[MAX_NAMES][32];
  config_of(a, config, sizeof config);
  const int n = split(a->names, names);
  model m;
  model_init(&m, specs, NUM_TENSORS, 7);
  dsopt_optimizer *opt = create(config, comm, &m);
  if (!opt) {
    model_free(&m);
    return;
  }
  double before[NUM_GROUPS][MAX_NAMES], after[NUM_GROUPS][MAX_NAMES];
  read_all(opt, names, n, before);
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 0; i < n; ++i)
      CHECKF(before[g][i] == configured(names[i], g), "%s: %s of group %d is %g", a->type, names[i], g,
             before[g][i]);
  /* Refused, nothing changed: names the algorithm lacks, bad values. */
  double v = 0.0;
  CHECK_STATUS(dsopt_set_group_param(opt, 0, "momentum", 0.5), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("momentum");
  CHECK_STATUS(dsopt_get_group_param(opt, 0, "momentum", &v), DSOPT_EINVAL);
  if (!a->has_eps) {
    CHECK_STATUS(dsopt_set_group_param(opt, 1, "eps", 1e-5), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("no hyperparameter");
    CHECK_STATUS(dsopt_get_group_param(opt, 1, "eps", &v), DSOPT_EINVAL);
  }
  CHECK_STATUS(dsopt_set_group_param(opt, 0, "beta1", 1.0), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_group_param(opt, 1, "beta2", -0.1), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_group_param(opt, 0, "weight_decay", -1.0), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_group_param(opt, 1, "lr", NAN), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_set_group_param(opt, 2, "lr", 0.1), DSOPT_EINVAL);
  read_all(opt, names, n, after);
  CHECKF(same_values(before, after, n), "%s: a refused set changed a value", a->type);
  /* Each set shows in get and in dsopt_get_config. */
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 0; i < n; ++i) CHECK_OK(dsopt_set_group_param(opt, g, names[i], 0.25 + 0.125 * i + 0.5 * g / 8));
  read_all(opt, names, n, after);
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 0; i < n; ++i)
      CHECKF(after[g][i] == 0.25 + 0.125 * i + 0.5 * g / 8, "%s: %s of group %d", a->type, names[i], g);
  uint64_t size = 0;
  CHECK_OK(dsopt_get_config(opt, NULL, 0, &size));
  char *text = malloc(size);
  if (text && CHECK_OK(dsopt_get_config(opt, text, size, NULL))) {
    CHECKF(strstr(text, "\"betas\":[0.375,0.5]") != NULL, "%s: %s", a->type, text);
    CHECKF((strstr(text, "\"eps\"") != NULL) == a->has_eps, "%s: %s", a->type, text);
  }
  free(text);
  dsopt_destroy(opt);
  model_free(&m);
}

/* beta1 of group 1 (the section's value `at`) out of range: the load is
 * refused and changes nothing; restored, the blob loads. */
static void check_damaged_value_refused(const algorithm *a, dsopt_optimizer *opt, uint8_t *blob,
                                        uint64_t blob_size, uint8_t *at, char names[MAX_NAMES][32], int n) {
  double good, fresh[NUM_GROUPS][MAX_NAMES], after[NUM_GROUPS][MAX_NAMES];
  const double bad = 1.5;
  memcpy(&good, at, 8);
  memcpy(at, &bad, 8);
  blob_fix_checksum(blob, blob_size);
  read_all(opt, names, n, fresh);
  CHECK_STATUS(dsopt_state_load(opt, blob, blob_size), DSOPT_ECORRUPT);
  CHECK_ERROR_MENTIONS("beta1");
  read_all(opt, names, n, after);
  CHECKF(same_values(fresh, after, n), "%s: a refused load changed a value", a->type);
  memcpy(at, &good, 8);
  blob_fix_checksum(blob, blob_size);
}

/* The values travel in the blob; its hyper section holds the algorithm's
 * names other than lr, per group, in order. A damaged value is refused. */
static void check_blob(const algorithm *a, dsopt_optimizer *opt, model *m, dsopt_optimizer *opt2) {
  char names[MAX_NAMES][32];
  const int n = split(a->names, names);
  rng r = rng_for(9, 0, 0);
  model_random_grads(m, &r, 1.0, 1.0);
  CHECK_OK(dsopt_step(opt, m->grads, NUM_TENSORS, NULL));
  for (int i = 0; i < n; ++i) CHECK_OK(dsopt_set_group_param(opt, 1, names[i], 0.5 - 0.0625 * i));
  double saved[NUM_GROUPS][MAX_NAMES], loaded[NUM_GROUPS][MAX_NAMES];
  read_all(opt, names, n, saved);
  uint64_t blob_size = 0, len = 0;
  uint8_t *blob = state_blob(opt, &blob_size);
  uint8_t *hyper = blob ? blob_section(blob, "common.hyper", &len) : NULL;
  if (!CHECKF(hyper && len == (uint64_t)NUM_GROUPS * (n - 1) * 8, "%s: hyper section of %llu bytes",
              a->type, (unsigned long long)len)) {
    free(blob);
    return;
  }
  for (int g = 0; g < NUM_GROUPS; ++g)
    for (int i = 1; i < n; ++i) {
      double v;
      memcpy(&v, hyper + ((size_t)g * (n - 1) + (i - 1)) * 8, 8);
      CHECKF(v == saved[g][i], "%s: section value of %s, group %d: %g", a->type, names[i], g, v);
    }
  check_damaged_value_refused(a, opt2, blob, blob_size, hyper + (n - 1) * 8, names, n);
  CHECK_OK(dsopt_state_load(opt2, blob, blob_size));
  read_all(opt2, names, n, loaded);
  CHECKF(same_values(saved, loaded, n), "%s: the loaded values differ", a->type);
  free(blob);
}

static void test_blob(const algorithm *a, dsopt_comm *comm) {
  char config[512];
  config_of(a, config, sizeof config);
  model m, m2;
  model_init(&m, specs, NUM_TENSORS, 8);
  model_init(&m2, specs, NUM_TENSORS, 8);
  dsopt_optimizer *opt = create(config, comm, &m);
  dsopt_optimizer *opt2 = create(config, comm, &m2);
  if (opt && opt2) check_blob(a, opt, &m, opt2);
  if (opt) dsopt_destroy(opt);
  if (opt2) dsopt_destroy(opt2);
  model_free(&m);
  model_free(&m2);
}

static void test_every_algorithm(void) {
  dsopt_comm *comm = NULL;
  if (!CHECK_OK(dsopt_comm_create_local(&comm))) return;
  for (int k = 0; k < NUM_ALGORITHMS; ++k) {
    test_get_set(&algorithms[k], comm);
    test_blob(&algorithms[k], comm);
  }
  dsopt_comm_destroy(comm);
}

int main(void) {
  check_run("names_and_keys", test_names_and_keys);
  check_run("every_algorithm", test_every_algorithm);
  return check_finish();
}

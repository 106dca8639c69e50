/* dsopt_get_config and dsopt_config_canonical: the canonical JSON of every
 * optimizer type equals the defaults written out below (by hand, from
 * docs/reference/config.md, not from dsopt's code); aliases resolve; an
 * optimizer created from the canonical text gives the same text; the
 * hyperparameters set at run time show; bad arguments are DSOPT_EINVAL and
 * change nothing. */
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The sections every type shares, in the text's (sorted) key order. */
#define TAIL_AFTER_PARAM_GROUPS(groups)                                                         \
  "\"param_groups\":[" groups "],\"report_grad_norm\":false,\"skip_nonfinite\":true,"          \
  "\"threads\":0,\"topology\":{\"hierarchy\":\"auto\",\"node_reduce\":\"fp32\",\"ranks_per_node\":0},"             \
  "\"zero_optimization\":{\"allgather_bucket_size\":500000000,"                  \
  "\"compression\":{\"error_feedback\":true,\"gradient_block_size\":64,\"gradients\":\"none\","\
  "\"parameter_block_size\":256,\"parameters\":\"none\"},\"deferred_allgather\":false,"        \
  "\"offload_optimizer\":{\"device\":\"none\",\"pin_memory\":false},\"reduce_bucket_size\":"   \
  "500000000,\"reduce_scatter\":true,\"stage\":0}}"
#define HEAD                                                                                    \
  "{\"bf16\":{\"enabled\":false},\"comm_timeout\":0.0,\"cuda_aware\":false,\"device\":\"cpu\"," \
  "\"divergence_check\":{\"count\":3,\"enabled\":true,\"factor\":20.0,\"horizon\":50,"          \
  "\"min_steps\":10,\"window\":8},\"fp16\":{\"consecutive_hysteresis\":false,\"enabled\":false,"\
  "\"hysteresis\":2,\"initial_scale_power\":16,\"loss_scale\":0.0,\"loss_scale_window\":1000,"  \
  "\"min_loss_scale\":1.0},\"gradient_accumulation_steps\":1,\"gradient_clipping\":0.0,"        \
  "\"max_consecutive_skips\":50,"
#define HYPER "\"betas\":[0.9,0.999],\"eps\":1e-08,\"lr\":0.001"
#define GROUP "{" HYPER ",\"weight_decay\":0.0}"

static const char *const expected[][2] = {
    {"Adam", HEAD "\"optimizer\":{\"params\":{\"adam_w_mode\":true,\"betas\":[0.9,0.999],"
                  "\"bias_correction\":true,\"eps\":1e-08,\"lr\":0.001,\"weight_decay\":0.0},"
                  "\"type\":\"Adam\"}," TAIL_AFTER_PARAM_GROUPS(GROUP)},
    {"AdamW", HEAD "\"optimizer\":{\"params\":{\"adam_w_mode\":true,\"betas\":[0.9,0.999],"
                   "\"bias_correction\":true,\"eps\":1e-08,\"lr\":0.001,\"weight_decay\":0.0},"
                   "\"type\":\"AdamW\"}," TAIL_AFTER_PARAM_GROUPS(GROUP)},
    {"OneBitAdam",
     HEAD "\"optimizer\":{\"params\":{\"betas\":[0.9,0.999],\"bias_correction\":true,\"eps\":1e-08,"
          "\"freeze_step\":100000,\"lr\":0.001,\"stabilize\":true,\"stabilize_limit\":4.0,"
          "\"weight_decay\":0.0},\"type\":\"OneBitAdam\"}," TAIL_AFTER_PARAM_GROUPS(
              "{" HYPER ",\"non_freeze\":false,\"weight_decay\":0.0}")},
    {"OneBitLamb",
     HEAD "\"optimizer\":{\"params\":{\"betas\":[0.9,0.999],\"coeff_beta\":0.9,\"eps\":1e-08,"
          "\"factor_max\":4.0,\"factor_min\":0.5,\"factor_threshold\":0.1,\"freeze_step\":100000,"
          "\"lr\":0.001,\"max_coeff\":10.0,\"min_coeff\":0.01,\"stabilize\":true,"
          "\"stabilize_limit\":4.0,\"weight_decay\":0.0},\"type\":\"OneBitLamb\"},"
          TAIL_AFTER_PARAM_GROUPS(GROUP)},
    {"ZeroOneAdam",
     HEAD "\"optimizer\":{\"params\":{\"betas\":[0.9,0.999],\"bias_correction\":true,"
          "\"decoupled_sync_weight_decay\":false,\"eps\":1e-08,\"local_step_clipper\":16,"
          "\"local_step_scaler\":32678,\"lr\":0.001,\"stabilize\":true,\"stabilize_limit\":4.0,"
          "\"var_freeze_step\":100000,\"var_update_scaler\":16,\"weight_decay\":0.0},"
          "\"type\":\"ZeroOneAdam\"}," TAIL_AFTER_PARAM_GROUPS(GROUP)},
    {"Lamb", HEAD "\"optimizer\":{\"params\":{\"betas\":[0.9,0.999],\"bias_correction\":true,"
                  "\"eps\":1e-08,\"lr\":0.001,\"max_coeff\":10.0,\"min_coeff\":0.01,"
                  "\"weight_decay\":0.0},\"type\":\"Lamb\"}," TAIL_AFTER_PARAM_GROUPS(GROUP)},
};

/* The canonical text of a config (malloc'ed), through the size query. */
static char *canonical(const char *config) {
  uint64_t n = 0;
  if (!CHECK_OK(dsopt_config_canonical(config, NULL, 0, &n))) return NULL;
  char *text = malloc(n);
  uint64_t written = 0;
  if (!CHECK_OK(dsopt_config_canonical(config, text, n, &written)) || !CHECK_EQ_INT(written, n)) {
    free(text);
    return NULL;
  }
  CHECK_EQ_INT(strlen(text) + 1, n);
  return text;
}

static char *config_of(const dsopt_optimizer *opt) {
  uint64_t n = 0;
  if (!CHECK_OK(dsopt_get_config(opt, NULL, 0, &n))) return NULL;
  char *text = malloc(n);
  if (!CHECK_OK(dsopt_get_config(opt, text, n, NULL))) {
    free(text);
    return NULL;
  }
  return text;
}

typedef struct {
  dsopt_comm *comm;
  dsopt_optimizer *opt;
  float p[4];
} one_param;

static int create(one_param *t, const char *config) {
  memset(t, 0, sizeof *t);
  dsopt_tensor param = {t->p, 4, DSOPT_FLOAT32, 0};
  if (!CHECK_OK(dsopt_comm_create_local(&t->comm))) return 0;
  return CHECK_OK(dsopt_create(&t->opt, config, t->comm, &param, 1));
}
static void destroy(one_param *t) {
  dsopt_destroy(t->opt);
  dsopt_comm_destroy(t->comm);
}

static int same_text(const char *got, const char *want) {
  return CHECKF(got && strcmp(got, want) == 0, "canonical text\n  got:  %s\n  want: %s",
                got ? got : "(none)", want);
}

static void defaults_of_every_type(void) {
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; ++i) {
    char config[128];
    snprintf(config, sizeof config, "{\"optimizer\": {\"type\": \"%s\"}}", expected[i][0]);
    char *text = canonical(config);
    same_text(text, expected[i][1]);
    free(text);
  }
}

/* Types by any case, the params' cuda_aware at the top level, keys that are
 * accepted and ignored left out. */
static void aliases_resolve(void) {
  char *a = canonical("{\"optimizer\": {\"type\": \"adamw\", \"params\": {\"cuda_aware\": false,"
                      " \"comm_backend_name\": \"nccl\"}}, \"train_batch_size\": 8}");
  same_text(a, expected[1][1]);
  free(a);
  char *b = canonical("{\"optimizer\": {\"type\": \"ONEBITLAMB\", \"params\": {\"bias_correction\":"
                      " false, \"eps_inside_sqrt\": false}}}");
  same_text(b, expected[3][1]);
  free(b);
  char *c = canonical("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false,"
                      " \"cuda_aware\": true}}}");
  CHECK(c && strstr(c, "\"adam_w_mode\":false") && strstr(c, "\"cuda_aware\":true"));
  free(c);
}

static void round_trip_and_run_time_values(void) {
  const char *config =
      "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 7}},"
      " \"param_groups\": [{\"weight_decay\": 0.1, \"non_freeze\": true}, {\"betas\": [0.8, 0.9]}],"
      " \"fp16\": {\"enabled\": true}, \"gradient_clipping\": 1.5}";
  char *text = canonical(config);
  one_param t;
  if (!text || !create(&t, text)) {
    free(text);
    return;
  }
  char *again = config_of(t.opt);
  same_text(again, text);
  char *from_original = NULL;
  {
    one_param u;
    if (create(&u, config)) {
      from_original = config_of(u.opt);
      same_text(from_original, text);
      destroy(&u);
    }
  }
  CHECK_OK(dsopt_set_group_param(t.opt, 1, "lr", 0.5));
  CHECK_OK(dsopt_set_gradient_clipping(t.opt, 2.0));
  char *now = config_of(t.opt);
  CHECK(now && strstr(now, "\"lr\":0.5") && strstr(now, "\"gradient_clipping\":2.0"));
  CHECK(now && strstr(now, "\"freeze_step\":7") && strstr(now, "\"non_freeze\":true"));
  free(text), free(again), free(from_original), free(now);
  destroy(&t);
}

static void bad_arguments_change_nothing(void) {
  one_param t;
  if (!create(&t, "{\"optimizer\": {\"type\": \"AdamW\"}}")) return;
  char buf[16];
  memset(buf, 'x', sizeof buf);
  uint64_t n = 7;
  CHECK_STATUS(dsopt_get_config(NULL, buf, sizeof buf, &n), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_get_config(t.opt, NULL, 0, NULL), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_get_config(t.opt, NULL, 8, &n), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("dst");
  CHECK_EQ_INT(n, 7);
  CHECK_STATUS(dsopt_config_canonical(NULL, buf, sizeof buf, &n), DSOPT_EINVAL);
  CHECK_STATUS(dsopt_config_canonical("{\"optimizer\": {\"type\": \"Adagrad\"}}", buf, sizeof buf, &n),
               DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("Adagrad");
  CHECK_STATUS(dsopt_config_canonical("{\"optimizer\": {\"type\": \"Adam\"}, \"lr\": 1}", buf,
                                      sizeof buf, &n), DSOPT_EINVAL);
  CHECK_EQ_INT(n, 7);
  CHECK(buf[0] == 'x' && buf[15] == 'x');
  /* Too small: nothing written, the size needed reported. */
  CHECK_STATUS(dsopt_get_config(t.opt, buf, sizeof buf, &n), DSOPT_EBUFS);
  CHECK(n > sizeof buf);
  CHECK(buf[0] == 'x' && buf[15] == 'x');
  destroy(&t);
}

int main(void) {
  RUN_TEST(defaults_of_every_type);
  RUN_TEST(aliases_resolve);
  RUN_TEST(round_trip_and_run_time_values);
  RUN_TEST(bad_arguments_change_nothing);
  return check_finish();
}

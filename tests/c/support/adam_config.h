/* One description of an Adam/AdamW configuration that both writes the JSON
 * config given to dsopt_create and sets up the references, so the two cannot
 * drift apart. */
#ifndef DSOPT_TESTS_ADAM_CONFIG_H
#define DSOPT_TESTS_ADAM_CONFIG_H

#include <stddef.h>

#define REF_MAX_GROUPS 4

typedef struct hyper {
  double lr, beta1, beta2, eps, weight_decay;
} hyper;

typedef struct adam_config {
  const char *type;    /* "Adam" or "AdamW" (any case) */
  int l2;              /* 1: writes "adam_w_mode": false (L2 weight decay) */
  int bias_correction; /* written as "bias_correction" */
  hyper base;          /* optimizer.params */
  int num_groups;      /* 0: no "param_groups" key; else group[i] is written in full */
  hyper group[REF_MAX_GROUPS];
  const char *extra;   /* more top-level members as raw JSON ("\"fp16\": {...}"), or NULL */
} adam_config;

/* The defaults (docs/reference/config.md): lr 1e-3, betas (0.9, 0.999), eps 1e-8, no decay. */
hyper default_hyper(void);
/* AdamW, bias correction on, one group with `base`. */
adam_config adamw_config(hyper base);

/* The group a tensor of group index `g` follows. */
hyper config_group(const adam_config *c, int g);
int config_num_groups(const adam_config *c);

/* Writes the config as JSON into buf and returns buf. */
const char *adam_config_json(const adam_config *c, char *buf, size_t size);

#endif /* DSOPT_TESTS_ADAM_CONFIG_H */

/* Adam / AdamW in double precision, element by element, following the
 * docs/optimizers/adam.md ("What one step computes", steps 4-6) with exact arithmetic in
 * place of fp32 roundings: the reference the library is compared to within
 * a tolerance. */
#ifndef DSOPT_TESTS_ADAM_REF_H
#define DSOPT_TESTS_ADAM_REF_H

#include <stddef.h>
#include <stdint.h>

#include "adam_config.h"
#include "model.h"

typedef struct adam_ref {
  int l2, bias_correction, num_groups, count;
  hyper group[REF_MAX_GROUPS];
  int64_t t[REF_MAX_GROUPS]; /* applied steps per group */
  int64_t numel[MODEL_MAX_TENSORS];
  int32_t group_of[MODEL_MAX_TENSORS];
  int32_t param_dtype[MODEL_MAX_TENSORS];
  double *p[MODEL_MAX_TENSORS], *m[MODEL_MAX_TENSORS], *v[MODEL_MAX_TENSORS];
} adam_ref;

/* Starts from the model's current parameters, zero moments, step 0. */
void adam_ref_init(adam_ref *r, const adam_config *c, const model *m);
void adam_ref_free(adam_ref *r);
void adam_ref_set_lr(adam_ref *r, double lr);

/* One applied step: tensor i's gradient is a[i][j] * mul (mul = coef / S). */
void adam_ref_step(adam_ref *r, double *const *a, double mul);

/* sqrt(sum of a^2) over every element of every tensor. */
double sum_squares_norm(double *const *a, const int64_t *numel, int count);
/* coef / S of docs/optimizers/adam.md step 4 (coef = 1 when clip <= 0). */
double clip_multiplier(double norm_of_a, double loss_scale, double clip);

/* Whether every parameter is within tolerance of the reference: within
 * rel_tol * max(|ref|, 0.1), or for 16-bit parameters also within one unit
 * in the last place of the reference rounded to fp32 then to the
 * parameter's dtype. On a mismatch, describes the first one in msg and
 * returns 0. */
int params_match_ref(const model *m, const adam_ref *r, double rel_tol, char *msg, size_t msg_size);

#endif /* DSOPT_TESTS_ADAM_REF_H */

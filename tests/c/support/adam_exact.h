/* The step of docs/optimizers/adam.md (steps 4-6) operation by
 * operation in fp32 with explicit fused multiply-adds: the library's results
 * must equal it bit for bit. Compiled with -ffp-contract=off. */
#ifndef DSOPT_TESTS_ADAM_EXACT_H
#define DSOPT_TESTS_ADAM_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "adam_config.h"
#include "model.h"

typedef struct adam_exact {
  int l2, bias_correction, num_groups, count;
  hyper group[REF_MAX_GROUPS];
  int64_t t[REF_MAX_GROUPS];
  int64_t numel[MODEL_MAX_TENSORS];
  int32_t group_of[MODEL_MAX_TENSORS];
  float *master[MODEL_MAX_TENSORS], *m[MODEL_MAX_TENSORS], *v[MODEL_MAX_TENSORS];
} adam_exact;

void adam_exact_init(adam_exact *r, const adam_config *c, const model *m);
void adam_exact_free(adam_exact *r);
void adam_exact_set_lr(adam_exact *r, double lr);
/* One applied step on fp32 gradients a[i][j] (exact fp32 values) with the
 * multiplier `mul` of docs/optimizers/adam.md step 4. */
void adam_exact_step(adam_exact *r, double *const *a, float mul);
/* Whether every parameter has exactly the reference's bits (16-bit ones: the
 * fp32 master rounded to nearest even). */
int params_match_exact(const model *m, const adam_exact *r, char *msg, size_t msg_size);

#endif /* DSOPT_TESTS_ADAM_EXACT_H */

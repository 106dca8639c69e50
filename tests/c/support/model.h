/* A set of parameter and gradient tensors as a caller owns them, with the
 * gradients also kept as doubles (exactly the values passed) for the
 * references. */
#ifndef DSOPT_TESTS_MODEL_H
#define DSOPT_TESTS_MODEL_H

#include <stdint.h>

#include "dsopt.h"
#include "rng.h"

#define MODEL_MAX_TENSORS 16

typedef struct tensor_spec {
  int64_t numel;
  int32_t param_dtype;
  int32_t grad_dtype;
  int32_t group;
} tensor_spec;

typedef struct model {
  int count;
  tensor_spec spec[MODEL_MAX_TENSORS];
  dsopt_tensor params[MODEL_MAX_TENSORS];
  dsopt_tensor grads[MODEL_MAX_TENSORS];
  double *grad_values[MODEL_MAX_TENSORS];
} model;

/* Allocates the tensors; parameters get random values from `seed`. */
void model_init(model *m, const tensor_spec *specs, int count, uint64_t seed);
void model_free(model *m);

/* Fills `out` with `n` random values of magnitude about `scale`, times
 * `multiplier`, each rounded to `dtype` (so `out` holds exactly what a buffer
 * of that dtype can hold). */
void random_values(double *out, int64_t n, int32_t dtype, rng *r, double scale, double multiplier);

/* New random gradients (see random_values) in every gradient tensor. */
void model_random_grads(model *m, rng *r, double scale, double multiplier);
/* Writes one gradient element (Inf and NaN allowed). */
void model_set_grad(model *m, int tensor, int64_t index, double value);

void model_copy_params(model *dst, const model *src);
/* Moves every parameter into a new buffer (values copied, the old buffer
 * freed), as a framework that copies a model does; m->params then
 * describes the new buffers (for dsopt_rebind_params). */
void model_move_params(model *m);
int model_params_identical(const model *a, const model *b);
/* Total number of parameter elements. */
int64_t model_numel(const model *m);

/* The parameters' bytes, back to back (malloc'd; free it). */
unsigned char *model_snapshot(const model *m, uint64_t *size);
int model_matches_snapshot(const model *m, const unsigned char *snapshot, uint64_t size);

/* The optimizer's state blob (malloc'd; NULL if saving failed). */
unsigned char *state_blob(const dsopt_optimizer *opt, uint64_t *size);
int same_bytes(const unsigned char *a, uint64_t a_size, const unsigned char *b, uint64_t b_size);

#endif /* DSOPT_TESTS_MODEL_H */

#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "dtype_ref.h"

void random_values(double *out, int64_t n, int32_t dtype, rng *r, double scale, double multiplier) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = round_to_dtype((float)(rng_signed(r, scale) * multiplier), dtype);
}

void model_init(model *m, const tensor_spec *specs, int count, uint64_t seed) {
  rng r = rng_seeded(seed);
  memset(m, 0, sizeof *m);
  m->count = count;
  for (int i = 0; i < count; ++i) {
    const tensor_spec *s = &specs[i];
    m->spec[i] = *s;
    m->params[i].data = malloc((size_t)s->numel * dtype_bytes(s->param_dtype));
    m->params[i].numel = s->numel;
    m->params[i].dtype = s->param_dtype;
    m->params[i].group = s->group;
    m->grads[i].data = malloc((size_t)s->numel * dtype_bytes(s->grad_dtype));
    m->grads[i].numel = s->numel;
    m->grads[i].dtype = s->grad_dtype;
    m->grads[i].group = 0;
    m->grad_values[i] = (double *)malloc((size_t)s->numel * sizeof(double));
    for (int64_t j = 0; j < s->numel; ++j)
      element_set(m->params[i].data, s->param_dtype, j, (float)rng_signed(&r, 1.0));
  }
  model_random_grads(m, &r, 1.0, 1.0);
}

void model_free(model *m) {
  for (int i = 0; i < m->count; ++i) {
    free(m->params[i].data);
    free(m->grads[i].data);
    free(m->grad_values[i]);
  }
  memset(m, 0, sizeof *m);
}

void model_random_grads(model *m, rng *r, double scale, double multiplier) {
  for (int i = 0; i < m->count; ++i) {
    random_values(m->grad_values[i], m->spec[i].numel, m->spec[i].grad_dtype, r, scale, multiplier);
    for (int64_t j = 0; j < m->spec[i].numel; ++j)
      element_set(m->grads[i].data, m->spec[i].grad_dtype, j, (float)m->grad_values[i][j]);
  }
}

void model_set_grad(model *m, int tensor, int64_t index, double value) {
  element_set(m->grads[tensor].data, m->spec[tensor].grad_dtype, index, (float)value);
  m->grad_values[tensor][index] = element_get(m->grads[tensor].data, m->spec[tensor].grad_dtype, index);
}

void model_move_params(model *m) {
  for (int i = 0; i < m->count; ++i) {
    const size_t bytes = (size_t)m->spec[i].numel * dtype_bytes(m->spec[i].param_dtype);
    void *moved = malloc(bytes);
    memcpy(moved, m->params[i].data, bytes);
    free(m->params[i].data);
    m->params[i].data = moved;
  }
}

void model_copy_params(model *dst, const model *src) {
  for (int i = 0; i < src->count; ++i)
    memcpy(dst->params[i].data, src->params[i].data,
           (size_t)src->spec[i].numel * dtype_bytes(src->spec[i].param_dtype));
}

int model_params_identical(const model *a, const model *b) {
  if (a->count != b->count) return 0;
  for (int i = 0; i < a->count; ++i) {
    size_t bytes = (size_t)a->spec[i].numel * dtype_bytes(a->spec[i].param_dtype);
    if (a->params[i].numel != b->params[i].numel || a->params[i].dtype != b->params[i].dtype ||
        memcmp(a->params[i].data, b->params[i].data, bytes) != 0)
      return 0;
  }
  return 1;
}

int64_t model_numel(const model *m) {
  int64_t n = 0;
  for (int i = 0; i < m->count; ++i) n += m->spec[i].numel;
  return n;
}

unsigned char *model_snapshot(const model *m, uint64_t *size) {
  uint64_t total = 0;
  for (int i = 0; i < m->count; ++i) total += (uint64_t)m->spec[i].numel * dtype_bytes(m->spec[i].param_dtype);
  unsigned char *out = (unsigned char *)malloc(total ? total : 1);
  uint64_t at = 0;
  for (int i = 0; i < m->count; ++i) {
    size_t bytes = (size_t)m->spec[i].numel * dtype_bytes(m->spec[i].param_dtype);
    memcpy(out + at, m->params[i].data, bytes);
    at += bytes;
  }
  *size = total;
  return out;
}

int model_matches_snapshot(const model *m, const unsigned char *snapshot, uint64_t size) {
  uint64_t now_size;
  unsigned char *now = model_snapshot(m, &now_size);
  int same = same_bytes(now, now_size, snapshot, size);
  free(now);
  return same;
}

unsigned char *state_blob(const dsopt_optimizer *opt, uint64_t *size) {
  uint64_t needed = 0, written = 0;
  *size = 0;
  if (dsopt_state_size(opt, &needed) != DSOPT_OK || needed == 0) return NULL;
  unsigned char *blob = (unsigned char *)malloc(needed);
  if (dsopt_state_save(opt, blob, needed, &written) != DSOPT_OK || written != needed) {
    free(blob);
    return NULL;
  }
  *size = written;
  return blob;
}

int same_bytes(const unsigned char *a, uint64_t a_size, const unsigned char *b, uint64_t b_size) {
  return a && b && a_size == b_size && memcmp(a, b, (size_t)a_size) == 0;
}

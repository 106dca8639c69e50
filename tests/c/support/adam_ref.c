#include "adam_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtype_ref.h"

void adam_ref_init(adam_ref *r, const adam_config *c, const model *m) {
  r->l2 = c->l2;
  r->bias_correction = c->bias_correction;
  r->num_groups = config_num_groups(c);
  for (int g = 0; g < r->num_groups; ++g) {
    r->group[g] = config_group(c, g);
    r->t[g] = 0;
  }
  r->count = m->count;
  for (int i = 0; i < m->count; ++i) {
    int64_t n = m->spec[i].numel;
    r->numel[i] = n;
    r->group_of[i] = m->spec[i].group;
    r->param_dtype[i] = m->spec[i].param_dtype;
    r->p[i] = (double *)malloc((size_t)n * sizeof(double));
    r->m[i] = (double *)calloc((size_t)n, sizeof(double));
    r->v[i] = (double *)calloc((size_t)n, sizeof(double));
    for (int64_t j = 0; j < n; ++j) r->p[i][j] = element_get(m->params[i].data, m->spec[i].param_dtype, j);
  }
}

void adam_ref_free(adam_ref *r) {
  for (int i = 0; i < r->count; ++i) {
    free(r->p[i]);
    free(r->m[i]);
    free(r->v[i]);
  }
  r->count = 0;
}

void adam_ref_set_lr(adam_ref *r, double lr) {
  for (int g = 0; g < r->num_groups; ++g) r->group[g].lr = lr;
}

/* The update (docs/optimizers/adam.md) runs on fp32 constants, so the hyperparameters enter
 * as floats; only the arithmetic is exact here. (1 - float(0.999) differs
 * from 0.001 by 1.3e-5 relative: more than the tolerance.) */
static hyper as_fp32(const hyper *h) {
  hyper f = {(float)h->lr, (float)h->beta1, (float)h->beta2, (float)h->eps, (float)h->weight_decay};
  return f;
}

void adam_ref_step(adam_ref *r, double *const *a, double mul) {
  for (int g = 0; g < r->num_groups; ++g) r->t[g] += 1;
  for (int i = 0; i < r->count; ++i) {
    int g = r->group_of[i];
    const hyper h = as_fp32(&r->group[g]);
    double bc1 = 1.0, bc2 = 1.0;
    if (r->bias_correction) {
      bc1 = 1.0 - pow(h.beta1, (double)r->t[g]);
      bc2 = 1.0 - pow(h.beta2, (double)r->t[g]);
    }
    for (int64_t j = 0; j < r->numel[i]; ++j) {
      double p = r->p[i][j];
      double grad = a[i][j] * mul;
      if (r->l2) grad += h.weight_decay * p;
      double m = h.beta1 * r->m[i][j] + (1.0 - h.beta1) * grad;
      double v = h.beta2 * r->v[i][j] + (1.0 - h.beta2) * grad * grad;
      double update = (m / bc1) / (sqrt(v / bc2) + h.eps);
      if (!r->l2) p -= h.lr * h.weight_decay * p;
      r->p[i][j] = p - h.lr * update;
      r->m[i][j] = m;
      r->v[i][j] = v;
    }
  }
}

double sum_squares_norm(double *const *a, const int64_t *numel, int count) {
  double sum = 0.0;
  for (int i = 0; i < count; ++i)
    for (int64_t j = 0; j < numel[i]; ++j) sum += a[i][j] * a[i][j];
  return sqrt(sum);
}

double clip_multiplier(double norm_of_a, double loss_scale, double clip) {
  double coef = 1.0;
  if (clip > 0.0) {
    coef = clip / (norm_of_a / loss_scale + 1e-6);
    if (coef > 1.0) coef = 1.0;
  }
  return coef / loss_scale;
}

int params_match_ref(const model *m, const adam_ref *r, double rel_tol, char *msg, size_t msg_size) {
  for (int i = 0; i < m->count; ++i) {
    int32_t dtype = m->spec[i].param_dtype;
    for (int64_t j = 0; j < m->spec[i].numel; ++j) {
      double expected = r->p[i][j];
      double actual = element_get(m->params[i].data, dtype, j);
      const double tolerance = rel_tol * (fabs(expected) > 0.1 ? fabs(expected) : 0.1);
      int ok = fabs(actual - expected) <= tolerance;
      if (dtype != DSOPT_FLOAT32) {
        /* The fp32 master may be off by `tolerance` (which near zero is more
         * than a 16-bit ulp), and rounding it may land one ulp away. */
        uint16_t want = dtype == DSOPT_FLOAT16 ? float_to_half_bits((float)expected)
                                               : float_to_bf16_bits((float)expected);
        ok = isfinite(actual) && (ok || ulp_distance16(element_bits16(m->params[i].data, j), want) <= 1);
      }
      if (!ok) {
        snprintf(msg, msg_size, "tensor %d (%s, numel %lld) element %lld: got %.9g, reference %.9g", i,
                 dtype_label(dtype), (long long)m->spec[i].numel, (long long)j, actual, expected);
        return 0;
      }
    }
  }
  if (msg_size) msg[0] = '\0';
  return 1;
}

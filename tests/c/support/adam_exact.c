#include "adam_exact.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_ref.h"

void adam_exact_init(adam_exact *r, const adam_config *c, const model *m) {
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
    r->master[i] = (float *)malloc((size_t)n * sizeof(float));
    r->m[i] = (float *)calloc((size_t)n, sizeof(float));
    r->v[i] = (float *)calloc((size_t)n, sizeof(float));
    for (int64_t j = 0; j < n; ++j)
      r->master[i][j] = (float)element_get(m->params[i].data, m->spec[i].param_dtype, j);
  }
}

void adam_exact_free(adam_exact *r) {
  for (int i = 0; i < r->count; ++i) {
    free(r->master[i]);
    free(r->m[i]);
    free(r->v[i]);
  }
  r->count = 0;
}

void adam_exact_set_lr(adam_exact *r, double lr) {
  for (int g = 0; g < r->num_groups; ++g) r->group[g].lr = lr;
}

void adam_exact_step(adam_exact *r, double *const *a, float mul) {
  for (int g = 0; g < r->num_groups; ++g) r->t[g] += 1;
  for (int i = 0; i < r->count; ++i) {
    int g = r->group_of[i];
    const hyper *h = &r->group[g];
    const float beta1 = (float)h->beta1, beta2 = (float)h->beta2;
    const float lr = (float)h->lr, wd = (float)h->weight_decay, eps = (float)h->eps;
    float bc1 = 1.0f, rbc2 = 1.0f;
    if (r->bias_correction) {
      float b1t = (float)pow((double)beta1, (double)r->t[g]);
      float b2t = (float)pow((double)beta2, (double)r->t[g]);
      bc1 = 1.0f - b1t;
      rbc2 = 1.0f / sqrtf(1.0f - b2t);
    }
    const float step_size = -lr / bc1;
    const float wdecay = -lr * wd;
    const float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    for (int64_t j = 0; j < r->numel[i]; ++j) {
      float p = r->master[i][j], m = r->m[i][j], v = r->v[i][j];
      float grad = (float)a[i][j] * mul;
      if (r->l2) grad = fmaf(p, wd, grad);
      m = m * beta1;
      m = fmaf(grad, one_minus_beta1, m);
      v = v * beta2;
      v = fmaf(grad * grad, one_minus_beta2, v);
      float s = fmaf(sqrtf(v), rbc2, eps);
      float q = m / s;
      if (!r->l2) p = fmaf(p, wdecay, p);
      p = fmaf(q, step_size, p);
      r->master[i][j] = p;
      r->m[i][j] = m;
      r->v[i][j] = v;
    }
  }
}

int params_match_exact(const model *m, const adam_exact *r, char *msg, size_t msg_size) {
  for (int i = 0; i < m->count; ++i) {
    int32_t dtype = m->spec[i].param_dtype;
    for (int64_t j = 0; j < m->spec[i].numel; ++j) {
      float want = r->master[i][j];
      int ok;
      if (dtype == DSOPT_FLOAT32) {
        ok = memcmp(&((const float *)m->params[i].data)[j], &want, sizeof want) == 0;
      } else {
        uint16_t want16 = dtype == DSOPT_FLOAT16 ? float_to_half_bits(want) : float_to_bf16_bits(want);
        ok = element_bits16(m->params[i].data, j) == want16;
      }
      if (!ok) {
        snprintf(msg, msg_size, "tensor %d (%s, numel %lld) element %lld: got %.9g, contract gives %.9g", i,
                 dtype_label(dtype), (long long)m->spec[i].numel, (long long)j,
                 element_get(m->params[i].data, dtype, j), (double)want);
        return 0;
      }
    }
  }
  if (msg_size) msg[0] = '\0';
  return 1;
}

/* State views and group hyperparameters by name, at any number of ranks
 * (mpirun -np 1, 2, 4):
 *  - Adam/AdamW: the exp_avg, exp_avg_sq and master views equal an fp32
 *    reference of Adam written here, step after step, through the same
 *    pointers (views are live); a write through a view changes the next step
 *    as the same write changes the reference; dsopt_set_group_param of betas,
 *    eps, weight_decay and lr mid-run changes the next step as in the
 *    reference, and dsopt_get_group_param reads the values back;
 *  - bad groups, names and values are DSOPT_EINVAL and change nothing (the
 *    state blob stays byte for byte);
 *  - ZeRO stage 1 and 2: the ranks' views tile every parameter exactly once
 *    and equal the moments and masters of a stage-0 run; writes take effect;
 *  - 1-bit Adam, 1-bit LAMB, 0/1 Adam: the names dsopt_state_names lists, and
 *    views that agree with a second optimizer loaded from the first's blob.
 * Gradients are multiples of 2^-8 with few bits, so their sum over ranks and
 * the mean over a power-of-two number of ranks are exact in fp32 whatever
 * the order: results are compared bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/adam_config.h"
#include "support/blob_sections.h"
#include "support/dtype_ref.h"
#include "support/model.h"
#include "support/mpi_world.h"

#define NT 4
#define GRAD_STREAM 907

static const tensor_spec specs[NT] = {
    {37, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
    {50, DSOPT_BFLOAT16, DSOPT_FLOAT32, 1},
    {13, DSOPT_FLOAT32, DSOPT_FLOAT32, 1},
    {8, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
};

static const hyper group0 = {0.01, 0.9, 0.999, 1e-8, 0.01};
static const hyper group1 = {0.003, 0.8, 0.95, 1e-6, 0.1};

static adam_config two_groups(const char *extra) {
  adam_config c = adamw_config(group0);
  c.num_groups = 2;
  c.group[0] = group0;
  c.group[1] = group1;
  c.extra = extra;
  return c;
}

static int power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* ---- gradients ------------------------------------------------------------------ */

/* Rank r's gradient of step k: k/256 with 1 <= |k| <= 255, random sign
 * (never zero), the same wherever it is generated. */
static void rank_grads(float *g[NT], int rank, int step) {
  rng r = rng_for(GRAD_STREAM, (uint64_t)rank, (uint64_t)step);
  for (int i = 0; i < NT; ++i)
    for (int64_t j = 0; j < specs[i].numel; ++j) {
      const double k = 1.0 + (double)(rng_next(&r) % 255u);
      g[i][j] = (float)(((rng_next(&r) & 1u) ? -k : k) / 256.0);
    }
}

/* This rank's gradients of `step` into the model's gradient buffers. */
static void set_model_grads(model *m, int step) {
  float *g[NT];
  for (int i = 0; i < NT; ++i) g[i] = (float *)m->grads[i].data;
  rank_grads(g, world_rank(), step);
}

/* The mean over ranks (exact: see the top). */
static void mean_grads(float *mean[NT], int step) {
  const int ranks = world_size();
  float *g[NT];
  for (int i = 0; i < NT; ++i) {
    g[i] = (float *)malloc((size_t)specs[i].numel * sizeof(float));
    memset(mean[i], 0, (size_t)specs[i].numel * sizeof(float));
  }
  for (int r = 0; r < ranks; ++r) {
    rank_grads(g, r, step);
    for (int i = 0; i < NT; ++i)
      for (int64_t j = 0; j < specs[i].numel; ++j) mean[i][j] += g[i][j];
  }
  for (int i = 0; i < NT; ++i) {
    for (int64_t j = 0; j < specs[i].numel; ++j) mean[i][j] /= (float)ranks;
    free(g[i]);
  }
}

/* ---- the reference: AdamW with bias correction, in fp32 ------------------------------
 * Written from docs/optimizers/adam.md's step: m = beta1 m + (1 - beta1) g,
 * v = beta2 v + (1 - beta2) g^2, p -= lr wd p, p += -lr/(1 - beta1^t) *
 * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), with the library's roundings. */

typedef struct ref {
  hyper group[2];
  int64_t t;
  float *master[NT], *m[NT], *v[NT];
} ref;

static void ref_init(ref *r, const model *mod) {
  r->group[0] = group0;
  r->group[1] = group1;
  r->t = 0;
  for (int i = 0; i < NT; ++i) {
    const int64_t n = specs[i].numel;
    r->master[i] = (float *)malloc((size_t)n * sizeof(float));
    r->m[i] = (float *)calloc((size_t)n, sizeof(float));
    r->v[i] = (float *)calloc((size_t)n, sizeof(float));
    for (int64_t j = 0; j < n; ++j)
      r->master[i][j] = (float)element_get(mod->params[i].data, specs[i].param_dtype, j);
  }
}

static void ref_free(ref *r) {
  for (int i = 0; i < NT; ++i) {
    free(r->master[i]);
    free(r->m[i]);
    free(r->v[i]);
  }
}

static void ref_step(ref *r, float *const g[NT]) {
  r->t += 1;
  for (int i = 0; i < NT; ++i) {
    const hyper *h = &r->group[specs[i].group];
    const float beta1 = (float)h->beta1, beta2 = (float)h->beta2, eps = (float)h->eps;
    const float lr = (float)h->lr, wd = (float)h->weight_decay;
    const float bc1 = 1.0f - (float)pow((double)beta1, (double)r->t);
    const float rbc2 = 1.0f / sqrtf(1.0f - (float)pow((double)beta2, (double)r->t));
    const float step_size = -lr / bc1, decay = -lr * wd;
    for (int64_t j = 0; j < specs[i].numel; ++j) {
      float p = r->master[i][j], m = r->m[i][j], v = r->v[i][j];
      m = fmaf(g[i][j], 1.0f - beta1, m * beta1);
      v = fmaf(g[i][j] * g[i][j], 1.0f - beta2, v * beta2);
      const float q = m / fmaf(sqrtf(v), rbc2, eps);
      p = fmaf(p, decay, p);
      r->master[i][j] = fmaf(q, step_size, p);
      r->m[i][j] = m;
      r->v[i][j] = v;
    }
  }
}

/* ---- views ------------------------------------------------------------------------ */

static int get_view(dsopt_optimizer *opt, int64_t i, const char *name, dsopt_state_view *v) {
  memset(v, 0, sizeof *v);
  v->struct_size = sizeof *v;
  return dsopt_get_state_view(opt, i, name, v);
}

/* Whether view `v` of parameter i is well formed and holds want[offset ..
 * offset + numel) bit for bit; describes the first difference in msg. */
static int view_holds(const dsopt_state_view *v, int i, const float *want, char *msg, size_t size) {
  const int64_t n = v->tensor.numel;
  if (v->param_numel != specs[i].numel || v->tensor.dtype != DSOPT_FLOAT32 ||
      v->tensor.group != specs[i].group || v->device != DSOPT_COMM_HOST || n < 0 || v->offset < 0 ||
      v->offset + n > specs[i].numel || (n == 0) != (v->tensor.data == NULL)) {
    snprintf(msg, size, "malformed view of parameter %d (numel %lld at %lld of %lld)", i, (long long)n,
             (long long)v->offset, (long long)v->param_numel);
    return 0;
  }
  const float *data = (const float *)v->tensor.data;
  for (int64_t j = 0; j < n; ++j)
    if (memcmp(&data[j], &want[v->offset + j], sizeof(float)) != 0) {
      snprintf(msg, size, "parameter %d element %lld: view %.9g, expected %.9g", i,
               (long long)(v->offset + j), (double)data[j], (double)want[v->offset + j]);
      return 0;
    }
  return 1;
}

static int is_16bit(int i) { return specs[i].param_dtype != DSOPT_FLOAT32; }

/* The model's parameters hold the reference masters (16-bit: rounded). */
static int params_hold(const model *m, const ref *r, char *msg, size_t size) {
  for (int i = 0; i < NT; ++i)
    for (int64_t j = 0; j < specs[i].numel; ++j) {
      const float want = round_to_dtype(r->master[i][j], specs[i].param_dtype);
      const float got = (float)element_get(m->params[i].data, specs[i].param_dtype, j);
      if (memcmp(&got, &want, sizeof want) != 0) {
        snprintf(msg, size, "parameter %d element %lld: %.9g, reference %.9g", i, (long long)j,
                 (double)got, (double)want);
        return 0;
      }
    }
  return 1;
}

static dsopt_optimizer *create(const char *json, dsopt_comm *comm, model *m) {
  dsopt_optimizer *opt = NULL;
  const int ok = CHECK_OK(dsopt_create(&opt, json, comm, m->params, NT));
  if (all_ranks(ok)) return opt;
  dsopt_destroy(opt);
  return NULL;
}

static int step(dsopt_optimizer *opt, model *m, int k) {
  set_model_grads(m, k);
  return CHECK_OK(dsopt_step(opt, m->grads, NT, NULL));
}

/* The compressed allreduce's padded length (docs/optimizers/onebit-adam.md "The compressed
 * allreduce"): n rounded up to a multiple of P * lcm(P, 8). */
static int64_t padded_length(int64_t n, int world) {
  int64_t a = world, b = 8;
  while (b) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  const int64_t unit = (int64_t)world * (8 * world / a);
  return (n + unit - 1) / unit * unit;
}

/* Where parameter i's elements of state `name` start in its blob section:
 * the masters of the 16-bit parameters back to back; the worker errors one
 * padded tensor per parameter, or (fused) back to back like the moments. */
static int64_t blob_offset(const char *name, int i, int fused_errors) {
  int64_t at = 0;
  for (int k = 0; k < i; ++k) {
    if (!strcmp(name, "master"))
      at += is_16bit(k) ? specs[k].numel : 0;
    else if (!strcmp(name, "worker_error") && !fused_errors)
      at += padded_length(specs[k].numel, world_size());
    else
      at += specs[k].numel;
  }
  return at;
}

/* ---- Adam against the reference ------------------------------------------------------ */

#define ADAM_STEPS 8
#define WRITE_STEP 4 /* before this step the test writes through the views */
#define HYPER_STEP 6 /* before this step it sets group hyperparameters */

/* Parameter i's views: exp_avg, exp_avg_sq, master (16-bit only). */
typedef struct views {
  dsopt_state_view v[NT][3];
} views;

static const char *const view_names[3] = {"exp_avg", "exp_avg_sq", "master"};

static float *ref_array(ref *r, int k, int i) { return k == 0 ? r->m[i] : k == 1 ? r->v[i] : r->master[i]; }

static void write_through_views(views *w, ref *r) {
  for (int i = 0; i < NT; ++i)
    for (int k = 0; k < 3; ++k) {
      if (k == 2 && !is_16bit(i)) continue;
      float *data = (float *)w->v[i][k].tensor.data;
      float *want = ref_array(r, k, i);
      for (int64_t j = 0; j < specs[i].numel; ++j) {
        /* exp_avg changes sign, exp_avg_sq doubles, masters move */
        const float x = k == 0 ? -0.5f * data[j] : k == 1 ? 2.0f * data[j] : data[j] + 0.25f;
        data[j] = x;
        want[j] = x;
      }
    }
}

/* The group hyperparameters dsopt_set_group_param takes, and the field of
 * the reference each one sets. */
static const char *const hyper_names[5] = {"lr", "beta1", "beta2", "eps", "weight_decay"};

static double *hyper_field(hyper *h, const char *name) {
  double *const fields[5] = {&h->lr, &h->beta1, &h->beta2, &h->eps, &h->weight_decay};
  for (int k = 0; k < 5; ++k)
    if (!strcmp(name, hyper_names[k])) return fields[k];
  return NULL;
}

static void set_hyperparameters(dsopt_optimizer *opt, ref *r) {
  static const struct {
    int group;
    const char *name;
    double value;
  } changes[] = {{0, "beta1", 0.5},  {1, "beta2", 0.9},  {1, "eps", 1e-3},
                 {0, "weight_decay", 0.2}, {1, "lr", 0.02}, {0, "eps", 0.0}};
  for (size_t k = 0; k < sizeof changes / sizeof changes[0]; ++k) {
    CHECK_OK(dsopt_set_group_param(opt, changes[k].group, changes[k].name, changes[k].value));
    *hyper_field(&r->group[changes[k].group], changes[k].name) = changes[k].value;
  }
  /* every value reads back, the learning rates also through dsopt_get_lr */
  for (int g = 0; g < 2; ++g) {
    for (int k = 0; k < 5; ++k) {
      const double want = *hyper_field(&r->group[g], hyper_names[k]);
      double got = -1.0;
      CHECK_OK(dsopt_get_group_param(opt, g, hyper_names[k], &got));
      CHECKF(got == want, "group %d %s: got %.17g, set %.17g", g, hyper_names[k], got, want);
    }
    double lr = -1.0;
    CHECK_OK(dsopt_get_lr(opt, g, &lr));
    CHECK(lr == r->group[g].lr);
  }
}

static void adam_views_follow_the_reference(void) {
  char json[1024], msg[256];
  adam_config c = two_groups("\"threads\": 1");
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NT, 21);
  dsopt_optimizer *opt = create(adam_config_json(&c, json, sizeof json), comm, &m);
  if (opt) {
    const char *names = NULL;
    CHECK_OK(dsopt_state_names(opt, &names));
    CHECKF(names && !strcmp(names, "exp_avg exp_avg_sq master"), "names \"%s\"", names ? names : "");
    ref r;
    ref_init(&r, &m);
    views w;
    for (int i = 0; i < NT; ++i)
      for (int k = 0; k < 3; ++k) {
        if (k == 2 && !is_16bit(i)) {
          CHECK_STATUS(get_view(opt, i, "master", &w.v[i][k]), DSOPT_EINVAL);
          CHECK_ERROR_MENTIONS("16-bit");
          continue;
        }
        CHECK_OK(get_view(opt, i, view_names[k], &w.v[i][k]));
        CHECK(w.v[i][k].offset == 0 && w.v[i][k].tensor.numel == specs[i].numel);
      }
    /* the moments start at zero, the masters at the parameters */
    for (int i = 0; i < NT; ++i)
      for (int k = 0; k < (is_16bit(i) ? 3 : 2); ++k)
        CHECKF(view_holds(&w.v[i][k], i, ref_array(&r, k, i), msg, sizeof msg), "before: %s: %s",
               view_names[k], msg);
    float *mean[NT];
    for (int i = 0; i < NT; ++i) mean[i] = (float *)malloc((size_t)specs[i].numel * sizeof(float));
    for (int k = 1; k <= ADAM_STEPS; ++k) {
      if (k == WRITE_STEP) write_through_views(&w, &r);
      if (k == HYPER_STEP) set_hyperparameters(opt, &r);
      step(opt, &m, k);
      mean_grads(mean, k);
      ref_step(&r, mean);
      /* the views taken before the first step show this step's state */
      for (int i = 0; i < NT; ++i)
        for (int s = 0; s < (is_16bit(i) ? 3 : 2); ++s)
          CHECKF(view_holds(&w.v[i][s], i, ref_array(&r, s, i), msg, sizeof msg), "step %d: %s: %s", k,
                 view_names[s], msg);
      CHECKF(params_hold(&m, &r, msg, sizeof msg), "step %d: %s", k, msg);
    }
    /* the same pointers again */
    for (int i = 0; i < NT; ++i)
      for (int s = 0; s < (is_16bit(i) ? 3 : 2); ++s) {
        dsopt_state_view again;
        CHECK_OK(get_view(opt, i, view_names[s], &again));
        CHECK(again.tensor.data == w.v[i][s].tensor.data && again.tensor.numel == w.v[i][s].tensor.numel);
      }
    for (int i = 0; i < NT; ++i) free(mean[i]);
    ref_free(&r);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* ---- bad arguments change nothing ------------------------------------------------------ */

static void bad_arguments_change_nothing(void) {
  char json[1024];
  adam_config c = two_groups("\"threads\": 1");
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NT, 22);
  dsopt_optimizer *opt = create(adam_config_json(&c, json, sizeof json), comm, &m);
  if (opt) {
    for (int k = 1; k <= 2; ++k) step(opt, &m, k);
    uint64_t before_size, after_size;
    unsigned char *before = state_blob(opt, &before_size);
    double values_before[2][5];
    for (int g = 0; g < 2; ++g)
      for (int k = 0; k < 5; ++k) CHECK_OK(dsopt_get_group_param(opt, g, hyper_names[k], &values_before[g][k]));

    static const struct {
      int group;
      const char *name;
      double value;
      const char *mentions;
    } bad[] = {
        {-1, "lr", 0.1, "group -1"},
        {2, "lr", 0.1, "group 2"},
        {0, "beta3", 0.5, "beta3"},
        {0, "LR", 0.1, "weight_decay"}, /* the message lists the names */
        {0, "", 0.1, "beta1"},
        {0, "beta1", 1.0, "beta1"},
        {1, "beta1", -0.1, "[0, 1)"},
        {0, "beta2", NAN, "beta2"},
        {1, "beta2", 1.5, "beta2"},
        {1, "beta2", 0.99999999, "fp32"}, /* below 1, but 1 in fp32 */
        {0, "eps", -1e-8, "eps"},
        {1, "eps", INFINITY, "eps"},
        {0, "lr", NAN, "lr"},
        {0, "lr", -0.01, ">= 0"},
        {1, "weight_decay", -0.5, "weight_decay"},
        {1, "weight_decay", -INFINITY, "finite"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
      CHECKF(dsopt_set_group_param(opt, bad[k].group, bad[k].name, bad[k].value) == DSOPT_EINVAL,
             "set_group_param(%d, \"%s\", %g) should be DSOPT_EINVAL", bad[k].group, bad[k].name,
             bad[k].value);
      CHECK_ERROR_MENTIONS(bad[k].mentions);
    }
    double value = 0.0;
    CHECK_STATUS(dsopt_set_group_param(opt, 0, NULL, 0.1), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_set_group_param(NULL, 0, "lr", 0.1), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_get_group_param(opt, 2, "lr", &value), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_get_group_param(opt, 0, "momentum", &value), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("beta2");
    CHECK_STATUS(dsopt_get_group_param(opt, 0, "lr", NULL), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_get_group_param(NULL, 0, "lr", &value), DSOPT_EINVAL);

    dsopt_state_view v;
    CHECK_STATUS(get_view(opt, -1, "exp_avg", &v), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("out of range");
    CHECK_STATUS(get_view(opt, NT, "exp_avg", &v), DSOPT_EINVAL);
    CHECK_STATUS(get_view(opt, 0, "exp_avg_sqrt", &v), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("exp_avg exp_avg_sq master");
    CHECK_STATUS(get_view(opt, 0, "worker_error", &v), DSOPT_EINVAL);
    CHECK_STATUS(get_view(opt, 0, NULL, &v), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_get_state_view(opt, 0, "exp_avg", NULL), DSOPT_EINVAL);
    memset(&v, 0, sizeof v);
    v.struct_size = 2; /* below the struct_size field itself */
    CHECK_STATUS(dsopt_get_state_view(opt, 0, "exp_avg", &v), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("struct_size");
    const char *names_out = NULL;
    CHECK_STATUS(dsopt_state_names(NULL, &names_out), DSOPT_EINVAL);
    CHECK_STATUS(dsopt_state_names(opt, NULL), DSOPT_EINVAL);

    unsigned char *after = state_blob(opt, &after_size);
    CHECK(before && same_bytes(before, before_size, after, after_size));
    for (int g = 0; g < 2; ++g)
      for (int k = 0; k < 5; ++k) {
        double now = -1.0;
        CHECK_OK(dsopt_get_group_param(opt, g, hyper_names[k], &now));
        CHECKF(now == values_before[g][k], "group %d %s changed to %.17g", g, hyper_names[k], now);
      }
    /* a view stays valid across a load, and shows what was loaded */
    dsopt_state_view kept;
    CHECK_OK(get_view(opt, 1, "exp_avg_sq", &kept));
    step(opt, &m, 3);
    if (before) {
      char msg[256] = "";
      uint64_t len = 0;
      const uint8_t *saved = blob_section(before, "adam.exp_avg_sq", &len);
      CHECK_OK(dsopt_state_load(opt, before, before_size));
      CHECKF(saved && len == 4 * (uint64_t)(specs[0].numel + specs[1].numel + specs[2].numel + specs[3].numel) &&
                 view_holds(&kept, 1, (const float *)(const void *)(saved + 4 * blob_offset("exp_avg_sq", 1, 0)),
                            msg, sizeof msg),
             "after the load: %s", saved ? msg : "no section adam.exp_avg_sq");
    }
    free(before);
    free(after);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* ---- ZeRO: pieces of the ranks tile the parameters ------------------------------------ */

/* Whether the ranks' pieces (offset, numel) of parameter i cover it exactly
 * once. Collective. */
static int pieces_tile(const dsopt_state_view *v, int i) {
  const int ranks = world_size();
  int64_t mine[2] = {v->offset, v->tensor.numel};
  int64_t *all = (int64_t *)malloc((size_t)ranks * 2 * sizeof(int64_t));
  MPI_Allgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, MPI_COMM_WORLD);
  int64_t covered = 0;
  int ok = 1;
  /* walk from 0: exactly one piece must start where the covered part ends */
  while (ok && covered < specs[i].numel) {
    int starts = 0;
    int64_t next = covered;
    for (int r = 0; r < ranks; ++r)
      if (all[2 * r + 1] > 0 && all[2 * r] == covered) {
        ++starts;
        next = covered + all[2 * r + 1];
      }
    ok = starts == 1;
    covered = next;
  }
  int64_t total = 0;
  for (int r = 0; r < ranks; ++r) total += all[2 * r + 1];
  free(all);
  return ok && covered == specs[i].numel && total == specs[i].numel;
}

/* The write of the ZeRO test: exp_avg_sq triples (stays > 0), the others move. */
static float nudge(int s, float x) { return s == 1 ? 3.0f * x : x - 0.125f; }

static void zero_views_tile_and_equal_stage_0(int stage) {
  char json[1024], extra[256], msg[256];
  snprintf(extra, sizeof extra, "\"threads\": 1, \"zero_optimization\": {\"stage\": %d}", stage);
  adam_config c0 = two_groups("\"threads\": 1"), cz = two_groups(extra);
  dsopt_comm *comm = world_comm();
  model m0, mz;
  model_init(&m0, specs, NT, 23);
  model_init(&mz, specs, NT, 23);
  dsopt_optimizer *opt0 = create(adam_config_json(&c0, json, sizeof json), comm, &m0);
  dsopt_optimizer *optz = opt0 ? create(adam_config_json(&cz, json, sizeof json), comm, &mz) : NULL;
  if (optz) {
    const char *names = NULL;
    CHECK_OK(dsopt_state_names(optz, &names));
    CHECKF(names && !strcmp(names, "exp_avg exp_avg_sq master"), "names \"%s\"", names ? names : "");
    for (int round = 0; round < 2; ++round) {
      for (int k = 1; k <= 3; ++k) {
        step(opt0, &m0, 3 * round + k);
        step(optz, &mz, 3 * round + k);
      }
      CHECKF(model_params_identical(&m0, &mz), "stage %d round %d: parameters equal stage 0's", stage, round);
      for (int i = 0; i < NT; ++i)
        for (int s = 0; s < 3; ++s) {
          dsopt_state_view v0, vz;
          if (s == 2 && !is_16bit(i)) {
            CHECK_STATUS(get_view(optz, i, "master", &vz), DSOPT_EINVAL);
            continue;
          }
          CHECK_OK(get_view(opt0, i, view_names[s], &v0));
          if (!CHECK_OK(get_view(optz, i, view_names[s], &vz))) memset(&vz, 0, sizeof vz);
          CHECKF(view_holds(&vz, i, (const float *)v0.tensor.data, msg, sizeof msg), "stage %d %s: %s",
                 stage, view_names[s], msg);
          CHECKF(pieces_tile(&vz, i), "stage %d: the ranks' %s views of parameter %d tile it once", stage,
                 view_names[s], i);
          /* a write through the view takes effect (stage 0 gets the same below) */
          if (round == 0)
            for (int64_t j = 0; j < vz.tensor.numel; ++j)
              ((float *)vz.tensor.data)[j] = nudge(s, ((float *)vz.tensor.data)[j]);
        }
      /* stage 0's state is whole on every rank: the ranks' pieces together */
      if (round == 0)
        for (int i = 0; i < NT; ++i)
          for (int s = 0; s < (is_16bit(i) ? 3 : 2); ++s) {
            dsopt_state_view v0;
            CHECK_OK(get_view(opt0, i, view_names[s], &v0));
            for (int64_t j = 0; j < specs[i].numel; ++j)
              ((float *)v0.tensor.data)[j] = nudge(s, ((float *)v0.tensor.data)[j]);
          }
    }
  }
  dsopt_destroy(optz);
  dsopt_destroy(opt0);
  dsopt_comm_destroy(comm);
  model_free(&m0);
  model_free(&mz);
}

static void zero_stage_1_views(void) { zero_views_tile_and_equal_stage_0(1); }
static void zero_stage_2_views(void) { zero_views_tile_and_equal_stage_0(2); }

/* Reduce buckets smaller than a parameter cut it into several runs of a
 * rank's shard (at more than one rank): one view cannot show them. */
static void zero_views_of_parameters_split_by_buckets(void) {
  char json[1024];
  adam_config c = two_groups("\"threads\": 1, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 16}");
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NT, 24);
  dsopt_optimizer *opt = create(adam_config_json(&c, json, sizeof json), comm, &m);
  if (opt) {
    step(opt, &m, 1);
    dsopt_state_view v;
    if (world_size() == 1) {
      /* one rank owns every bucket whole: the runs join */
      CHECK_OK(get_view(opt, 1, "exp_avg", &v));
      CHECK(v.offset == 0 && v.tensor.numel == specs[1].numel);
      CHECK_OK(get_view(opt, 1, "master", &v));
      CHECK(v.offset == 0 && v.tensor.numel == specs[1].numel);
    } else {
      CHECK_STATUS(get_view(opt, 1, "exp_avg", &v), DSOPT_EINVAL);
      CHECK_ERROR_MENTIONS("reduce_bucket_size");
    }
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

/* ---- the 1-bit optimizers ---------------------------------------------------------- */

/* The views of every name and parameter of a and b hold the same bits. */
static int same_views(dsopt_optimizer *a, dsopt_optimizer *b, const char *names, char *msg, size_t size) {
  char list[256];
  snprintf(list, sizeof list, "%s", names);
  for (char *name = strtok(list, " "); name; name = strtok(NULL, " "))
    for (int i = 0; i < NT; ++i) {
      dsopt_state_view va, vb;
      const int sa = get_view(a, i, name, &va), sb = get_view(b, i, name, &vb);
      if (sa != sb) {
        snprintf(msg, size, "%s of parameter %d: status %d and %d", name, i, sa, sb);
        return 0;
      }
      if (sa != DSOPT_OK) continue; /* e.g. master of an fp32 parameter */
      if (va.tensor.data == vb.tensor.data) {
        snprintf(msg, size, "%s of parameter %d: both optimizers show the same memory", name, i);
        return 0;
      }
      if (!view_holds(&va, i, (const float *)vb.tensor.data, msg, size)) {
        snprintf(msg + strlen(msg), size - strlen(msg), " (%s)", name);
        return 0;
      }
    }
  return 1;
}

static int any_nonzero(dsopt_optimizer *opt, const char *name) {
  for (int i = 0; i < NT; ++i) {
    dsopt_state_view v;
    if (get_view(opt, i, name, &v) != DSOPT_OK) continue;
    for (int64_t j = 0; j < v.tensor.numel; ++j)
      if (((const float *)v.tensor.data)[j] != 0.0f) return 1;
  }
  return 0;
}

/* A 1-bit optimizer, the prefix of its blob sections and its state names. */
typedef struct onebit_case {
  const char *what, *config, *prefix;
  const char *names_one_rank, *names_many_ranks;
  int errors_from_start; /* 0/1 Adam: its compressed allreduce exists from the start */
  int fused_errors;      /* 1-bit LAMB: one compressed tensor, the fused momentum */
} onebit_case;

/* Every view of `opt` holds what `blob` (its own save) holds for it. */
static int views_match_blob(dsopt_optimizer *opt, const onebit_case *c, const char *names,
                            const uint8_t *blob, char *msg, size_t size) {
  char list[256];
  snprintf(list, sizeof list, "%s", names);
  for (char *name = strtok(list, " "); name; name = strtok(NULL, " ")) {
    char section[64];
    if (!strcmp(name, "master"))
      snprintf(section, sizeof section, "common.masters");
    else
      snprintf(section, sizeof section, "%s.%s", c->prefix, name);
    uint64_t len = 0;
    const uint8_t *data = blob_section(blob, section, &len);
    for (int i = 0; i < NT; ++i) {
      dsopt_state_view v;
      if (get_view(opt, i, name, &v) != DSOPT_OK) continue;
      const int64_t at = blob_offset(name, i, c->fused_errors);
      if (!data || (uint64_t)(at + specs[i].numel) * 4 > len) {
        snprintf(msg, size, "the blob has no section %s for parameter %d", section, i);
        return 0;
      }
      if (!view_holds(&v, i, (const float *)(const void *)(data + 4 * at), msg, size)) {
        snprintf(msg + strlen(msg), size - strlen(msg), " (%s against the blob)", name);
        return 0;
      }
    }
  }
  return 1;
}

static void onebit_views(const onebit_case *c) {
  char msg[256];
  dsopt_comm *comm = world_comm();
  model ma, mb;
  model_init(&ma, specs, NT, 25);
  model_init(&mb, specs, NT, 26);
  dsopt_optimizer *a = create(c->config, comm, &ma);
  dsopt_optimizer *b = a ? create(c->config, comm, &mb) : NULL;
  if (b) {
    const char *names = NULL;
    const char *want = world_size() > 1 ? c->names_many_ranks : c->names_one_rank;
    CHECK_OK(dsopt_state_names(a, &names));
    CHECKF(names && !strcmp(names, want), "%s: names \"%s\", expected \"%s\"", c->what, names ? names : "",
           want);
    if (!names) names = "";
    dsopt_state_view v;
    if (world_size() > 1 && !c->errors_from_start) {
      CHECK_STATUS(get_view(a, 0, "worker_error", &v), DSOPT_EINVAL);
      CHECK_ERROR_MENTIONS("freeze_step");
    }
    CHECK_STATUS(get_view(a, 0, "master", &v), DSOPT_EINVAL);
    CHECK_OK(get_view(a, 1, "master", &v));
    for (int k = 1; k <= 5; ++k) step(a, &ma, k);
    CHECKF(any_nonzero(a, "exp_avg") && any_nonzero(a, "exp_avg_sq"), "%s: the moments moved", c->what);
    if (world_size() > 1) CHECKF(any_nonzero(a, "worker_error"), "%s: the compression errors moved", c->what);
    /* a write through a's view travels in its blob (the same on every rank) */
    CHECK_OK(get_view(a, 2, "exp_avg", &v));
    ((float *)v.tensor.data)[3] = 0.375f;
    uint64_t size;
    unsigned char *blob = state_blob(a, &size);
    if (CHECK(blob != NULL)) {
      CHECKF(views_match_blob(a, c, names, blob, msg, sizeof msg), "%s: %s", c->what, msg);
      CHECK_OK(dsopt_state_load(b, blob, size));
      CHECKF(views_match_blob(b, c, names, blob, msg, sizeof msg), "%s after the load: %s", c->what, msg);
    }
    free(blob);
    CHECKF(same_views(a, b, names, msg, sizeof msg), "%s after the load: %s", c->what, msg);
    /* the same steps keep them equal (the views are what the steps use) */
    model_copy_params(&mb, &ma);
    for (int k = 6; k <= 7; ++k) {
      step(a, &ma, k);
      step(b, &mb, k);
    }
    CHECKF(model_params_identical(&ma, &mb), "%s: parameters after the same steps", c->what);
    CHECKF(same_views(a, b, names, msg, sizeof msg), "%s after two more steps: %s", c->what, msg);
  }
  dsopt_destroy(b);
  dsopt_destroy(a);
  dsopt_comm_destroy(comm);
  model_free(&ma);
  model_free(&mb);
}

static void onebit_adam_views(void) {
  const onebit_case c = {
      "1-bit Adam",
      "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 2}},"
      " \"param_groups\": [{}, {\"lr\": 0.005, \"weight_decay\": 0.01}], \"threads\": 1}",
      "onebit", "exp_avg exp_avg_sq master", "exp_avg exp_avg_sq worker_error master", 0, 0};
  onebit_views(&c);
}

static void onebit_adam_non_freeze_group_has_no_worker_error(void) {
  const char *config =
      "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 2}},"
      " \"param_groups\": [{}, {\"non_freeze\": true}], \"threads\": 1}";
  dsopt_comm *comm = world_comm();
  model m;
  model_init(&m, specs, NT, 27);
  dsopt_optimizer *opt = create(config, comm, &m);
  if (opt && world_size() > 1) {
    for (int k = 1; k <= 3; ++k) step(opt, &m, k);
    dsopt_state_view v;
    CHECK_OK(get_view(opt, 0, "worker_error", &v)); /* group 0: compressed */
    CHECK(v.tensor.numel == specs[0].numel && v.offset == 0);
    CHECK_STATUS(get_view(opt, 1, "worker_error", &v), DSOPT_EINVAL); /* group 1: non_freeze */
    CHECK_ERROR_MENTIONS("non_freeze");
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  model_free(&m);
}

static void onebit_lamb_views(void) {
  const onebit_case c = {
      "1-bit LAMB",
      "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 2,"
      " \"weight_decay\": 0.01}}, \"param_groups\": [{}, {\"lr\": 0.005}], \"threads\": 1}",
      "lamb", "exp_avg exp_avg_sq exp_avg_sq_fresh master",
      "exp_avg exp_avg_sq exp_avg_sq_fresh worker_error master", 0, 1};
  onebit_views(&c);
}

static void zero_one_adam_views(void) {
  const onebit_case c = {
      "0/1 Adam",
      "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 3,"
      " \"var_update_scaler\": 1, \"local_step_scaler\": 1, \"local_step_clipper\": 2}},"
      " \"param_groups\": [{}, {\"lr\": 0.005, \"weight_decay\": 0.01}], \"threads\": 1}",
      "zoadam", "exp_avg exp_avg_sq master", "exp_avg exp_avg_sq worker_error master", 1, 0};
  onebit_views(&c);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  if (!power_of_two(world_size())) {
    /* the exact means above need it */
    check_skip("test_state_views", "needs a power-of-two number of ranks");
  } else {
    RUN_TEST(adam_views_follow_the_reference);
    RUN_TEST(bad_arguments_change_nothing);
    RUN_TEST(zero_stage_1_views);
    RUN_TEST(zero_stage_2_views);
    RUN_TEST(zero_views_of_parameters_split_by_buckets);
    RUN_TEST(onebit_adam_views);
    RUN_TEST(onebit_adam_non_freeze_group_has_no_worker_error);
    RUN_TEST(onebit_lamb_views);
    RUN_TEST(zero_one_adam_views);
  }
  int status = check_finish();
  MPI_Finalize();
  return status;
}

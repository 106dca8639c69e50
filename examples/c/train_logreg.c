/*
 * Data-parallel softmax regression trained with dsopt's AdamW.
 *
 * The model is a weight matrix W (CLASSES x FEATURES) and a bias b
 * (CLASSES): two tensors in two parameter groups (weight decay on W only).
 * The data set is generated from a fixed seed: badly scaled Gaussian
 * features, labels drawn from a noisy "teacher" softmax model, so the best
 * reachable loss is well above zero and plain gradient descent would crawl.
 *
 * Every step takes one global batch of GLOBAL_BATCH samples; rank r of P
 * computes the mean gradient over its contiguous slice of that batch and
 * hands it to dsopt_step, which averages across ranks and applies AdamW to
 * the replicated parameters. With P dividing GLOBAL_BATCH, 1 process and P
 * processes train the same model on the same batches.
 *
 * Built twice from this file: without USE_MPI (a local communicator, one
 * process) and with USE_MPI (MPI_COMM_WORLD handed to dsopt by its Fortran
 * handle).
 *
 * Usage: train_logreg [--steps N] [--print-every K]
 *        (DSOPT_DEMO_STEPS in the environment sets the default step count)
 * Exits 0 when the final training loss is below 0.8 x the initial one.
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef USE_MPI
#include <mpi.h>
#endif

#include "dsopt.h"

enum {
  FEATURES = 128,
  CLASSES = 24,
  TRAIN_SAMPLES = 16384,
  TEST_SAMPLES = 2048,
  GLOBAL_BATCH = 256,
  DEFAULT_STEPS = 300,
  DEFAULT_PRINT_EVERY = 25
};

static const double kPeakLr = 0.02;
static const double kFinalLrFraction = 0.05;
static const double kWeightDecay = 0.01;
static const double kRequiredLossRatio = 0.8;

/* ---- process world: MPI or one process ---------------------------------- */

static int g_rank = 0;
static int g_size = 1;

static void world_init(int *argc, char ***argv) {
#ifdef USE_MPI
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
#else
  (void)argc;
  (void)argv;
#endif
}

static void world_finalize(void) {
#ifdef USE_MPI
  MPI_Finalize();
#endif
}

static void world_abort(int code) {
  fflush(stdout);
  fflush(stderr);
#ifdef USE_MPI
  if (g_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  exit(code);
}

/* Sums `n` doubles over all ranks, in place. */
static void world_sum(double *values, int n) {
#ifdef USE_MPI
  MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#else
  (void)values;
  (void)n;
#endif
}

/* Whether `value` is the same on every rank. */
static int world_all_equal(uint64_t value) {
#ifdef USE_MPI
  unsigned long long lo = value, hi = value;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
#else
  (void)value;
  return 1;
#endif
}

static double wall_seconds(void) {
#ifdef USE_MPI
  return MPI_Wtime();
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

/* Every dsopt call that returns a status goes through this. */
#define CHECK(call)                                                              \
  do {                                                                           \
    int status_ = (call);                                                        \
    if (status_ != DSOPT_OK) {                                                   \
      fprintf(stderr, "rank %d: %s failed: %s (%d): %s\n", g_rank, #call,        \
              dsopt_status_string(status_), status_, dsopt_last_error());        \
      world_abort(1);                                                            \
    }                                                                            \
  } while (0)

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes);
  if (!p) {
    fprintf(stderr, "rank %d: out of memory (%zu bytes)\n", g_rank, bytes);
    world_abort(1);
  }
  return p;
}

/* ---- deterministic random numbers (same stream on every rank) ----------- */

static uint64_t rng_next(uint64_t *state) { /* splitmix64 */
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *state) { /* [0, 1) */
  return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *state) {
  const double two_pi = 6.283185307179586;
  double u1 = rng_uniform(state), u2 = rng_uniform(state);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(two_pi * u2);
}

/* ---- data set ----------------------------------------------------------- */

typedef struct dataset {
  int count;
  float *x;   /* count x FEATURES */
  int *label; /* count */
  double teacher_loss; /* mean -log p_teacher(label): about the best reachable loss */
} dataset;

typedef struct teacher {
  double w[CLASSES * FEATURES];
  double b[CLASSES];
  double feature_scale[FEATURES];
} teacher;

static void teacher_init(teacher *t, uint64_t seed) {
  uint64_t rng = seed;
  for (int j = 0; j < FEATURES; ++j) /* scales from 0.1 to 10: badly conditioned */
    t->feature_scale[j] = pow(10.0, -1.0 + 2.0 * rng_uniform(&rng));
  for (int k = 0; k < CLASSES; ++k) {
    t->b[k] = 0.5 * rng_normal(&rng);
    for (int j = 0; j < FEATURES; ++j)
      t->w[k * FEATURES + j] = 4.0 * rng_normal(&rng) / (sqrt((double)FEATURES) * t->feature_scale[j]);
  }
}

/* Features ~ N(0, scale_j^2); label drawn from softmax(teacher logits). */
static dataset dataset_make(const teacher *t, int count, uint64_t seed) {
  dataset d;
  uint64_t rng = seed;
  double logits[CLASSES];
  d.count = count;
  d.x = (float *)xmalloc(sizeof(float) * (size_t)count * FEATURES);
  d.label = (int *)xmalloc(sizeof(int) * (size_t)count);
  d.teacher_loss = 0.0;
  for (int i = 0; i < count; ++i) {
    float *x = d.x + (size_t)i * FEATURES;
    double top = -HUGE_VAL, total = 0.0, pick;
    int k;
    for (int j = 0; j < FEATURES; ++j) x[j] = (float)(t->feature_scale[j] * rng_normal(&rng));
    for (k = 0; k < CLASSES; ++k) {
      double z = t->b[k];
      for (int j = 0; j < FEATURES; ++j) z += t->w[k * FEATURES + j] * x[j];
      logits[k] = z;
      if (z > top) top = z;
    }
    for (k = 0; k < CLASSES; ++k) total += (logits[k] = exp(logits[k] - top));
    pick = rng_uniform(&rng) * total;
    for (k = 0; k < CLASSES - 1 && pick >= logits[k]; ++k) pick -= logits[k];
    d.label[i] = k;
    d.teacher_loss -= log(logits[k] / total) / count;
  }
  return d;
}

static void dataset_free(dataset *d) {
  free(d->x);
  free(d->label);
}

/* ---- the model: softmax regression -------------------------------------- */

/* Softmax probabilities of one sample into prob[]; returns -log prob[label]. */
static double forward_one(const float *w, const float *b, const float *x, int label,
                          double *prob) {
  double top = -HUGE_VAL, total = 0.0;
  for (int k = 0; k < CLASSES; ++k) {
    const float *row = w + (size_t)k * FEATURES;
    double z = b[k];
    for (int j = 0; j < FEATURES; ++j) z += (double)row[j] * x[j];
    prob[k] = z;
    if (z > top) top = z;
  }
  for (int k = 0; k < CLASSES; ++k) total += exp(prob[k] - top);
  {
    const double log_total = log(total) + top;
    const double loss = log_total - prob[label];
    for (int k = 0; k < CLASSES; ++k) prob[k] = exp(prob[k] - log_total);
    return loss;
  }
}

static int argmax(const double *v) {
  int best = 0;
  for (int k = 1; k < CLASSES; ++k)
    if (v[k] > v[best]) best = k;
  return best;
}

/* Mean gradient over samples index[0..n) into gw, gb. */
static void local_gradient(const float *w, const float *b, const dataset *d, const int *index,
                           int n, float *gw, float *gb) {
  static double acc_w[CLASSES * FEATURES];
  double acc_b[CLASSES], prob[CLASSES];
  memset(acc_w, 0, sizeof acc_w);
  memset(acc_b, 0, sizeof acc_b);
  for (int s = 0; s < n; ++s) {
    const int i = index[s];
    const float *x = d->x + (size_t)i * FEATURES;
    forward_one(w, b, x, d->label[i], prob);
    prob[d->label[i]] -= 1.0; /* d loss / d logits */
    for (int k = 0; k < CLASSES; ++k) {
      double *row = acc_w + (size_t)k * FEATURES;
      acc_b[k] += prob[k];
      for (int j = 0; j < FEATURES; ++j) row[j] += prob[k] * x[j];
    }
  }
  for (int k = 0; k < CLASSES; ++k) gb[k] = n ? (float)(acc_b[k] / n) : 0.0f;
  for (int e = 0; e < CLASSES * FEATURES; ++e) gw[e] = n ? (float)(acc_w[e] / n) : 0.0f;
}

typedef struct eval_result {
  double loss;
  double accuracy;
} eval_result;

/* Mean loss and accuracy over the whole data set, each rank taking a slice. */
static eval_result evaluate(const float *w, const float *b, const dataset *d) {
  double sums[3] = {0.0, 0.0, 0.0}; /* loss, correct, count */
  double prob[CLASSES];
  const int lo = (int)((int64_t)d->count * g_rank / g_size);
  const int hi = (int)((int64_t)d->count * (g_rank + 1) / g_size);
  eval_result r;
  for (int i = lo; i < hi; ++i) {
    sums[0] += forward_one(w, b, d->x + (size_t)i * FEATURES, d->label[i], prob);
    sums[1] += argmax(prob) == d->label[i];
    sums[2] += 1.0;
  }
  world_sum(sums, 3);
  r.loss = sums[0] / sums[2];
  r.accuracy = sums[1] / sums[2];
  return r;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t bytes) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

/* Fisher-Yates permutation of 0..n-1 for one epoch, the same on every rank. */
static void shuffle(int *order, int n, uint64_t seed) {
  uint64_t rng = seed;
  for (int i = 0; i < n; ++i) order[i] = i;
  for (int i = n - 1; i > 0; --i) {
    const int j = (int)(rng_next(&rng) % (uint64_t)(i + 1));
    const int tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
}

/* Cosine decay from kPeakLr to kFinalLrFraction * kPeakLr. */
static double lr_at(int step, int steps) {
  const double pi = 3.141592653589793;
  const double progress = steps > 1 ? (double)step / (double)(steps - 1) : 1.0;
  const double floor_lr = kFinalLrFraction * kPeakLr;
  return floor_lr + 0.5 * (kPeakLr - floor_lr) * (1.0 + cos(pi * progress));
}

static dsopt_tensor fp32_tensor(float *data, int64_t numel, int32_t group) {
  dsopt_tensor t;
  t.data = data;
  t.numel = numel;
  t.dtype = DSOPT_FLOAT32;
  t.group = group;
  return t;
}

static int parse_count(const char *text, const char *what) {
  char *end = NULL;
  long v = strtol(text, &end, 10);
  if (!text[0] || *end || v < 1 || v > 1000000) {
    if (g_rank == 0) fprintf(stderr, "train_logreg: bad %s '%s'\n", what, text);
    world_abort(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  int steps = DEFAULT_STEPS, print_every = DEFAULT_PRINT_EVERY;
  const char *env_steps = getenv("DSOPT_DEMO_STEPS");
  dsopt_comm *comm = NULL;
  dsopt_optimizer *opt = NULL;
  dsopt_tensor params[2], grads[2];
  dsopt_step_info info;
  teacher *t;
  dataset train, test;
  float *w, *b, *gw, *gb;
  int *order, *batch_index;
  eval_result first, last, test_result;
  uint64_t bytes_sent_per_step = 0, replica_hash;
  int identical, ok;
  double t0, elapsed;
  char config[1024];

  world_init(&argc, &argv);
  if (env_steps && env_steps[0]) steps = parse_count(env_steps, "DSOPT_DEMO_STEPS");
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = parse_count(argv[++i], "--steps");
    } else if (!strcmp(argv[i], "--print-every") && i + 1 < argc) {
      print_every = parse_count(argv[++i], "--print-every");
    } else {
      if (g_rank == 0) fprintf(stderr, "usage: %s [--steps N] [--print-every K]\n", argv[0]);
      world_abort(2);
    }
  }

#ifdef USE_MPI
  CHECK(dsopt_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)));
#else
  CHECK(dsopt_comm_create_local(&comm));
#endif
  if (dsopt_comm_rank(comm) != g_rank || dsopt_comm_size(comm) != g_size) {
    fprintf(stderr, "rank %d: communicator says rank %d of %d, expected %d of %d\n", g_rank,
            dsopt_comm_rank(comm), dsopt_comm_size(comm), g_rank, g_size);
    world_abort(1);
  }

  /* Same data on every rank (fixed seeds); each rank reads only its slices. */
  t = (teacher *)xmalloc(sizeof *t);
  teacher_init(t, 20240611u);
  train = dataset_make(t, TRAIN_SAMPLES, 1u);
  test = dataset_make(t, TEST_SAMPLES, 2u);
  free(t);

  /* Parameters: small random W (same seed everywhere, so replicas agree), b = 0. */
  w = (float *)xmalloc(sizeof(float) * CLASSES * FEATURES);
  b = (float *)xmalloc(sizeof(float) * CLASSES);
  gw = (float *)xmalloc(sizeof(float) * CLASSES * FEATURES);
  gb = (float *)xmalloc(sizeof(float) * CLASSES);
  {
    uint64_t rng = 7u;
    for (int e = 0; e < CLASSES * FEATURES; ++e) w[e] = (float)(0.01 * rng_normal(&rng));
    for (int k = 0; k < CLASSES; ++k) b[k] = 0.0f;
  }
  params[0] = fp32_tensor(w, CLASSES * FEATURES, 0); /* group 0: weight decay */
  params[1] = fp32_tensor(b, CLASSES, 1);            /* group 1: none */
  grads[0] = fp32_tensor(gw, CLASSES * FEATURES, 0);
  grads[1] = fp32_tensor(gb, CLASSES, 0);

  /* One OpenMP thread per rank: a few thousand parameters gain nothing from
   * more, and ranks may share cores. */
  snprintf(config, sizeof config,
           "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %.17g,"
           " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": %.17g}},"
           " \"param_groups\": [{\"weight_decay\": %.17g}, {\"weight_decay\": 0.0}],"
           " \"threads\": 1}",
           lr_at(0, steps), kWeightDecay, kWeightDecay);
  CHECK(dsopt_create(&opt, config, comm, params, 2));

  if (g_rank == 0) {
    printf("dsopt train_logreg: softmax regression, %d classes x %d features, "
           "%d parameters in 2 tensors\n",
           CLASSES, FEATURES, CLASSES * FEATURES + CLASSES);
#ifdef USE_MPI
    printf("backend: MPI, world size %d\n", g_size);
#else
    printf("backend: local (no MPI), world size %d\n", g_size);
#endif
    printf("dsopt: %s\n", dsopt_build_info());
    printf("data: %d training / %d test samples; %d steps of global batch %d", TRAIN_SAMPLES,
           TEST_SAMPLES, steps, GLOBAL_BATCH);
    if (GLOBAL_BATCH % g_size == 0)
      printf(" (%d per rank)\n", GLOBAL_BATCH / g_size);
    else
      printf(" (%d to %d per rank)\n", GLOBAL_BATCH / g_size, GLOBAL_BATCH / g_size + 1);
    printf("optimizer: AdamW lr %g cosine to %g, betas (0.9, 0.999), weight decay %g on W, 0 on b\n",
           kPeakLr, kPeakLr * kFinalLrFraction, kWeightDecay);
    fflush(stdout);
  }

  order = (int *)xmalloc(sizeof(int) * TRAIN_SAMPLES);
  batch_index = (int *)xmalloc(sizeof(int) * GLOBAL_BATCH);
  first = evaluate(w, b, &train);
  last = first;
  if (g_rank == 0) printf("step %5d  loss %.4f  accuracy %.3f\n", 0, first.loss, first.accuracy);

  t0 = wall_seconds();
  for (int step = 0; step < steps; ++step) {
    /* This rank's contiguous slice of global batch `step`. */
    const int batches_per_epoch = TRAIN_SAMPLES / GLOBAL_BATCH;
    const int epoch = step / batches_per_epoch, in_epoch = step % batches_per_epoch;
    const int lo = (int)((int64_t)GLOBAL_BATCH * g_rank / g_size);
    const int hi = (int)((int64_t)GLOBAL_BATCH * (g_rank + 1) / g_size);
    if (in_epoch == 0) shuffle(order, TRAIN_SAMPLES, 1000u + (uint64_t)epoch);
    for (int s = lo; s < hi; ++s) batch_index[s - lo] = order[in_epoch * GLOBAL_BATCH + s];

    local_gradient(w, b, &train, batch_index, hi - lo, gw, gb);
    CHECK(dsopt_set_lr(opt, lr_at(step, steps)));
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(dsopt_step(opt, grads, 2, &info));
    if (info.skipped || info.step != step + 1) {
      fprintf(stderr, "rank %d: step %d: unexpected step info (skipped %d, step %lld)\n", g_rank,
              step + 1, (int)info.skipped, (long long)info.step);
      world_abort(1);
    }
    bytes_sent_per_step = info.bytes_sent;

    if ((step + 1) % print_every == 0 || step + 1 == steps) {
      last = evaluate(w, b, &train);
      if (g_rank == 0) {
        printf("step %5d  loss %.4f  accuracy %.3f  lr %.5f\n", step + 1, last.loss,
               last.accuracy, lr_at(step, steps));
        fflush(stdout);
      }
    }
  }
  elapsed = wall_seconds() - t0;
  test_result = evaluate(w, b, &test);

  replica_hash = fnv1a(0xCBF29CE484222325ull, w, sizeof(float) * CLASSES * FEATURES);
  replica_hash = fnv1a(replica_hash, b, sizeof(float) * CLASSES);
  identical = world_all_equal(replica_hash);
  ok = identical && last.loss < kRequiredLossRatio * first.loss;

  if (g_rank == 0) {
    printf("test: loss %.4f  accuracy %.3f  (the teacher that labelled the data: loss %.4f)\n",
           test_result.loss, test_result.accuracy, test.teacher_loss);
    printf("replicas: parameters bit-identical on all %d ranks: %s\n", g_size,
           identical ? "yes" : "NO");
    printf("final: steps %d ranks %d initial_loss %.4f final_loss %.4f ratio %.3f "
           "bytes_sent_per_step %llu time %.2f s: %s\n",
           steps, g_size, first.loss, last.loss, last.loss / first.loss,
           (unsigned long long)bytes_sent_per_step, elapsed,
           ok ? "OK" : "FAILED (loss must fall below 0.8 x initial and replicas must agree)");
    fflush(stdout);
  }

  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  free(order);
  free(batch_index);
  free(w);
  free(b);
  free(gw);
  free(gb);
  dataset_free(&train);
  dataset_free(&test);
  world_finalize();
  return ok ? 0 : 1;
}

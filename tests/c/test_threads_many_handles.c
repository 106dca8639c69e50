/* Separate handles are independent (dsopt.h): several threads, each with
 * its own local communicators and optimizers of every kind (Adam fp32,
 * AdamW bf16 with dynamic loss scaling and overflow steps, 1-bit Adam, 0/1
 * Adam, AdamW at ZeRO stage 2), step, save and load them at the same time.
 * Every thread's parameters, step infos and state blobs must equal, bit for
 * bit, what the same work gives when it runs alone on one thread, and a
 * run resumed from a mid-run blob must end where the uninterrupted run
 * ended. dsopt_last_error() is per thread: each thread's deliberate bad
 * calls leave their own message, whatever the other threads do meanwhile.
 *
 * `make test-sanitize` also runs this test under ThreadSanitizer with
 * DSOPT_TEST_KERNEL_THREADS=1 (one OpenMP thread per handle; see
 * tests/sanitize/run_sanitizers.sh for why). The normal run uses 2 OpenMP
 * threads per handle, so OpenMP teams of different threads overlap too. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/dtype_ref.h"
#include "support/model.h"

#define NUM_THREADS 4
#define NUM_WORKLOADS 5
#define NUM_TENSORS 3
#define TOTAL_STEPS 12
#define SAVE_AT 5 /* the mid-run blob is taken after this step */

typedef struct workload {
  const char *name;
  const char *config; /* printf format: one %d, the kernel thread count */
  tensor_spec specs[NUM_TENSORS];
  int loss_scaled;     /* gradients are multiplied by the loss scale */
  int overflow_steps;  /* some steps get an Inf/NaN gradient */
} workload;

/* The first tensor is larger than one unit of the kernels' parallel work
 * (64 Ki elements), so 2 OpenMP threads both get some. */
static const workload workloads[NUM_WORKLOADS] = {
    {"Adam fp32",
     "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
     " \"gradient_clipping\": 2.0, \"threads\": %d}",
     {{70001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
      {4099, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}},
     0, 0},
    {"AdamW bf16, loss scaling",
     "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
     " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8, \"loss_scale_window\": 3, \"hysteresis\": 1},"
     " \"threads\": %d}",
     {{70001, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0}, {33, DSOPT_BFLOAT16, DSOPT_FLOAT32, 0},
      {4099, DSOPT_FLOAT32, DSOPT_BFLOAT16, 0}},
     1, 1},
    {"OneBitAdam",
     "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.005, \"freeze_step\": 4}},"
     " \"threads\": %d}",
     {{70001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
      {4099, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}},
     0, 0},
    {"ZeroOneAdam",
     "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.005, \"var_freeze_step\": 4,"
     " \"var_update_scaler\": 1, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, \"threads\": %d}",
     {{70001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {33, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
      {4099, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}},
     0, 0},
    {"AdamW ZeRO-2",
     "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
     " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1000, \"allgather_bucket_size\": 3000},"
     " \"threads\": %d}",
     {{70001, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}, {33, DSOPT_FLOAT16, DSOPT_FLOAT32, 0},
      {4099, DSOPT_BFLOAT16, DSOPT_BFLOAT16, 0}},
     0, 0},
};

static int kernel_threads = 2;

/* What one workload of one job left behind. */
typedef struct outcome {
  int failures;     /* calls that did not return what they should */
  char first_failure[256];
  dsopt_step_info info[TOTAL_STEPS + 1];
  unsigned char *params; /* after the last step */
  uint64_t params_size;
  unsigned char *blob;   /* after the last step */
  uint64_t blob_size;
  int resumed_params_equal; /* the run resumed at SAVE_AT ends with the same parameters */
  int resumed_blob_equal;   /* ... and the same state blob */
} outcome;

/* Everything one thread (or the sequential run of its work) records. */
typedef struct job {
  int index;            /* seeds every workload's data */
  pthread_barrier_t *barrier; /* NULL when run alone */
  outcome out[NUM_WORKLOADS];
  int error_mixups;     /* bad calls whose message was not this thread's own */
  char own_error[256];  /* this thread's last error after every thread made its bad call */
} job;

static void note_failure(outcome *o, const char *what, int status) {
  if (o->failures++ == 0)
    snprintf(o->first_failure, sizeof o->first_failure, "%s returned %d (%s): %s", what, status,
             dsopt_status_string(status), dsopt_last_error());
}

static void config_for(int w, char *buf, size_t size) { snprintf(buf, size, workloads[w].config, kernel_threads); }

static uint64_t seed_for(int job_index, int w) { return 7000u + 100u * (uint64_t)job_index + (uint64_t)w; }

/* Step k's gradients of workload w in job j, produced with the optimizer's
 * current loss scale; the same for the uninterrupted and the resumed run. */
static void gradients_for_step(model *m, const dsopt_optimizer *opt, int j, int w, int k) {
  double scale = 1.0;
  if (workloads[w].loss_scaled) dsopt_get_loss_scale(opt, &scale);
  rng r = rng_for(900 + (uint64_t)w, (uint64_t)j, (uint64_t)k);
  model_random_grads(m, &r, 1.0, scale);
  if (workloads[w].overflow_steps && k % 5 == 3) model_set_grad(m, k % NUM_TENSORS, 7, k % 2 ? INFINITY : NAN);
}

/* A deliberate bad call whose message names this job and step; the message
 * must still be this thread's after others had time to make theirs. */
static void bad_call_keeps_own_message(job *jb, dsopt_optimizer *opt, int k) {
  const double bad_lr = -(1000.0 * (jb->index + 1) + k);
  char expected[64];
  snprintf(expected, sizeof expected, "%.6f", bad_lr); /* std::to_string's format */
  if (dsopt_set_lr(opt, bad_lr) != DSOPT_EINVAL) ++jb->error_mixups;
  sched_yield();
  if (!strstr(dsopt_last_error(), expected)) ++jb->error_mixups;
}

/* Puts the fp32 parameters of a snapshot into the model (the caller owns
 * fp32 parameters; dsopt_state_load restores the 16-bit ones). */
static void restore_fp32_params(model *m, const unsigned char *snapshot) {
  uint64_t at = 0;
  for (int i = 0; i < m->count; ++i) {
    size_t bytes = (size_t)m->spec[i].numel * dtype_bytes(m->spec[i].param_dtype);
    if (m->spec[i].param_dtype == DSOPT_FLOAT32) memcpy(m->params[i].data, snapshot + at, bytes);
    at += bytes;
  }
}

static void run_job(job *jb) {
  const int j = jb->index;
  dsopt_comm *comm[NUM_WORKLOADS] = {NULL};
  dsopt_optimizer *opt[NUM_WORKLOADS] = {NULL};
  model m[NUM_WORKLOADS];
  unsigned char *mid_params[NUM_WORKLOADS] = {NULL}, *mid_blob[NUM_WORKLOADS] = {NULL};
  uint64_t mid_params_size[NUM_WORKLOADS] = {0}, mid_blob_size[NUM_WORKLOADS] = {0};
  char cfg[512];
  int st;

  /* Every workload's handle lives for the whole run; steps interleave. */
  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    outcome *o = &jb->out[w];
    model_init(&m[w], workloads[w].specs, NUM_TENSORS, seed_for(j, w));
    config_for(w, cfg, sizeof cfg);
    if ((st = dsopt_comm_create_local(&comm[w])) != DSOPT_OK) note_failure(o, "dsopt_comm_create_local", st);
    else if ((st = dsopt_create(&opt[w], cfg, comm[w], m[w].params, NUM_TENSORS)) != DSOPT_OK)
      note_failure(o, "dsopt_create", st);
  }
  for (int k = 1; k <= TOTAL_STEPS; ++k) {
    for (int w = 0; w < NUM_WORKLOADS; ++w) {
      outcome *o = &jb->out[w];
      if (!opt[w]) continue;
      gradients_for_step(&m[w], opt[w], j, w, k);
      o->info[k].struct_size = sizeof o->info[k];
      if ((st = dsopt_step(opt[w], m[w].grads, NUM_TENSORS, &o->info[k])) != DSOPT_OK) note_failure(o, "dsopt_step", st);
      if (k == SAVE_AT) {
        mid_params[w] = model_snapshot(&m[w], &mid_params_size[w]);
        mid_blob[w] = state_blob(opt[w], &mid_blob_size[w]);
        if (!mid_blob[w]) note_failure(o, "dsopt_state_save (mid-run)", DSOPT_EINTERNAL);
      }
    }
    if (opt[k % NUM_WORKLOADS]) bad_call_keeps_own_message(jb, opt[k % NUM_WORKLOADS], k);
  }
  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    outcome *o = &jb->out[w];
    o->params = model_snapshot(&m[w], &o->params_size);
    if (opt[w]) o->blob = state_blob(opt[w], &o->blob_size);
    if (!o->blob) note_failure(o, "dsopt_state_save (final)", DSOPT_EINTERNAL);
  }

  /* Resume every workload from its mid-run blob on fresh handles (other
   * initial parameters) while the first handles are still alive. */
  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    outcome *o = &jb->out[w];
    dsopt_comm *c = NULL;
    dsopt_optimizer *r = NULL;
    model fresh;
    model_init(&fresh, workloads[w].specs, NUM_TENSORS, seed_for(j, w) + 50000u);
    config_for(w, cfg, sizeof cfg);
    int ok = mid_blob[w] != NULL;
    if (ok && (st = dsopt_comm_create_local(&c)) != DSOPT_OK) ok = 0, note_failure(o, "dsopt_comm_create_local", st);
    if (ok && (st = dsopt_create(&r, cfg, c, fresh.params, NUM_TENSORS)) != DSOPT_OK)
      ok = 0, note_failure(o, "dsopt_create (resume)", st);
    if (ok) {
      restore_fp32_params(&fresh, mid_params[w]);
      if ((st = dsopt_state_load(r, mid_blob[w], mid_blob_size[w])) != DSOPT_OK)
        ok = 0, note_failure(o, "dsopt_state_load", st);
    }
    for (int k = SAVE_AT + 1; ok && k <= TOTAL_STEPS; ++k) {
      gradients_for_step(&fresh, r, j, w, k);
      if ((st = dsopt_step(r, fresh.grads, NUM_TENSORS, NULL)) != DSOPT_OK) ok = 0, note_failure(o, "dsopt_step (resumed)", st);
    }
    if (ok) {
      uint64_t size = 0;
      unsigned char *blob = state_blob(r, &size);
      o->resumed_params_equal = model_matches_snapshot(&fresh, o->params, o->params_size);
      o->resumed_blob_equal = same_bytes(blob, size, o->blob, o->blob_size);
      free(blob);
    }
    dsopt_destroy(r);
    dsopt_comm_destroy(c);
    model_free(&fresh);
  }

  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    dsopt_destroy(opt[w]);
    dsopt_comm_destroy(comm[w]);
    model_free(&m[w]);
    free(mid_params[w]);
    free(mid_blob[w]);
  }

  /* A bad config naming this job; once every thread has made its own bad
   * call, this thread's message is still its own. */
  char bad[160], key[32];
  snprintf(key, sizeof key, "bogus_key_of_job_%d", j);
  snprintf(bad, sizeof bad, "{\"optimizer\": {\"type\": \"Adam\"}, \"%s\": 1}", key);
  dsopt_comm *c = NULL;
  dsopt_optimizer *never = NULL;
  model tiny;
  model_init(&tiny, workloads[0].specs + 1, 1, 1);
  if (dsopt_comm_create_local(&c) != DSOPT_OK || dsopt_create(&never, bad, c, tiny.params, 1) != DSOPT_EINVAL)
    ++jb->error_mixups;
  if (jb->barrier) pthread_barrier_wait(jb->barrier);
  snprintf(jb->own_error, sizeof jb->own_error, "%s", dsopt_last_error());
  if (jb->barrier) pthread_barrier_wait(jb->barrier);
  dsopt_destroy(never);
  dsopt_comm_destroy(c);
  model_free(&tiny);
}

static void *job_thread(void *arg) {
  run_job((job *)arg);
  return NULL;
}

static void free_job(job *jb) {
  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    free(jb->out[w].params);
    free(jb->out[w].blob);
  }
}

static job alone[NUM_THREADS], together[NUM_THREADS];

/* One job's own checks: every call succeeded, the resumed runs ended where
 * the uninterrupted ones did, the last error was the job's own. */
static void check_job(const job *jb, const char *how) {
  for (int w = 0; w < NUM_WORKLOADS; ++w) {
    const outcome *o = &jb->out[w];
    CHECKF(o->failures == 0, "%s, job %d, %s: %d calls failed, first: %s", how, jb->index, workloads[w].name,
           o->failures, o->first_failure);
    CHECKF(o->resumed_params_equal && o->resumed_blob_equal,
           "%s, job %d, %s: resumed at step %d, the run ends with the uninterrupted run's parameters (%d) and "
           "state blob (%d)",
           how, jb->index, workloads[w].name, SAVE_AT, o->resumed_params_equal, o->resumed_blob_equal);
  }
  CHECKF(jb->error_mixups == 0, "%s, job %d: %d bad calls did not leave this thread's own message", how,
         jb->index, jb->error_mixups);
  char key[32];
  snprintf(key, sizeof key, "bogus_key_of_job_%d", jb->index);
  CHECKF(strstr(jb->own_error, key) != NULL, "%s, job %d: last error \"%s\" names %s", how, jb->index,
         jb->own_error, key);
  for (int other = 0; other < NUM_THREADS; ++other) {
    if (other == jb->index) continue;
    snprintf(key, sizeof key, "bogus_key_of_job_%d", other);
    CHECKF(strstr(jb->own_error, key) == NULL, "%s, job %d: last error \"%s\" is not job %d's", how, jb->index,
           jb->own_error, other);
  }
}

static void jobs_alone_on_one_thread(void) {
  for (int t = 0; t < NUM_THREADS; ++t) {
    alone[t].index = t;
    run_job(&alone[t]);
    check_job(&alone[t], "alone");
  }
  /* The jobs differ: a mix-up between threads below would show. */
  CHECK(!same_bytes(alone[0].out[0].params, alone[0].out[0].params_size, alone[1].out[0].params,
                    alone[1].out[0].params_size));
  int skipped = 0, compressed = 0, phases[5] = {0};
  for (int k = 1; k <= TOTAL_STEPS; ++k) {
    skipped += alone[0].out[1].info[k].skipped;
    compressed += alone[0].out[2].info[k].compressed;
    const int phase = alone[0].out[3].info[k].phase;
    if (phase >= 0 && phase < 5) ++phases[phase];
  }
  CHECKF(skipped >= 2, "the loss-scaled run skips overflow steps (%d)", skipped);
  CHECKF(compressed >= 2, "1-bit Adam reaches its compressed stage (%d steps)", compressed);
  CHECKF(phases[DSOPT_PHASE_FULL] > 0 && phases[DSOPT_PHASE_COMPRESSED] + phases[DSOPT_PHASE_LOCAL] +
                                                 phases[DSOPT_PHASE_SYNC] > 0,
         "0/1 Adam takes full and 1-bit/local steps (full %d, compressed %d, local %d, sync %d)",
         phases[DSOPT_PHASE_FULL], phases[DSOPT_PHASE_COMPRESSED], phases[DSOPT_PHASE_LOCAL], phases[DSOPT_PHASE_SYNC]);
}

static void jobs_on_threads_equal_jobs_alone(void) {
  pthread_t threads[NUM_THREADS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, NUM_THREADS);

  /* This thread's own failure, before and after the others run. */
  CHECK_STATUS(dsopt_set_lr(NULL, 1.0), DSOPT_EINVAL);
  char main_error[256];
  snprintf(main_error, sizeof main_error, "%s", dsopt_last_error());
  CHECK(main_error[0] != '\0');

  for (int t = 0; t < NUM_THREADS; ++t) {
    together[t].index = t;
    together[t].barrier = &barrier;
    if (pthread_create(&threads[t], NULL, job_thread, &together[t]) != 0) {
      /* The threads started so far would wait at the barrier forever. */
      CHECKF(0, "pthread_create %d", t);
      exit(check_finish());
    }
  }
  for (int t = 0; t < NUM_THREADS; ++t) pthread_join(threads[t], NULL);
  pthread_barrier_destroy(&barrier);

  CHECKF(strcmp(dsopt_last_error(), main_error) == 0, "main thread's last error \"%s\" unchanged (\"%s\")",
         dsopt_last_error(), main_error);
  for (int t = 0; t < NUM_THREADS; ++t) {
    check_job(&together[t], "on threads");
    for (int w = 0; w < NUM_WORKLOADS; ++w) {
      const outcome *a = &alone[t].out[w], *b = &together[t].out[w];
      int first_info = 0;
      for (int k = 1; k <= TOTAL_STEPS && !first_info; ++k)
        if (memcmp(&a->info[k], &b->info[k], sizeof a->info[k]) != 0) first_info = k;
      CHECKF(first_info == 0, "job %d, %s: step info of step %d equals the run alone", t, workloads[w].name,
             first_info);
      CHECKF(same_bytes(a->params, a->params_size, b->params, b->params_size),
             "job %d, %s: final parameters bit-identical to the run alone", t, workloads[w].name);
      CHECKF(same_bytes(a->blob, a->blob_size, b->blob, b->blob_size),
             "job %d, %s: final state blob bit-identical to the run alone", t, workloads[w].name);
    }
  }
}

int main(void) {
  const char *env = getenv("DSOPT_TEST_KERNEL_THREADS");
  if (env && atoi(env) > 0) kernel_threads = atoi(env);
  printf("kernel threads per handle: %d, %d threads x %d handles\n", kernel_threads, NUM_THREADS, NUM_WORKLOADS);
  RUN_TEST(jobs_alone_on_one_thread);
  RUN_TEST(jobs_on_threads_equal_jobs_alone);
  for (int t = 0; t < NUM_THREADS; ++t) {
    free_job(&alone[t]);
    free_job(&together[t]);
  }
  return check_finish();
}

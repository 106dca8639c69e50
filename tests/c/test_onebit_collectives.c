/* The number of MPI collectives a 1-bit Adam, 1-bit LAMB or 0/1 Adam step
 * makes does not depend on the number of tensors: all tensors travel
 * together (docs/optimizers/onebit-adam.md "The compressed allreduce"; 1-bit LAMB compresses one
 * fused buffer). The MPI functions dsopt uses are intercepted here
 * through the profiling interface (this program defines MPI_Allreduce etc.,
 * counts, and forwards to PMPI_*), and the counts of steps with 2 and with
 * 50 tensors are compared: a warmup step is one float sum (gradients and
 * status together); a compressed step is one float sum (status and norm),
 * one all-to-all of signs and three all-gathers (worker scales, server
 * signs, server scales). 0/1 Adam: full steps as warmup steps, 1-bit steps
 * and syncs as compressed steps, local steps only the control sum. Every
 * step starts with the handshake, an integer MPI_Allreduce; the first 3
 * steps make one more, which compares hashes of the ranks' gradients
 * (info.grads_replicated), and later steps none. Float sums are
 * dsopt's fixed-order ones: a ring of P-1 MPI_Sendrecv, then one
 * MPI_Allgatherv. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/mpi_world.h"
#include "support/rng.h"

enum { ALLREDUCE, ALLGATHER, ALLGATHERV, ALLTOALLV, ALLTOALL, BCAST, REDUCE_SCATTER, SENDRECV, OTHER, NUM_KINDS };
static const char *const kind_names[NUM_KINDS] = {"allreduce", "allgather", "allgatherv", "alltoallv", "alltoall",
                                                  "bcast", "reduce_scatter_block", "sendrecv", "other"};
static int counting;
static long counts[NUM_KINDS];

static void count(int kind) {
  if (counting) ++counts[kind];
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  count(ALLREDUCE);
  return PMPI_Allreduce(sendbuf, recvbuf, n, t, op, comm);
}
int MPI_Allgather(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, int rn, MPI_Datatype rt,
                  MPI_Comm comm) {
  count(ALLGATHER);
  return PMPI_Allgather(sendbuf, sn, st, recvbuf, rn, rt, comm);
}
int MPI_Alltoallv(const void *sendbuf, const int sc[], const int sd[], MPI_Datatype st, void *recvbuf,
                  const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm) {
  count(ALLTOALLV);
  return PMPI_Alltoallv(sendbuf, sc, sd, st, recvbuf, rc, rd, rt, comm);
}
int MPI_Alltoall(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, int rn, MPI_Datatype rt,
                 MPI_Comm comm) {
  count(ALLTOALL);
  return PMPI_Alltoall(sendbuf, sn, st, recvbuf, rn, rt, comm);
}
int MPI_Ialltoall(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, int rn, MPI_Datatype rt,
                  MPI_Comm comm, MPI_Request *req) {
  count(ALLTOALL);
  return PMPI_Ialltoall(sendbuf, sn, st, recvbuf, rn, rt, comm, req);
}
int MPI_Iallgather(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, int rn, MPI_Datatype rt,
                   MPI_Comm comm, MPI_Request *req) {
  count(ALLGATHER);
  return PMPI_Iallgather(sendbuf, sn, st, recvbuf, rn, rt, comm, req);
}
int MPI_Bcast(void *buf, int n, MPI_Datatype t, int root, MPI_Comm comm) {
  count(BCAST);
  return PMPI_Bcast(buf, n, t, root, comm);
}
int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int n, MPI_Datatype t, MPI_Op op,
                             MPI_Comm comm) {
  count(REDUCE_SCATTER);
  return PMPI_Reduce_scatter_block(sendbuf, recvbuf, n, t, op, comm);
}
int MPI_Allgatherv(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, const int *rc, const int *rd,
                   MPI_Datatype rt, MPI_Comm comm) {
  count(ALLGATHERV);
  return PMPI_Allgatherv(sendbuf, sn, st, recvbuf, rc, rd, rt, comm);
}
int MPI_Sendrecv(const void *sendbuf, int sn, MPI_Datatype st, int dest, int stag, void *recvbuf, int rn,
                 MPI_Datatype rt, int source, int rtag, MPI_Comm comm, MPI_Status *status) {
  count(SENDRECV);
  return PMPI_Sendrecv(sendbuf, sn, st, dest, stag, recvbuf, rn, rt, source, rtag, comm, status);
}
/* Point-to-point and other collectives dsopt is not expected to use. */
int MPI_Send(const void *buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  count(OTHER);
  return PMPI_Send(buf, n, t, dest, tag, comm);
}
int MPI_Isend(const void *buf, int n, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request *req) {
  count(OTHER);
  return PMPI_Isend(buf, n, t, dest, tag, comm, req);
}
int MPI_Gather(const void *sendbuf, int sn, MPI_Datatype st, void *recvbuf, int rn, MPI_Datatype rt, int root,
               MPI_Comm comm) {
  count(OTHER);
  return PMPI_Gather(sendbuf, sn, st, recvbuf, rn, rt, root, comm);
}
int MPI_Reduce(const void *sendbuf, void *recvbuf, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm) {
  count(OTHER);
  return PMPI_Reduce(sendbuf, recvbuf, n, t, op, root, comm);
}
int MPI_Barrier(MPI_Comm comm) {
  count(OTHER);
  return PMPI_Barrier(comm);
}

#define MAX_TENSORS 50
#define FREEZE_STEP 3
#define STEPS 6
#define MAX_STEPS 16

typedef struct per_step {
  long counts[MAX_STEPS][NUM_KINDS];
  int compressed[MAX_STEPS];
  int phase[MAX_STEPS];
  unsigned long long bytes[MAX_STEPS];
} per_step;

/* Runs `steps` steps over `count` tensors and records the MPI calls of each
 * step (dsopt_step only); the parameters must agree on every rank after the
 * last one. */
static void run_steps(const char *config, int count, int steps, per_step *out) {
  const int rank = world_rank();
  dsopt_comm *comm = world_comm();
  dsopt_tensor params[MAX_TENSORS], grads[MAX_TENSORS];
  float *data[MAX_TENSORS], *gdata[MAX_TENSORS];
  for (int i = 0; i < count; ++i) {
    const int64_t n = 37 + 11 * i;
    data[i] = (float *)malloc((size_t)n * sizeof(float));
    gdata[i] = (float *)malloc((size_t)n * sizeof(float));
    rng r = rng_seeded(500 + (uint64_t)i);
    for (int64_t j = 0; j < n; ++j) data[i][j] = (float)rng_signed(&r, 1.0);
    params[i].data = data[i];
    params[i].numel = n;
    params[i].dtype = DSOPT_FLOAT32;
    params[i].group = i % 2;
    grads[i] = params[i];
    grads[i].data = gdata[i];
    grads[i].group = 0;
  }
  memset(out, 0, sizeof *out);
  dsopt_optimizer *opt = NULL;
  int ok = CHECK_OK(dsopt_create(&opt, config, comm, params, count));
  if (all_ranks(ok)) {
    for (int k = 0; k < steps; ++k) {
      for (int i = 0; i < count; ++i) {
        rng r = rng_for(600 + (uint64_t)i, (uint64_t)rank, (uint64_t)k);
        for (int64_t j = 0; j < grads[i].numel; ++j) gdata[i][j] = (float)rng_signed(&r, 1.0);
      }
      dsopt_step_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = sizeof info;
      memset(counts, 0, sizeof counts);
      counting = 1;
      CHECK_OK(dsopt_step(opt, grads, count, &info));
      counting = 0;
      memcpy(out->counts[k], counts, sizeof counts);
      out->compressed[k] = info.compressed;
      out->phase[k] = info.phase;
      out->bytes[k] = (unsigned long long)info.bytes_sent;
    }
    /* the parameters agree on every rank */
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += (size_t)params[i].numel * sizeof(float);
    unsigned char *all = (unsigned char *)malloc(total);
    size_t pos = 0;
    for (int i = 0; i < count; ++i) {
      memcpy(all + pos, data[i], (size_t)params[i].numel * sizeof(float));
      pos += (size_t)params[i].numel * sizeof(float);
    }
    CHECKF(same_on_every_rank(all, total), "%d tensors: parameters identical on every rank", count);
    free(all);
    dsopt_destroy(opt);
  }
  for (int i = 0; i < count; ++i) {
    free(data[i]);
    free(gdata[i]);
  }
  dsopt_comm_destroy(comm);
}

static void run(const char *config, int count, per_step *out) { run_steps(config, count, STEPS, out); }

/* `n` of dsopt's fixed-order float sums over ranks. */
static void add_float_sums(long *expected, long n) {
  expected[SENDRECV] += n * (world_size() - 1);
  expected[ALLGATHERV] += n;
}

static void print_counts(const char *what, int k, const long *c) {
  printf("%s%s step %d:", check_prefix, what, k + 1);
  for (int j = 0; j < NUM_KINDS; ++j)
    if (c[j]) printf(" %s=%ld", kind_names[j], c[j]);
  printf("\n");
}

/* `compressed_allreduces`: allreduces of a compressed step (1: the control
 * allreduce, or the non_freeze groups' gradient allreduce that carries the
 * status instead). */
static void compare(const char *config, const char *what, long compressed_allreduces) {
  per_step few, many;
  run(config, 2, &few);
  run(config, MAX_TENSORS, &many);
  for (int k = 0; k < STEPS; ++k) {
    const int compressed = k + 1 >= FREEZE_STEP;
    CHECKF(few.compressed[k] == compressed && many.compressed[k] == compressed,
           "%s step %d: info.compressed %d/%d, expected %d", what, k + 1, few.compressed[k], many.compressed[k],
           compressed);
    int same = memcmp(few.counts[k], many.counts[k], sizeof few.counts[k]) == 0;
    if (!CHECKF(same, "%s step %d: MPI calls with 2 tensors == with %d tensors", what, k + 1, MAX_TENSORS)) {
      print_counts("2 tensors", k, few.counts[k]);
      print_counts("50 tensors", k, many.counts[k]);
    }
    /* Every step starts with the 16-byte handshake allreduce (the ranks
     * agree they are in the same dsopt call); the first 3 compare their
     * gradients' hashes in one more. */
    long expected[NUM_KINDS] = {0};
    expected[ALLREDUCE] = k < 3 ? 2 : 1;
    add_float_sums(expected, compressed ? compressed_allreduces : 1);
    if (compressed) {
      expected[ALLTOALLV] = 1;
      expected[ALLGATHER] = 3;
    }
    if (!CHECKF(memcmp(many.counts[k], expected, sizeof expected) == 0,
                "%s step %d: %s", what, k + 1,
                compressed ? "allreduces as expected, 1 alltoallv, 3 allgathers"
                           : "handshake (+ hashes on steps 1-3) + 1 allreduce")) {
      print_counts("50 tensors", k, many.counts[k]);
    }
    CHECKF(!compressed || compressed_allreduces > 1 || strstr(config, "non_freeze") ||
               many.bytes[k] * 20 < many.bytes[FREEZE_STEP - 2],
           "%s step %d: compressed bytes %llu vs warmup %llu", what, k + 1, many.bytes[k],
           many.bytes[FREEZE_STEP - 2]);
  }
}

#define ONEBIT(group1, extra)                                                                    \
  "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3}}," \
  " \"param_groups\": [{}, {\"lr\": 0.005, \"weight_decay\": 0.01" group1 "}], \"threads\": 1" extra "}"

static void collectives_do_not_grow_with_the_tensor_count(void) {
  compare(ONEBIT("", ""), "plain", 1);
}

static void collectives_do_not_grow_with_clipping(void) {
  /* the norm travels in the control allreduce */
  compare(ONEBIT("", ", \"gradient_clipping\": 1.0"), "clipping", 1);
}

static void collectives_do_not_grow_with_a_non_freeze_group(void) {
  /* the non_freeze group's gradients are averaged (one allreduce with the status) */
  compare(ONEBIT(", \"non_freeze\": true", ", \"divergence_check\": {\"enabled\": false}"), "non_freeze", 1);
  /* the global norm (clipping, or the divergence check, on by default): the
   * local part's norm needs the control allreduce too */
  compare(ONEBIT(", \"non_freeze\": true", ""), "non_freeze + divergence check", 2);
  compare(ONEBIT(", \"non_freeze\": true", ", \"gradient_clipping\": 1.0"), "non_freeze + clipping", 2);
}

#define LAMB(extra)                                                                                     \
  "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 0.01, \"freeze_step\": 3, "          \
  "\"weight_decay\": 0.01}}, \"param_groups\": [{}, {\"lr\": 0.005}], \"threads\": 1" extra "}"

static void lamb_collectives_do_not_grow_with_the_tensor_count(void) {
  /* the per-tensor trust ratios and factors are local reductions */
  compare(LAMB(""), "lamb", 1);
  compare(LAMB(", \"gradient_clipping\": 1.0"), "lamb + clipping", 1);
}

/* 0/1 Adam with var_freeze_step 3, var_update_scaler 1, local_step_scaler 1,
 * local_step_clipper 4: k = 2 full, 3 1-bit, 4 full, then syncs at k = 5, 6,
 * 8, 12 and local steps between (the last update is a sync, after which the
 * replicas agree bit for bit). */
#define ZOADAM_STEPS 11
static void zero_one_adam_collectives_do_not_grow_with_the_tensor_count(void) {
  const char *config =
      "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 0.01, \"var_freeze_step\": 3,"
      " \"var_update_scaler\": 1, \"local_step_scaler\": 1, \"local_step_clipper\": 4}},"
      " \"param_groups\": [{}, {\"lr\": 0.005, \"weight_decay\": 0.01}], \"threads\": 1,"
      " \"gradient_clipping\": 1.0}";
  const int expected_phase[ZOADAM_STEPS] = {DSOPT_PHASE_FULL, DSOPT_PHASE_COMPRESSED, DSOPT_PHASE_FULL,
                                            DSOPT_PHASE_SYNC, DSOPT_PHASE_SYNC, DSOPT_PHASE_LOCAL,
                                            DSOPT_PHASE_SYNC, DSOPT_PHASE_LOCAL, DSOPT_PHASE_LOCAL,
                                            DSOPT_PHASE_LOCAL, DSOPT_PHASE_SYNC};
  per_step few, many;
  run_steps(config, 2, ZOADAM_STEPS, &few);
  run_steps(config, MAX_TENSORS, ZOADAM_STEPS, &many);
  for (int k = 0; k < ZOADAM_STEPS; ++k) {
    const int phase = expected_phase[k];
    const int compressed = phase == DSOPT_PHASE_COMPRESSED || phase == DSOPT_PHASE_SYNC;
    CHECKF(few.phase[k] == phase && many.phase[k] == phase, "0/1 Adam step %d: phase %d/%d, expected %d",
           k + 1, few.phase[k], many.phase[k], phase);
    CHECKF(many.compressed[k] == compressed, "0/1 Adam step %d: info.compressed", k + 1);
    if (!CHECKF(memcmp(few.counts[k], many.counts[k], sizeof few.counts[k]) == 0,
                "0/1 Adam step %d: MPI calls with 2 tensors == with %d tensors", k + 1, MAX_TENSORS)) {
      print_counts("2 tensors", k, few.counts[k]);
      print_counts("50 tensors", k, many.counts[k]);
    }
    long expected[NUM_KINDS] = {0};
    /* the handshake (and the gradients' hashes on the first 3 steps), then
     * full: gradients + status; otherwise the control sum */
    expected[ALLREDUCE] = k < 3 ? 2 : 1;
    add_float_sums(expected, 1);
    if (compressed) {
      expected[ALLTOALLV] = 1;
      expected[ALLGATHER] = 3;
    }
    if (!CHECKF(memcmp(many.counts[k], expected, sizeof expected) == 0, "0/1 Adam step %d (phase %d): collectives",
                k + 1, phase))
      print_counts("50 tensors", k, many.counts[k]);
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(collectives_do_not_grow_with_the_tensor_count);
  RUN_TEST(collectives_do_not_grow_with_clipping);
  RUN_TEST(collectives_do_not_grow_with_a_non_freeze_group);
  RUN_TEST(lamb_collectives_do_not_grow_with_the_tensor_count);
  RUN_TEST(zero_one_adam_collectives_do_not_grow_with_the_tensor_count);
  int status = check_finish();
  int any = status != 0, all = 0;
  PMPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return all;
}

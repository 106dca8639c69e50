/* A custom communicator whose callbacks run MPI themselves, on a duplicate
 * of MPI_COMM_WORLD, and that can fail on purpose: rank fail_rank fails its
 * fail_at-th call, and every rank learns of it before that collective, as
 * a runtime that propagates failures does. Header-only, for the MPI test
 * programs (only they link MPI). */
#ifndef DSOPT_TESTS_FAILING_MPI_COMM_H
#define DSOPT_TESTS_FAILING_MPI_COMM_H

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dsopt.h"
#include "mpi_world.h"

typedef struct mpi_ops {
  MPI_Comm comm;
  long calls;
  long fail_at;      /* the call (1, 2, ...) at which fail_rank injects a failure; 0: never */
  int fail_rank;
  char message[128];
  int released;
} mpi_ops;

/* Before each collective the ranks agree whether one of them failed (as a
 * runtime that propagates failures does, e.g. NCCL's abort or gloo's closed
 * connections): the failing rank and its peers all return an error. */
static inline int failed_somewhere(mpi_ops *o) {
  ++o->calls;
  int mine = o->fail_at > 0 && o->calls == o->fail_at && world_rank() == o->fail_rank;
  int any = 0;
  MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, o->comm);
  if (!any) return 0;
  if (mine)
    snprintf(o->message, sizeof o->message, "injected failure at call %ld", o->calls);
  else
    snprintf(o->message, sizeof o->message, "rank %d failed", o->fail_rank);
  return 1;
}

static inline int mpi_status(int rc, mpi_ops *o) {
  if (rc == MPI_SUCCESS) return 0;
  snprintf(o->message, sizeof o->message, "MPI error %d", rc);
  return 2;
}

static inline int op_allreduce(const void *send, void *recv, size_t count, int32_t elem, int32_t op, int32_t device,
                        void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type_of(elem),
                                  op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, o->comm),
                    o);
}
static inline int op_reduce_scatter(const void *send, void *recv, size_t count, int32_t elem, int32_t op,
                             int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Reduce_scatter_block(send, recv, (int)count, mpi_type_of(elem),
                                             op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, o->comm),
                    o);
}
static inline int op_allgather(const void *send, void *recv, size_t count, int32_t elem, int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Allgather(send, (int)count, mpi_type_of(elem), recv, (int)count, mpi_type_of(elem), o->comm), o);
}
static inline int op_alltoall(const void *send, void *recv, size_t count, int32_t elem, int32_t device, void *user) {
  mpi_ops *o = (mpi_ops *)user;
  if (device != DSOPT_COMM_HOST || failed_somewhere(o)) return 7;
  return mpi_status(MPI_Alltoall(send, (int)count, mpi_type_of(elem), recv, (int)count, mpi_type_of(elem), o->comm), o);
}
static inline const char *op_error_message(int code, void *user) {
  (void)code;
  return ((mpi_ops *)user)->message;
}
static inline void op_release(void *user) { ((mpi_ops *)user)->released = 1; }

static inline dsopt_comm_ops table(void) {
  dsopt_comm_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.rank = world_rank();
  ops.size = world_size();
  ops.allreduce = op_allreduce;
  ops.reduce_scatter = op_reduce_scatter;
  ops.allgather = op_allgather;
  ops.alltoall = op_alltoall;
  ops.error_message = op_error_message;
  ops.release = op_release;
  return ops;
}

/* A custom communicator over a duplicate of MPI_COMM_WORLD with the
 * callbacks above (`flags`: 0 or DSOPT_COMM_CONCURRENT). */
static inline dsopt_comm *custom_comm(mpi_ops *o, uint32_t flags) {
  memset(o, 0, sizeof *o);
  MPI_Comm_dup(MPI_COMM_WORLD, &o->comm);
  dsopt_comm_ops ops = table();
  ops.flags = flags;
  dsopt_comm *c = NULL;
  CHECK_OK(dsopt_comm_create_custom(&c, &ops, o));
  return c;
}

#endif

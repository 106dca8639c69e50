/* Helpers of the MPI test programs (header-only: only they link MPI). Every
 * function here is collective over MPI_COMM_WORLD. */
#ifndef DSOPT_TESTS_MPI_WORLD_H
#define DSOPT_TESTS_MPI_WORLD_H

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsopt.h"

static inline int world_rank(void) {
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

static inline int world_size(void) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/* 1 on every rank iff `ok` is nonzero on every rank. */
static inline int all_ranks(int ok) {
  int local = ok != 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

/* 1 on every rank iff every rank's `size` bytes equal rank 0's. */
static inline int same_on_every_rank(const void *bytes, uint64_t size) {
  uint64_t size0 = size;
  MPI_Bcast(&size0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  int same = size0 == size;
  unsigned char *root = (unsigned char *)malloc(size0 ? (size_t)size0 : 1);
  if (world_rank() == 0) memcpy(root, bytes, (size_t)size0);
  MPI_Bcast(root, (int)size0, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
  same = same && memcmp(root, bytes, (size_t)size0) == 0;
  free(root);
  return all_ranks(same);
}

/* The MPI type of a custom communicator's element type (DSOPT_COMM_*). */
static inline MPI_Datatype mpi_type_of(int32_t elem) {
  switch (elem) {
    case DSOPT_COMM_FLOAT32: return MPI_FLOAT;
    case DSOPT_COMM_FLOAT64: return MPI_DOUBLE;
    case DSOPT_COMM_INT32: return MPI_INT32_T;
    case DSOPT_COMM_INT64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
  }
}

/* The world communicator as dsopt sees it. */
static inline dsopt_comm *world_comm(void) {
  dsopt_comm *comm = NULL;
  if (dsopt_comm_create_mpi(&comm, (int64_t)MPI_Comm_c2f(MPI_COMM_WORLD)) != DSOPT_OK) return NULL;
  return comm;
}

#endif /* DSOPT_TESTS_MPI_WORLD_H */

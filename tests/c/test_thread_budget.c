/* The default CPU thread budget of a rank (config without "threads"):
 * the cores of its affinity mask shared among the communicator's ranks on
 * the same machine with the same mask, at least 1; OMP_NUM_THREADS, when
 * set, is the process's own choice (capped by the mask); "threads" in the
 * config overrides both. The expected count is worked out here
 * independently: the ranks' host names and affinity masks gathered with
 * MPI. CTest runs it with 4 unbound ranks, 2 ranks as mpirun binds them,
 * and with OMP_NUM_THREADS set. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "support/mpi_world.h"

#define HOST_BYTES 256

static const char config[] = "{\"optimizer\": {\"type\": \"AdamW\"}}";
static const char config_threads[] = "{\"optimizer\": {\"type\": \"AdamW\"}, \"threads\": 3}";

/* The threads this rank should get by default on a communicator of the
 * `among` ranks of MPI_COMM_WORLD (all of them, or itself alone). */
static int expected_threads(int among_all) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  sched_getaffinity(0, sizeof mask, &mask);
  const int usable = CPU_COUNT(&mask) > 0 ? CPU_COUNT(&mask) : 1;
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && *env) {
    const int wanted = atoi(env);
    return wanted < usable ? (wanted > 0 ? wanted : 1) : usable;
  }
  int peers = 1;
  if (among_all) {
    const int size = world_size();
    char host[HOST_BYTES] = {0};
    gethostname(host, sizeof host - 1);
    char *hosts = calloc((size_t)size, HOST_BYTES);
    cpu_set_t *masks = calloc((size_t)size, sizeof(cpu_set_t));
    MPI_Allgather(host, HOST_BYTES, MPI_CHAR, hosts, HOST_BYTES, MPI_CHAR, MPI_COMM_WORLD);
    MPI_Allgather(&mask, (int)sizeof mask, MPI_BYTE, masks, (int)sizeof mask, MPI_BYTE, MPI_COMM_WORLD);
    peers = 0;
    for (int r = 0; r < size; ++r)
      peers += strcmp(hosts + (size_t)r * HOST_BYTES, host) == 0 && CPU_EQUAL(&masks[r], &mask);
    free(hosts);
    free(masks);
  }
  const int share = usable / peers;
  return share > 0 ? share : 1;
}

static void check_threads(dsopt_comm *comm, const char *json, int expected, const char *what) {
  float w[16];
  for (int i = 0; i < 16; ++i) w[i] = 0.5f + (float)i;
  const dsopt_tensor param = {w, 16, DSOPT_FLOAT32, 0};
  dsopt_optimizer *opt = NULL;
  if (!CHECK_OK(dsopt_create(&opt, json, comm, &param, 1))) return;
  int32_t threads = -1;
  CHECK_OK(dsopt_get_threads(opt, &threads));
  CHECKF(threads == expected, "%s: dsopt_get_threads %d, expected %d", what, (int)threads, expected);
  CHECK_STATUS(dsopt_get_threads(opt, NULL), DSOPT_EINVAL);
  dsopt_destroy(opt);
}

static void default_budget_shares_the_cores_among_the_ranks(void) {
  dsopt_comm *comm = world_comm();
  check_threads(comm, config, expected_threads(1), "world communicator");
  dsopt_comm_destroy(comm);
}

static void a_local_communicator_has_the_cores_to_itself(void) {
  dsopt_comm *comm = NULL;
  CHECK_OK(dsopt_comm_create_local(&comm));
  check_threads(comm, config, expected_threads(0), "local communicator");
  dsopt_comm_destroy(comm);
}

static void threads_in_the_config_overrides_the_budget(void) {
  dsopt_comm *comm = world_comm();
  check_threads(comm, config_threads, 3, "\"threads\": 3");
  dsopt_comm_destroy(comm);
  CHECK_STATUS(dsopt_get_threads(NULL, NULL), DSOPT_EINVAL);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  snprintf(check_prefix, sizeof check_prefix, "rank %d: ", world_rank());
  RUN_TEST(default_budget_shares_the_cores_among_the_ranks);
  RUN_TEST(a_local_communicator_has_the_cores_to_itself);
  RUN_TEST(threads_in_the_config_overrides_the_budget);
  int status = check_finish();
  MPI_Finalize();
  return status;
}

/* MPI on demand: libdsopt is not linked to MPI, and this program is not
 * either. An optimizer on the local communicator loads no MPI library;
 * dsopt_comm_create_mpi loads libdsopt_mpi (and through it libmpi) then.
 * Run as `test_mpi_on_demand present` (the plugin next to libdsopt: MPI not
 * initialised is DSOPT_EINVAL; dsopt_build_info names the MPI library), and
 * with $DSOPT_MPI_PLUGIN naming a missing file (`missing`) or a library
 * that is not the plugin (`foreign`): DSOPT_EUNSUPPORTED saying what to
 * install or that the plugin is not this libdsopt's, and "mpi=unavailable". */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "support/model.h"

static const char *mode = "present";

/* Whether this process has a library whose file name contains `name` mapped. */
static int mapped(const char *name) {
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) return -1;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, maps)) found = strstr(line, name) != NULL;
  fclose(maps);
  return found;
}

static void an_optimizer_without_mpi_loads_no_mpi_library(void) {
  static const tensor_spec specs[] = {{300, DSOPT_FLOAT32, DSOPT_FLOAT32, 0},
                                       {17, DSOPT_FLOAT32, DSOPT_FLOAT32, 0}};
  model m;
  model_init(&m, specs, 2, 11);
  dsopt_comm *local = NULL;
  dsopt_optimizer *opt = NULL;
  CHECK_OK(dsopt_comm_create_local(&local));
  if (CHECK_OK(dsopt_create(&opt, "{\"optimizer\": {\"type\": \"AdamW\"}}", local, m.params, 2))) {
    rng r = rng_for(12, 0, 0);
    model_random_grads(&m, &r, 1.0, 1.0);
    CHECK_OK(dsopt_step(opt, m.grads, 2, NULL));
    dsopt_destroy(opt);
  }
  dsopt_comm_destroy(local);
  model_free(&m);
  if (mapped("libdsopt") != 1) return; /* /proc not readable: nothing to say */
  CHECKF(mapped("libmpi") == 0, "no MPI library is loaded before dsopt_comm_create_mpi");
  CHECKF(mapped("libdsopt_mpi") == 0, "the MPI plugin is not loaded before dsopt_comm_create_mpi");
}

static void the_mpi_communicator_loads_mpi_or_says_what_is_missing(void) {
  dsopt_comm *comm = NULL;
  const int status = dsopt_comm_create_mpi(&comm, 0);
  CHECK(comm == NULL);
  const char *info = dsopt_build_info();
  if (strcmp(mode, "present") == 0) {
    /* MPI_Init was never called: the plugin says so, from MPI itself. */
    CHECK_STATUS(status, DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("MPI is not initialised");
    CHECKF(mapped("libdsopt_mpi") != 0 && mapped("libmpi") != 0, "the plugin and MPI are loaded now");
    CHECKF(strstr(info, "mpi=unavailable") == NULL && strstr(info, "mpi=off") == NULL,
           "build info names the MPI library: %s", info);
  } else {
    CHECK_STATUS(status, DSOPT_EUNSUPPORTED);
    if (strcmp(mode, "missing") == 0) {
      CHECK_ERROR_MENTIONS("apt-get install");
      CHECK_ERROR_MENTIONS("libdsopt_mpi");
      CHECK_ERROR_MENTIONS("DSOPT_MPI_PLUGIN");
    } else {
      CHECK_ERROR_MENTIONS("not a dsopt MPI plugin");
    }
    CHECKF(strstr(info, "mpi=unavailable") != NULL, "build info: %s", info);
    CHECKF(mapped("libmpi") == 0, "no MPI library is loaded");
  }
}

int main(int argc, char **argv) {
  if (argc > 1) mode = argv[1];
  RUN_TEST(an_optimizer_without_mpi_loads_no_mpi_library);
  RUN_TEST(the_mpi_communicator_loads_mpi_or_says_what_is_missing);
  return check_finish();
}

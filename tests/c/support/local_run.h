/* An optimizer on a world of one, with its model and gradient stream. */
#ifndef DSOPT_TESTS_LOCAL_RUN_H
#define DSOPT_TESTS_LOCAL_RUN_H

#include <stdint.h>

#include "dsopt.h"
#include "model.h"
#include "rng.h"

typedef struct local_run {
  dsopt_comm *comm;
  dsopt_optimizer *opt;
  model m;
  rng grad_rng;
  dsopt_step_info info; /* of the last step */
} local_run;

/* Parameters and the gradient stream come from `seed`. Returns the status
 * of dsopt_create (the run must be closed either way). */
int local_run_open(local_run *r, const char *config_json, const tensor_spec *specs, int count, uint64_t seed);
void local_run_close(local_run *r);
/* Steps on the model's current gradients; fills r->info. */
int local_run_step(local_run *r);

#endif /* DSOPT_TESTS_LOCAL_RUN_H */

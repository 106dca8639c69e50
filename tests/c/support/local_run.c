#include "local_run.h"

#include <string.h>

int local_run_open(local_run *r, const char *config_json, const tensor_spec *specs, int count, uint64_t seed) {
  memset(r, 0, sizeof *r);
  model_init(&r->m, specs, count, seed);
  r->grad_rng = rng_seeded(seed + 1);
  int status = dsopt_comm_create_local(&r->comm);
  if (status != DSOPT_OK) return status;
  return dsopt_create(&r->opt, config_json, r->comm, r->m.params, count);
}

void local_run_close(local_run *r) {
  dsopt_destroy(r->opt);
  dsopt_comm_destroy(r->comm);
  model_free(&r->m);
  r->opt = NULL;
  r->comm = NULL;
}

int local_run_step(local_run *r) {
  memset(&r->info, 0, sizeof r->info);
  r->info.struct_size = sizeof r->info;
  return dsopt_step(r->opt, r->m.grads, r->m.count, &r->info);
}

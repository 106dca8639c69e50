/* The divergence rule of docs/reference/c-api.md ("Divergence that stays finite"), one
 * observed gradient norm at a time, in doubles: what dsopt_step_info.diverging
 * must say after each step. */
#ifndef DSOPT_TESTS_DIVERGENCE_REF_H
#define DSOPT_TESTS_DIVERGENCE_REF_H

#include <stdint.h>

typedef struct divergence_ref {
  double factor;
  int64_t min_steps, horizon;
  int count, window;
  int64_t seen[2];    /* per kind (0 averaged, 1 local): finite norms observed or taken over */
  double reference[2]; /* r per kind, in ln(norm) */
  int above[64];      /* the last `window` observed steps, most recent at [0] */
  int diverging;
} divergence_ref;

/* The defaults: factor 20, min_steps 10, horizon 50, count 3, window 8. */
void divergence_ref_init(divergence_ref *d);
/* An applied step's norm; `local`: some gradient stayed the rank's own at
 * `world` > 1 ranks. Returns the step's expected `diverging`. A skipped
 * step is not passed (it leaves the state as it is). */
int divergence_ref_observe(divergence_ref *d, double norm, int local, int world);

#endif /* DSOPT_TESTS_DIVERGENCE_REF_H */

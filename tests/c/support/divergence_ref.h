/* The README's divergence rule ("Divergence that stays finite"), one
 * observed gradient norm at a time, in doubles: what dsopt_step_info.diverging
 * must say after each step. */
#ifndef DSOPT_TESTS_DIVERGENCE_REF_H
#define DSOPT_TESTS_DIVERGENCE_REF_H

#include <stdint.h>

typedef struct divergence_ref {
  double factor;
  int64_t min_steps, horizon;
  int count, window;
  int64_t finite;     /* finite norms observed */
  double reference;   /* r, in ln(norm) */
  int above[64];      /* the last `window` observed steps, most recent at [0] */
  int diverging;
} divergence_ref;

/* The defaults: factor 100, min_steps 10, horizon 50, count 3, window 8. */
void divergence_ref_init(divergence_ref *d);
/* An applied step's norm; returns the step's expected `diverging`. A
 * skipped step is not passed (it leaves the state as it is). */
int divergence_ref_observe(divergence_ref *d, double norm);

#endif /* DSOPT_TESTS_DIVERGENCE_REF_H */

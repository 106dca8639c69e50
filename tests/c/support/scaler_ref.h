/* The loss scaler of docs/optimizers/adam.md ("Loss scaling"), as a reference. */
#ifndef DSOPT_TESTS_SCALER_REF_H
#define DSOPT_TESTS_SCALER_REF_H

#include <stdint.h>

typedef struct scaler_ref {
  int dynamic;
  double scale;
  double min_scale;
  int window, hysteresis, consecutive_hysteresis;
  int64_t iter, last_overflow;
  int hyst;
} scaler_ref;

void scaler_ref_init_dynamic(scaler_ref *s, int initial_scale_power, int window, int hysteresis,
                             int consecutive_hysteresis, double min_scale);
void scaler_ref_init_static(scaler_ref *s, double scale);
/* The update after a step, with that step's overflow flag. */
void scaler_ref_update(scaler_ref *s, int overflow);

#endif /* DSOPT_TESTS_SCALER_REF_H */

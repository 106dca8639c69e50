#include "divergence_ref.h"

#include <math.h>
#include <string.h>

void divergence_ref_init(divergence_ref *d) {
  memset(d, 0, sizeof *d);
  d->factor = 100.0;
  d->min_steps = 10;
  d->horizon = 50;
  d->count = 3;
  d->window = 8;
}

int divergence_ref_observe(divergence_ref *d, double norm) {
  if (!(norm > 0.0)) return d->diverging; /* NaN and zero are not observed */
  const double x = log(norm);
  const double band = log(d->factor);
  const int above = d->finite >= d->min_steps && x - d->reference > band;
  memmove(d->above + 1, d->above, sizeof(int) * (size_t)(d->window - 1));
  d->above[0] = above;
  int n_above = 0;
  for (int i = 0; i < d->window; ++i) n_above += d->above[i];
  if (!d->diverging && n_above >= d->count) d->diverging = 1;
  else if (d->diverging && n_above == 0) d->diverging = 0;
  if (isfinite(x)) {
    if (d->finite == 0) {
      d->reference = x;
    } else {
      double w = 1.0 / (double)(d->finite + 1);
      if (w < 1.0 / (double)d->horizon) w = 1.0 / (double)d->horizon;
      double clamped = x;
      if (clamped > d->reference + band) clamped = d->reference + band;
      if (clamped < d->reference - band) clamped = d->reference - band;
      d->reference += w * (clamped - d->reference);
    }
    ++d->finite;
  }
  return d->diverging;
}

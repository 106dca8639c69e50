#include "divergence_ref.h"

#include <math.h>
#include <string.h>

void divergence_ref_init(divergence_ref *d) {
  memset(d, 0, sizeof *d);
  d->factor = 20.0;
  d->min_steps = 10;
  d->horizon = 50;
  d->count = 3;
  d->window = 8;
}

int divergence_ref_observe(divergence_ref *d, double norm, int local, int world) {
  if (!(norm > 0.0)) return d->diverging; /* NaN and zero are not observed */
  const int k = local ? 1 : 0;
  const double x = log(norm);
  const double band = log(2.0);
  if (d->seen[k] == 0 && d->seen[1 - k] > 0) {
    d->seen[k] = d->seen[1 - k];
    d->reference[k] = d->reference[1 - k] + (local ? 0.5 : -0.5) * log((double)world);
  }
  const int above = d->seen[k] >= d->min_steps && x - d->reference[k] > log(d->factor);
  memmove(d->above + 1, d->above, sizeof(int) * (size_t)(d->window - 1));
  d->above[0] = above;
  int n_above = 0;
  for (int i = 0; i < d->window; ++i) n_above += d->above[i];
  if (!d->diverging && n_above >= d->count) d->diverging = 1;
  else if (d->diverging && n_above == 0) d->diverging = 0;
  if (isfinite(x)) {
    if (d->seen[k] == 0) {
      d->reference[k] = x;
    } else {
      double w = 1.0 / (double)(d->seen[k] + 1);
      if (w < 1.0 / (double)d->horizon) w = 1.0 / (double)d->horizon;
      double clamped = x;
      if (clamped > d->reference[k] + band) clamped = d->reference[k] + band;
      if (clamped < d->reference[k] - band) clamped = d->reference[k] - band;
      d->reference[k] += w * (clamped - d->reference[k]);
    }
    ++d->seen[k];
  }
  return d->diverging;
}

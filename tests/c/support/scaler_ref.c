#include "scaler_ref.h"

#include <math.h>

void scaler_ref_init_dynamic(scaler_ref *s, int initial_scale_power, int window, int hysteresis,
                             int consecutive_hysteresis, double min_scale) {
  s->dynamic = 1;
  s->scale = ldexp(1.0, initial_scale_power);
  s->min_scale = min_scale;
  s->window = window;
  s->hysteresis = hysteresis;
  s->consecutive_hysteresis = consecutive_hysteresis;
  s->iter = 0;
  s->last_overflow = -1;
  s->hyst = hysteresis;
}

void scaler_ref_init_static(scaler_ref *s, double scale) {
  scaler_ref_init_dynamic(s, 0, 1, 1, 0, 1.0);
  s->dynamic = 0;
  s->scale = scale;
}

void scaler_ref_update(scaler_ref *s, int overflow) {
  if (!s->dynamic) return;
  if (overflow) {
    if (s->hysteresis == 1 || s->hyst == 1)
      s->scale = fmax(s->scale / 2, s->min_scale);
    else
      s->hyst -= 1;
    s->last_overflow = s->iter;
  } else {
    if (s->consecutive_hysteresis) s->hyst = s->hysteresis;
    if ((s->iter - s->last_overflow) % s->window == 0) {
      if (!s->consecutive_hysteresis) s->hyst = s->hysteresis;
      s->scale *= 2;
    }
  }
  s->iter += 1;
}

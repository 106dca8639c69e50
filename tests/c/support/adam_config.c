#include "adam_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hyper default_hyper(void) {
  hyper h = {1e-3, 0.9, 0.999, 1e-8, 0.0};
  return h;
}

adam_config adamw_config(hyper base) {
  adam_config c;
  memset(&c, 0, sizeof c);
  c.type = "AdamW";
  c.bias_correction = 1;
  c.base = base;
  return c;
}

hyper config_group(const adam_config *c, int g) { return c->num_groups > 0 ? c->group[g] : c->base; }

int config_num_groups(const adam_config *c) { return c->num_groups > 0 ? c->num_groups : 1; }

static void append(char *buf, size_t size, const char *fmt, ...) {
  size_t used = strlen(buf);
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf + used, size - used, fmt, args);
  va_end(args);
}

/* %.17g: the double reaches dsopt exactly as the reference uses it. */
static void append_hyper(char *buf, size_t size, const hyper *h) {
  append(buf, size, "\"lr\": %.17g, \"betas\": [%.17g, %.17g], \"eps\": %.17g, \"weight_decay\": %.17g",
         h->lr, h->beta1, h->beta2, h->eps, h->weight_decay);
}

const char *adam_config_json(const adam_config *c, char *buf, size_t size) {
  buf[0] = '\0';
  append(buf, size, "{\"optimizer\": {\"type\": \"%s\", \"params\": {", c->type);
  append_hyper(buf, size, &c->base);
  append(buf, size, ", \"bias_correction\": %s", c->bias_correction ? "true" : "false");
  if (c->l2) append(buf, size, ", \"adam_w_mode\": false");
  append(buf, size, "}}");
  if (c->num_groups > 0) {
    append(buf, size, ", \"param_groups\": [");
    for (int g = 0; g < c->num_groups; ++g) {
      append(buf, size, "%s{", g ? ", " : "");
      append_hyper(buf, size, &c->group[g]);
      append(buf, size, "}");
    }
    append(buf, size, "]");
  }
  if (c->extra) append(buf, size, ", %s", c->extra);
  append(buf, size, "}");
  return buf;
}

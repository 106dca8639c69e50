// dsopt_get_config, dsopt_config_canonical: the canonical configuration as
// JSON text.
#include "api/config_json.hpp"
#include "api/guard.hpp"
#include "api/handles.hpp"

using namespace dsopt;

extern "C" {

DSOPT_API int dsopt_get_config(const dsopt_optimizer* opt, char* dst, uint64_t capacity,
                               uint64_t* out_size) {
  return guarded([&] {
    require_nonnull(opt, "opt");
    copy_text(current_config(*opt->impl, opt->config_text), dst, capacity, out_size);
  });
}

DSOPT_API int dsopt_config_canonical(const char* config_json, char* dst, uint64_t capacity,
                                     uint64_t* out_size) {
  return guarded([&] { copy_text(canonical_config(config_json), dst, capacity, out_size); });
}
}

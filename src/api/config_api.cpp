// dsopt_get_config, dsopt_config_canonical: the canonical configuration as
// JSON text; dsopt_group_param_names: an algorithm's group hyperparameters.
#include "algorithms/registry.hpp"
#include "api/config_json.hpp"
#include "api/guard.hpp"
#include "api/handles.hpp"
#include "base/error.hpp"

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

DSOPT_API int dsopt_group_param_names(const char* optimizer_type, const char** out_names,
                                      const char** out_keys) {
  return guarded([&] {
    require_nonnull(optimizer_type, "optimizer_type");
    if (!out_names && !out_keys) fail(DSOPT_EINVAL, "out_names and out_keys are both NULL");
    const Algorithm* a = find_algorithm(optimizer_type);
    if (!a) fail(DSOPT_EINVAL, std::string("unknown optimizer type '") + optimizer_type + "'");
    const HyperNames& n = hyper_name_lists(a->hyper);
    if (out_names) *out_names = n.names.c_str();
    if (out_keys) *out_keys = n.keys.c_str();
  });
}
}

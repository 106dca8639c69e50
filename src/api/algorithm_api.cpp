// dsopt_algorithm_names, dsopt_algorithm_describe: what the registry
// (src/algorithms) knows of each algorithm, for the bindings and the
// planner, which build their behaviour from it instead of lists of names.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/registry.hpp"
#include "api/guard.hpp"
#include "api/versioned_struct.hpp"
#include "base/error.hpp"

using namespace dsopt;

namespace {

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

int32_t range_code(HyperRange r) {
  switch (r) {
    case HyperRange::Beta: return DSOPT_HYPER_BETA;
    case HyperRange::NonNegative: return DSOPT_HYPER_NONNEGATIVE;
    case HyperRange::Flag: return DSOPT_HYPER_FLAG;
  }
  return DSOPT_HYPER_NONNEGATIVE;
}

// The strings and arrays a dsopt_algorithm_info points into, kept for the
// program's life.
struct Description {
  std::string aliases, moment_names, keys, group_keys;
  std::vector<double> defaults;
  std::vector<int32_t> ranges;
  dsopt_algorithm_info info{};

  Description(const Description&) = delete;  // info points into the members
  Description& operator=(const Description&) = delete;

  explicit Description(const Algorithm& a) {
    aliases = joined(a.aliases);
    moment_names = joined(a.moments.views);
    keys = joined(a.keys);
    group_keys = joined(a.group_keys);
    for (const HyperParam& p : a.hyper) {
      defaults.push_back(p.dflt);
      ranges.push_back(range_code(p.range));
    }
    const HyperNames& names = hyper_name_lists(a.hyper);
    info.struct_size = uint32_t(sizeof info);
    info.flags = (a.param_steps() ? DSOPT_ALGORITHM_PARAM_STEPS : 0u) |
                 (a.sharded ? DSOPT_ALGORITHM_ZERO : 0u) | (a.offload ? DSOPT_ALGORITHM_OFFLOAD : 0u) |
                 (a.compresses ? DSOPT_ALGORITHM_COMPRESSED : 0u);
    info.type = a.type.c_str();
    info.aliases = aliases.c_str();
    info.moments = a.moments.count();
    info.num_hyper = int32_t(a.hyper.size());
    info.moment_names = moment_names.c_str();
    info.hyper_names = names.names.c_str();
    info.hyper_keys = names.keys.c_str();
    info.hyper_defaults = defaults.data();
    info.hyper_ranges = ranges.data();
    info.keys = keys.c_str();
    info.group_keys = group_keys.c_str();
  }
};

// Built in place once (info points into the strings: never moved).
const Description& description(const Algorithm& a) {
  static const std::map<const Algorithm*, std::unique_ptr<const Description>> all = [] {
    std::map<const Algorithm*, std::unique_ptr<const Description>> m;
    for (const Algorithm* x : algorithms()) m.emplace(x, std::make_unique<const Description>(*x));
    return m;
  }();
  return *all.at(&a);
}

// The smallest layout of dsopt_algorithm_info: all of its first version.
constexpr size_t kInfoMinSize = sizeof(dsopt_algorithm_info);

}  // namespace

extern "C" {

DSOPT_API int dsopt_algorithm_names(const char** out_names) {
  return guarded([&] {
    require_nonnull(out_names, "out_names");
    static const std::string names = [] {
      std::vector<std::string> types;
      for (const Algorithm* a : algorithms()) types.push_back(a->type);
      return joined(types);
    }();
    *out_names = names.c_str();
  });
}

DSOPT_API int dsopt_algorithm_describe(const char* optimizer_type, dsopt_algorithm_info* out) {
  return guarded([&] {
    require_nonnull(optimizer_type, "optimizer_type");
    require_nonnull(out, "out");
    check_versioned(*out, kInfoMinSize, "dsopt_algorithm_info");
    const Algorithm* a = find_algorithm(optimizer_type);
    if (!a) fail(DSOPT_EINVAL, std::string("unknown optimizer type '") + optimizer_type + "'");
    write_versioned(*out, description(*a).info, kInfoMinSize, "dsopt_algorithm_info");
  });
}
}

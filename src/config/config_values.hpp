// Reading and checking the values of a JSON config: every error names
// the offending key by its path ("optimizer.params.lr"). Shared by the
// config reader (src/api/config.cpp) and the algorithms' own keys.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "math/adam.hpp"
#include "optim/algorithm.hpp"
#include "optim/hyper_params.hpp"

namespace dsopt::config {

using json = nlohmann::json;

// Throws Error(DSOPT_EINVAL) "config: <path>: <what>".
[[noreturn]] void bad(const std::string& path, const std::string& what);
// The keys, comma-separated.
std::string join(const std::set<std::string>& keys);
// Rejects keys outside `known`; `ignored` keys are accepted and skipped.
void check_keys(const json& obj, const std::string& path, const std::set<std::string>& known,
                const std::set<std::string>& ignored = {});
// path.key (key alone at the top level).
std::string sub(const std::string& path, const std::string& key);
// obj[key] as a finite number, dflt when absent.
double number(const json& obj, const std::string& path, const std::string& key, double dflt);
// An integer in [lo, hi], checked before any narrowing.
int64_t integer(const json& obj, const std::string& path, const std::string& key, int64_t dflt,
                int64_t lo, int64_t hi);
bool boolean(const json& obj, const std::string& path, const std::string& key, bool dflt);
void require(bool ok, const std::string& path, const std::string& what);
// The update runs in fp32: a value must survive the conversion.
void require_fp32(double v, const std::string& path, bool nonzero);
// The hyperparameters `params` of `obj` (optimizer.params or a group) over
// `h`, each checked as its descriptor says; an absent key leaves its value.
void read_hyper(const json& obj, const std::string& path, const std::vector<HyperParam>& params,
                AdamHyper& h);
// The rule the algorithm's hyperparameters of one group obey together
// (Algorithm::check_group), checked at `path`.
void check_group(const Algorithm& a, const AdamHyper& h, const std::string& path);
// The hyperparameters `params` of `h` by config key: a number, or the list
// of the values of a key several hyperparameters share.
json write_hyper(const std::vector<HyperParam>& params, const AdamHyper& h);

}  // namespace dsopt::config

#include "optim/hyper_params.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "base/error.hpp"

namespace dsopt {
namespace {

template <double AdamHyper::*F>
double& field(AdamHyper& h) {
  return h.*F;
}

}  // namespace

std::vector<HyperParam> adam_hyper_params() {
  const AdamHyper d;
  return {
      {"lr", "lr", d.lr, HyperRange::NonNegative, false, field<&AdamHyper::lr>},
      {"beta1", "betas", d.beta1, HyperRange::Beta, false, field<&AdamHyper::beta1>},
      {"beta2", "betas", d.beta2, HyperRange::Beta, false, field<&AdamHyper::beta2>},
      {"eps", "eps", d.eps, HyperRange::NonNegative, true, field<&AdamHyper::eps>},
      {"weight_decay", "weight_decay", d.weight_decay, HyperRange::NonNegative, false,
       field<&AdamHyper::weight_decay>},
  };
}

std::vector<HyperParam> adam_hyper_params(const std::vector<std::string>& names) {
  std::vector<HyperParam> out;
  for (const HyperParam& p : adam_hyper_params())
    for (const std::string& n : names)
      if (n == p.name) out.push_back(p);
  if (out.size() != names.size()) fail(DSOPT_EINTERNAL, "adam_hyper_params: a name is not Adam's");
  return out;
}

const HyperParam* find_hyper(const std::vector<HyperParam>& params, const std::string& name) {
  for (const HyperParam& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

std::vector<std::string> hyper_keys(const std::vector<HyperParam>& params) {
  std::vector<std::string> keys;
  for (const HyperParam& p : params)
    if (std::find(keys.begin(), keys.end(), p.key) == keys.end()) keys.push_back(p.key);
  return keys;
}

std::string hyper_names(const std::vector<HyperParam>& params) {
  std::string s;
  for (const HyperParam& p : params) s += (s.empty() ? "\"" : ", \"") + p.name + "\"";
  return s;
}

const HyperNames& hyper_name_lists(const std::vector<HyperParam>& params) {
  static std::mutex mutex;
  static std::map<const std::vector<HyperParam>*, std::unique_ptr<HyperNames>> lists;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<HyperNames>& n = lists[&params];
  if (!n) {
    n = std::make_unique<HyperNames>();
    for (const HyperParam& p : params) {
      n->names += (n->names.empty() ? "" : " ") + p.name;
      n->keys += (n->keys.empty() ? "" : " ") + p.key;
    }
  }
  return *n;
}

void set_hyper_defaults(const std::vector<HyperParam>& params, AdamHyper& h) {
  for (const HyperParam& p : params) p.set(h, p.dflt);
}

std::string show_number(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string hyper_value_error(const HyperParam& p, double v) {
  if (p.range == HyperRange::Beta) {
    if (!(v >= 0.0 && v < 1.0)) return "must be in [0, 1), got " + show_number(v);
    // A beta that rounds to 1 in fp32 would stop the moment it belongs to
    // and divide by zero in the bias correction.
    if (!(float(v) < 1.0f))
      return "is " + show_number(v) + ", which is 1 in fp32 (the update's precision); use at most "
             "0.99999994";
    return "";
  }
  if (p.range == HyperRange::Flag)
    return v == 0.0 || v == 1.0 ? "" : "must be 0 or 1 (false or true), got " + show_number(v);
  if (!(std::isfinite(v) && v >= 0.0)) return "must be a finite number >= 0, got " + show_number(v);
  return "";
}

}  // namespace dsopt

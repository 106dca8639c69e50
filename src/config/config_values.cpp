#include "config/config_values.hpp"

#include <cfloat>
#include <cmath>

#include "base/error.hpp"

namespace dsopt::config {

void bad(const std::string& path, const std::string& what) {
  fail(DSOPT_EINVAL, "config: " + path + ": " + what);
}

std::string join(const std::set<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

void check_keys(const json& obj, const std::string& path, const std::set<std::string>& known,
                const std::set<std::string>& ignored) {
  if (!obj.is_object()) bad(path.empty() ? "(top level)" : path, "must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key()) || ignored.count(it.key())) continue;
    bad((path.empty() ? "" : path + ".") + it.key(), "unknown key (known here: " + join(known) + ")");
  }
}

std::string sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

double number(const json& obj, const std::string& path, const std::string& key, double dflt) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  if (!v.is_number()) bad(sub(path, key), "must be a number, got " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(sub(path, key), "must be finite");
  return d;
}

int64_t integer(const json& obj, const std::string& path, const std::string& key, int64_t dflt,
                int64_t lo, int64_t hi) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  const bool integral = v.is_number_integer() ||
                        (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (!integral) bad(sub(path, key), "must be an integer, got " + v.dump());
  const double d = v.get<double>();
  if (d < double(lo) || d > double(hi) ||
      (v.is_number_integer() && (v.get<int64_t>() < lo || v.get<int64_t>() > hi)))
    bad(sub(path, key), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
}

bool boolean(const json& obj, const std::string& path, const std::string& key, bool dflt) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  if (!v.is_boolean()) bad(sub(path, key), "must be true or false, got " + v.dump());
  return v.get<bool>();
}

void require(bool ok, const std::string& path, const std::string& what) {
  if (!ok) bad(path, what);
}

void require_fp32(double v, const std::string& path, bool nonzero) {
  const float f = float(v);
  if (!std::isfinite(f)) bad(path, "is too large for fp32 (" + std::to_string(v) + ")");
  if (nonzero && v != 0.0 && !(std::fabs(f) >= FLT_MIN))
    bad(path, "is too small for fp32 (" + std::to_string(v) + ")");
}

namespace {

// One value of hyperparameter `p` read from the config, checked.
void check_hyper(const HyperParam& p, double v, const std::string& path, const std::string& shown,
                 bool in_list) {
  if (p.range == HyperRange::Beta) {
    require(v >= 0 && v < 1 && float(v) < 1.0f, path,
            std::string(in_list ? "each beta must" : "must") +
                " be in [0, 1) and below 1 in fp32 (at most 0.99999994), got " + shown);
    return;
  }
  if (p.positive_in_config) require(v > 0, path, "must be > 0, got " + shown);
  else require(v >= 0, path, "must be >= 0, got " + shown);
  require_fp32(v, path, p.positive_in_config);
}

}  // namespace

void read_hyper(const json& obj, const std::string& path, const std::vector<HyperParam>& params,
                AdamHyper& h) {
  for (const std::string& key : hyper_keys(params)) {
    std::vector<const HyperParam*> of_key;
    for (const HyperParam& p : params)
      if (p.key == key) of_key.push_back(&p);
    if (!obj.contains(key)) continue;
    const json& v = obj.at(key);
    if (of_key.size() == 1 && of_key[0]->range == HyperRange::Flag) {
      of_key[0]->set(h, boolean(obj, path, key, false) ? 1.0 : 0.0);
      continue;
    }
    if (of_key.size() == 1) {
      const double d = number(obj, path, key, 0.0);
      check_hyper(*of_key[0], d, sub(path, key), std::to_string(d), false);
      of_key[0]->set(h, d);
      continue;
    }
    bool numbers = v.is_array() && v.size() == of_key.size();
    for (size_t i = 0; numbers && i < v.size(); ++i) numbers = v[i].is_number();
    if (!numbers)
      bad(sub(path, key), "must be a list of " +
                              (of_key.size() == 2 ? std::string("two") : std::to_string(of_key.size())) +
                              " numbers, got " + v.dump());
    for (size_t i = 0; i < of_key.size(); ++i) {
      check_hyper(*of_key[i], v[i].get<double>(), sub(path, key), v.dump(), true);
      of_key[i]->set(h, v[i].get<double>());
    }
  }
}

void check_group(const Algorithm& a, const AdamHyper& h, const std::string& path) {
  if (!a.check_group) return;
  const std::string why = a.check_group(h);
  if (!why.empty()) bad(path, why);
}

json write_hyper(const std::vector<HyperParam>& params, const AdamHyper& h) {
  json out = json::object();
  for (const std::string& key : hyper_keys(params)) {
    json values = json::array();
    for (const HyperParam& p : params)
      if (p.key == key) {
        if (p.range == HyperRange::Flag) values.push_back(p.get(h) != 0.0);
        else values.push_back(p.get(h));
      }
    out[key] = values.size() == 1 ? values[0] : values;
  }
  return out;
}

}  // namespace dsopt::config

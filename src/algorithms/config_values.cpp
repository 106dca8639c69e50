#include "algorithms/config_values.hpp"

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

void read_hyper(const json& obj, const std::string& path, AdamHyper& h) {
  h.lr = number(obj, path, "lr", h.lr);
  require(h.lr >= 0, sub(path, "lr"), "must be >= 0, got " + std::to_string(h.lr));
  require_fp32(h.lr, sub(path, "lr"), false);
  if (obj.contains("betas")) {
    const json& b = obj.at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
      bad(sub(path, "betas"), "must be a list of two numbers, got " + b.dump());
    h.beta1 = b[0].get<double>();
    h.beta2 = b[1].get<double>();
    for (double beta : {h.beta1, h.beta2})
      require(beta >= 0 && beta < 1 && float(beta) < 1.0f, sub(path, "betas"),
              "each beta must be in [0, 1) and below 1 in fp32 (at most 0.99999994), got " +
                  b.dump());
  }
  h.eps = number(obj, path, "eps", h.eps);
  require(h.eps > 0, sub(path, "eps"), "must be > 0, got " + std::to_string(h.eps));
  require_fp32(h.eps, sub(path, "eps"), true);
  h.weight_decay = number(obj, path, "weight_decay", h.weight_decay);
  require(h.weight_decay >= 0, sub(path, "weight_decay"), "must be >= 0");
  require_fp32(h.weight_decay, sub(path, "weight_decay"), false);
}

}  // namespace dsopt::config

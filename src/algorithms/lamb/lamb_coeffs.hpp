// The trust-ratio keys LAMB and 1-bit LAMB share (max_coeff, min_coeff) and
// 1-bit LAMB's EMA and factor clamps, read and written in lamb.cpp, and
// where a config keeps them.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "math/onebit_lamb.hpp"
#include "optim/config.hpp"

namespace dsopt {

// The settings of an algorithm with a trust ratio (LAMB, 1-bit LAMB).
struct LambSettings : virtual AlgorithmSettings {
  LambCoeffConfig coeffs;
};
// The trust-ratio settings of a config of LAMB or 1-bit LAMB.
inline const LambCoeffConfig& lamb_coeffs(const OptimizerConfig& cfg) {
  return cfg.settings_as<LambSettings>().coeffs;
}

// Every key present over `k` (the keys were checked against the algorithm's).
void read_lamb_coeffs(const nlohmann::json& params, const std::string& path, LambCoeffConfig& k);
// max_coeff and min_coeff, and with `onebit` coeff_beta and the factor's keys.
void write_lamb_coeffs(const LambCoeffConfig& k, bool onebit, nlohmann::json& params);

}  // namespace dsopt

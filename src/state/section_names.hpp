// Blob section names read in more than one place: the common sections of
// every optimizer's blob, which precede its algorithm's own state, and the
// moments of an algorithm's state (stage 0 and ZeRO alike).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dsopt {

constexpr const char* kStepsSection = "common.steps";
constexpr const char* kLrSection = "common.lr";
constexpr const char* kScalerSection = "common.loss_scaler";
constexpr const char* kRunSection = "common.run";
// Optional on load: blobs of an earlier layout lack them.
constexpr const char* kParamStepsSection = "common.param_steps";  // int64 per parameter
constexpr const char* kHyperSection = "common.hyper";  // per group: the algorithm's hyperparameters but lr (optim/hyper_section.hpp)
// Optional on load too: the divergence check's state
// (optim/divergence_check.hpp).
constexpr const char* kDivergenceSection = "common.divergence";
// The masters of 16-bit parameters (none under ZeRO, which keeps its
// shard's in its own state).
constexpr const char* kMastersSection = "common.masters";

// The common sections, in the order a blob holds them.
constexpr const char* kCommonSections[] = {kStepsSection,      kLrSection,    kScalerSection,
                                           kRunSection,        kParamStepsSection, kHyperSection,
                                           kDivergenceSection, kMastersSection};
constexpr uint32_t kCommonSectionCount = uint32_t(sizeof kCommonSections / sizeof *kCommonSections);

// The moments of an algorithm's state: <prefix>.exp_avg and
// <prefix>.exp_avg_sq.
inline std::string exp_avg_section(const std::string& prefix) { return prefix + ".exp_avg"; }
inline std::string exp_avg_sq_section(const std::string& prefix) { return prefix + ".exp_avg_sq"; }

// The fp32 moments an algorithm keeps per element: their state view
// names, in order (Adam's "exp_avg" and "exp_avg_sq"; SGD's
// "momentum_buffer"), each saved as the section <prefix>.<view>.
struct MomentNames {
  std::string prefix;
  std::vector<std::string> views;

  MomentNames(std::string prefix_ = "", std::vector<std::string> views_ = {"exp_avg", "exp_avg_sq"})
      : prefix(std::move(prefix_)), views(std::move(views_)) {}
  MomentNames(const char* prefix_) : MomentNames(std::string(prefix_)) {}

  int count() const { return int(views.size()); }
  std::string section(int k) const { return prefix + "." + views[size_t(k)]; }
};

}  // namespace dsopt

#include "optim/common_state.hpp"

#include <cmath>
#include <string>

#include "base/error.hpp"
#include "state/section_names.hpp"

namespace dsopt {
namespace {

constexpr uint64_t kScalerBytes = 8 + 8 + 8 + 4;
// Counters no optimizer writes: they would overflow in the step.
constexpr int64_t kMaxCount = int64_t(1) << 62;

// The blob's group count is that of common.steps.
void check_group_count(const BlobReader& r, uint64_t groups) {
  if (!r.has(kStepsSection)) return;  // the steps' record reports it
  const uint64_t saved_groups = r.section_size(kStepsSection) / 8;
  if (saved_groups != groups)
    fail(DSOPT_EMISMATCH, "state blob has " + std::to_string(saved_groups) +
                              " parameter groups, this optimizer has " + std::to_string(groups));
}

void check_scaler(FieldReader& f) {
  const double scale = f.get<double>();
  const int64_t iter = f.get<int64_t>(), last_overflow = f.get<int64_t>();
  const int32_t hysteresis_left = f.get<int32_t>();
  if (!std::isfinite(scale) || !(scale > 0) || iter < 0 || iter > kMaxCount ||
      last_overflow < -1 || last_overflow >= iter || hysteresis_left < 1)
    fail(DSOPT_ECORRUPT, "state blob: the loss scaler's state is impossible");
}

}  // namespace

void describe_common_state(StateSchema& s, const CommonState& c) {
  HyperGroups* g = &c.groups;
  const uint64_t groups = uint64_t(g->num_groups());
  const uint64_t params = uint64_t(g->param_steps().size());
  s.check([groups](const BlobReader& r) { check_group_count(r, groups); })
      .record(kStepsSection, groups * 8,
              [g](FieldWriter& f) {
                for (int64_t step : g->steps()) f.add(step);
              },
              [groups](FieldReader& f) {
                for (uint64_t i = 0; i < groups; ++i) {
                  const int64_t steps = f.get<int64_t>();
                  if (steps < 0 || steps > kMaxCount)
                    fail(DSOPT_ECORRUPT, "state blob: step counter " + std::to_string(steps) +
                                             " is out of range");
                }
              },
              [g](FieldReader& f) {
                for (int64_t& step : g->steps()) step = f.get<int64_t>();
              })
      .record(kLrSection, groups * 8, [g](FieldWriter& f) { g->write_lrs(f); },
              [groups](FieldReader& f) {
                for (uint64_t i = 0; i < groups; ++i) {
                  const double lr = f.get<double>();
                  if (!std::isfinite(lr) || lr < 0)
                    fail(DSOPT_ECORRUPT, "state blob: learning rate " + std::to_string(lr) +
                                             " is not finite and >= 0");
                }
              },
              [g](FieldReader& f) { g->read_lrs(f); })
      .record(kScalerSection, kScalerBytes,
              [c](FieldWriter& f) {
                const LossScaler::State st = c.scaler.state();
                f.add(st.scale).add(st.iter).add(st.last_overflow_iter).add(st.hysteresis_left);
              },
              check_scaler,
              [c](FieldReader& f) {
                LossScaler::State st;
                st.scale = f.get<double>();
                st.iter = f.get<int64_t>();
                st.last_overflow_iter = f.get<int64_t>();
                st.hysteresis_left = f.get<int32_t>();
                c.scaler.set_state(st);
              })
      .optional_record(kRunSection, 8, [c](FieldWriter& f) { f.add(c.run_id); }, nullptr,
                       [c](FieldReader& f) { c.run_id = f.get<uint64_t>(); }, nullptr)
      .optional_record(kParamStepsSection, params * 8,
                       [g](FieldWriter& f) {
                         for (int64_t step : g->param_steps()) f.add(step);
                       },
                       [params](FieldReader& f) {
                         for (uint64_t i = 0; i < params; ++i)
                           if (f.get<int64_t>() < 0)
                             fail(DSOPT_ECORRUPT, "state blob has a negative step for parameter " +
                                                      std::to_string(i));
                       },
                       [g](FieldReader& f) {
                         for (int64_t& step : g->param_steps()) step = f.get<int64_t>();
                       },
                       [g] { g->param_steps_from_groups(); })
      .optional_record(kHyperSection, groups * HyperGroups::kHyperDoubles * 8,
                       [g](FieldWriter& f) { g->write_hyper(f); }, nullptr,
                       [g](FieldReader& f) { g->read_hyper(f); }, nullptr)
      .optional_record(kDivergenceSection, DivergenceCheck::kStateBytes,
                       [c](FieldWriter& f) { f.add_bytes(c.divergence.save()); },
                       [](FieldReader& f) { DivergenceCheck::check(f.take(DivergenceCheck::kStateBytes)); },
                       [c](FieldReader& f) { c.divergence.restore(f.take(DivergenceCheck::kStateBytes)); },
                       [c] { c.divergence.reset(); });
}

void describe_masters(StateSchema& s, ParamSet& params, Kernels& kernels) {
  ParamSet* p = &params;
  s.array(kMastersSection, kernels, [p] { return static_cast<void*>(p->masters()); },
          uint64_t(params.master_numel()) * 4)
      .then([p](const BlobReader&) { p->write_back(); });
}

}  // namespace dsopt

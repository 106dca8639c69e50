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

// common.steps: each group's steps applied; common.param_steps (optional):
// each parameter's.
void describe_steps(StateSchema& s, HyperGroups* g) {
  const uint64_t groups = uint64_t(g->num_groups());
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
              });
}

void describe_param_steps(StateSchema& s, HyperGroups* g) {
  const uint64_t params = uint64_t(g->param_steps().size());
  s.optional_record(kParamStepsSection, params * 8,
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
                    [g] { g->param_steps_from_groups(); });
}

void describe_lrs(StateSchema& s, HyperGroups* g) {
  const uint64_t groups = uint64_t(g->num_groups());
  s.record(kLrSection, groups * 8, [g](FieldWriter& f) { g->write_lrs(f); },
           [groups](FieldReader& f) {
             for (uint64_t i = 0; i < groups; ++i) {
               const double lr = f.get<double>();
               if (!std::isfinite(lr) || lr < 0)
                 fail(DSOPT_ECORRUPT, "state blob: learning rate " + std::to_string(lr) +
                                          " is not finite and >= 0");
             }
           },
           [g](FieldReader& f) { g->read_lrs(f); });
}

void describe_scaler(StateSchema& s, LossScaler* scaler) {
  s.record(kScalerSection, kScalerBytes,
           [scaler](FieldWriter& f) {
             const LossScaler::State st = scaler->state();
             f.add(st.scale).add(st.iter).add(st.last_overflow_iter).add(st.hysteresis_left);
           },
           check_scaler,
           [scaler](FieldReader& f) {
             LossScaler::State st;
             st.scale = f.get<double>();
             st.iter = f.get<int64_t>();
             st.last_overflow_iter = f.get<int64_t>();
             st.hysteresis_left = f.get<int32_t>();
             scaler->set_state(st);
           });
}

void describe_divergence(StateSchema& s, DivergenceCheck* d) {
  constexpr uint64_t n = DivergenceCheck::kStateBytes;
  s.optional_record(kDivergenceSection, n, [d](FieldWriter& f) { f.add_bytes(d->save()); },
                    [](FieldReader& f) { DivergenceCheck::check(f.take(n)); },
                    [d](FieldReader& f) { d->restore(f.take(n)); }, [d] { d->reset(); });
}

}  // namespace

void describe_common_state(StateSchema& s, const CommonState& c) {
  HyperGroups* g = &c.groups;
  uint64_t* run_id = &c.run_id;
  describe_steps(s, g);
  describe_lrs(s, g);
  describe_scaler(s, &c.scaler);
  s.optional_record(kRunSection, 8, [run_id](FieldWriter& f) { f.add(*run_id); }, nullptr,
                    [run_id](FieldReader& f) { *run_id = f.get<uint64_t>(); }, nullptr);
  describe_param_steps(s, g);
  s.check([g](const BlobReader& r) { g->check_hyper_size(r); })
      .optional_record(kHyperSection, [g](const BlobReader* r) { return g->hyper_bytes(r); },
                       [g](FieldWriter& f) { g->write_hyper(f); },
                       [g](FieldReader& f) { g->check_hyper(f); },
                       [g](FieldReader& f) { g->read_hyper(f); }, nullptr);
  describe_divergence(s, &c.divergence);
}

void describe_masters(StateSchema& s, ParamSet& params, Kernels& kernels) {
  ParamSet* p = &params;
  s.array(kMastersSection, kernels, [p] { return static_cast<void*>(p->masters()); },
          uint64_t(params.master_numel()) * 4)
      .then([p](const BlobReader&) { p->write_back(); });
}

}  // namespace dsopt

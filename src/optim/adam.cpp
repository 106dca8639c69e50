#include "optim/adam.hpp"

#include "base/error.hpp"
#include "zero/adam_shards.hpp"

namespace dsopt {

Adam::Adam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
           const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count),
      decoupled_(cfg.defaults.decoupled),
      moments_(this->params(), this->kernels(), "adam") {}

std::string Adam::algorithm() const { return decoupled_ ? "AdamW" : "Adam"; }

bool Adam::update(const PreparedGrads& grads) {
  const AdamStepConsts c = adam_step_consts();
  const std::vector<UpdateSlot>& all = moments_.all_slots(params(), grads);
  if (c.of_param.empty()) {
    kernels().update(UpdateRule::Adam, all.data(), int64_t(all.size()), c.consts.data(),
                     int32_t(c.consts.size()), grads.mul1, grads.mul2);
  } else {  // parameters with their own step counts, or some left out
    const std::vector<UpdateSlot> slots = c.select(all, [](size_t k) { return int64_t(k); });
    kernels().update(UpdateRule::Adam, slots.data(), int64_t(slots.size()), c.consts.data(),
                     int32_t(c.consts.size()), grads.mul1, grads.mul2);
  }
  return false;
}

}  // namespace dsopt

namespace dsopt {

void Adam::describe_state(StateSchema& s) {
  s.check([](const BlobReader& r) {
    if (r.has(kZeroLayoutSection))
      fail(DSOPT_EMISMATCH, "the blob is one rank's ZeRO shard: load all blobs of that run with "
                            "dsopt_state_load_shards");
  });
  moments_.describe(s, flat_slices());
}

std::function<void()> Adam::reshard(const Blobs& blobs) {
  auto state = std::make_shared<HostAdamState>(
      assemble_adam_state(blobs, params().shapes(), replicated_state_layout(params().shapes())));
  std::shared_ptr<const BlobReader> first = blobs[0];
  return [this, state, first] {
    restore_common(*first);
    restore_masters(state->masters.data());
    kernels().copy_from_host(moments_.exp_avg(), state->m.data(), state->m.size() * 4);
    kernels().copy_from_host(moments_.exp_avg_sq(), state->v.data(), state->v.size() * 4);
  };
}

}  // namespace dsopt

// dsopt_state_load and dsopt_state_load_shards: the blobs are checked on
// every rank (optim/state_io.hpp), the ranks agree that each could load its
// own and whether rank-local state is reset, and only then is anything
// restored.
#include <memory>
#include <string>

#include "base/error.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

bool Optimizer::load_collectively(const std::string& call,
                                  const std::function<std::function<void()>(bool& reset)>& validate) {
  std::function<void()> restore_fn;
  bool reset = false;
  const LocalOutcome mine = attempt([&] { restore_fn = validate(reset); });
  // Whether some rank resets (then all do: the ranks' rank-local states
  // must fit together).
  int64_t resets = reset ? 1 : 0;
  agreement_.settle(Failure{call, "could not load its blob", "no rank changed anything"}, mine,
                    &resets, 1);
  reset = resets != 0;
  resetting_rank_local_ = reset;
  try {
    restore_fn();
  } catch (...) {
    resetting_rank_local_ = false;
    throw;
  }
  resetting_rank_local_ = false;
  kernels_->synchronize();
  return reset;
}

bool Optimizer::others_rank_local(const BlobReader& r, bool may_reset) const {
  const BlobHeader& h = r.header();
  const int world = comm_.size(), rank = comm_.rank();
  if (world == 1 || h.world_size != uint32_t(world) || h.rank == uint32_t(rank)) return false;
  const std::string what = rank_local_state(r);
  if (what.empty()) return false;
  if (may_reset) return true;
  fail(DSOPT_EMISMATCH,
       "the blob was saved by rank " + std::to_string(h.rank) + " of " + std::to_string(world) +
           " and holds " + what + ", which belong to that rank; this is rank " +
           std::to_string(rank) + ": load the blob rank " + std::to_string(rank) +
           " saved, or every rank's blob with dsopt_state_load_shards, or reset that state as a "
           "load at another world size does with dsopt_state_load_ex and "
           "DSOPT_LOAD_RESET_RANK_LOCAL (nothing was changed)");
}

bool Optimizer::load(const void* src, uint64_t size, uint32_t flags) {
  const char* call = flags == 0 ? "dsopt_state_load" : "dsopt_state_load_ex";
  require_intact(call);
  refuse_while_handing_over(call);
  enter_collective(Call::Load);
  return load_collectively(call, [&](bool& reset) -> std::function<void()> {
    if (flags & ~uint32_t(DSOPT_LOAD_RESET_RANK_LOCAL))
      fail(DSOPT_EINVAL, "unknown flags " + std::to_string(flags) +
                             " (DSOPT_LOAD_RESET_RANK_LOCAL is the only flag)");
    if (!src) fail(DSOPT_EINVAL, "src is NULL");
    std::shared_ptr<const BlobReader> r = io_.read(src, size);
    state_schema().check(*r);
    reset = others_rank_local(*r, (flags & DSOPT_LOAD_RESET_RANK_LOCAL) != 0);
    return [this, r] { io_.restore(*r); };
  });
}

void Optimizer::load_shards(const void* const* blobs, const uint64_t* sizes, int64_t count) {
  require_intact("dsopt_state_load_shards");
  refuse_while_handing_over("dsopt_state_load_shards");
  enter_collective(Call::LoadShards);
  load_collectively("dsopt_state_load_shards", [&](bool&) -> std::function<void()> {
    const Blobs set = io_.read_set(blobs, sizes, count);
    if (std::function<void()> fn = reshard(set)) return fn;
    // Replicated state: this rank's own blob at the same size, else the first.
    const bool own = count == comm_.size() && comm_.size() > 1;
    std::shared_ptr<const BlobReader> r = set[own ? size_t(comm_.rank()) : 0];
    state_schema().check(*r);
    others_rank_local(*r, false);  // one blob of another rank at this size
    return [this, r] { io_.restore(*r); };
  });
}

void Optimizer::restore_masters(const float* host) {
  kernels_->copy_from_host(params_.masters(), host, uint64_t(params_.master_numel()) * 4);
  params_.write_back();
}

}  // namespace dsopt

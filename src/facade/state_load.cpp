// dsopt_state_load and dsopt_state_load_shards: the blobs are checked on
// every rank (optim/state_io.hpp), the ranks agree that each could load its
// own and whether rank-local state is reset, and only then is anything
// restored.
#include <memory>
#include <string>

#include "base/error.hpp"
#include "facade/optimizer.hpp"
#include "facade/optimizer_impl.hpp"

namespace dsopt {

bool Optimizer::Impl::load_collectively(
    const std::string& call, const std::function<std::function<void()>(bool& reset)>& validate) {
  std::function<void()> restore_fn;
  bool reset = false;
  const LocalOutcome mine = attempt([&] { restore_fn = validate(reset); });
  // Whether some rank resets (then all do: the ranks' rank-local states
  // must fit together).
  int64_t resets = reset ? 1 : 0;
  parts.agreement().settle(Failure{call, "could not load its blob", "no rank changed anything"},
                           mine, &resets, 1);
  reset = resets != 0;
  parts.set_resetting_rank_local(reset);
  try {
    restore_fn();
  } catch (...) {
    parts.set_resetting_rank_local(false);
    throw;
  }
  parts.set_resetting_rank_local(false);
  parts.kernels().synchronize();
  return reset;
}

bool Optimizer::Impl::others_rank_local(const BlobReader& r, bool may_reset) const {
  const BlobHeader& h = r.header();
  const int world = parts.comm().size(), rank = parts.comm().rank();
  if (world == 1 || h.world_size != uint32_t(world) || h.rank == uint32_t(rank)) return false;
  const std::string what = algorithm->rank_local_state(r);
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
  Impl& s = *impl_;
  const char* call = flags == 0 ? "dsopt_state_load" : "dsopt_state_load_ex";
  s.require_intact(call);
  s.refuse_while_handing_over(call);
  s.enter_collective(Impl::Call::Load);
  return s.load_collectively(call, [&](bool& reset) -> std::function<void()> {
    if (flags & ~uint32_t(DSOPT_LOAD_RESET_RANK_LOCAL | DSOPT_LOAD_WITHOUT_RANK_LOCAL))
      fail(DSOPT_EINVAL, "unknown flags " + std::to_string(flags) +
                             " (DSOPT_LOAD_RESET_RANK_LOCAL and DSOPT_LOAD_WITHOUT_RANK_LOCAL are "
                             "the flags)");
    if (!src) fail(DSOPT_EINVAL, "src is NULL");
    std::shared_ptr<const BlobReader> r = s.parts.io().read(src, size);
    // Without rank-local state the check sees the load as the reset it is:
    // the rank-local arrays it does not restore may be empty.
    const bool without = (flags & DSOPT_LOAD_WITHOUT_RANK_LOCAL) != 0;
    s.parts.set_resetting_rank_local(without);
    try {
      s.state_schema().check(*r);
    } catch (...) {
      s.parts.set_resetting_rank_local(false);
      throw;
    }
    s.parts.set_resetting_rank_local(false);
    reset = without || s.others_rank_local(*r, (flags & DSOPT_LOAD_RESET_RANK_LOCAL) != 0) ||
            s.algorithm->drops_rank_local(*r);
    return [&s, r] { s.parts.io().restore(*r); };
  });
}

void Optimizer::load_shards(const void* const* blobs, const uint64_t* sizes, int64_t count) {
  Impl& s = *impl_;
  s.require_intact("dsopt_state_load_shards");
  s.refuse_while_handing_over("dsopt_state_load_shards");
  s.enter_collective(Impl::Call::LoadShards);
  s.load_collectively("dsopt_state_load_shards", [&](bool&) -> std::function<void()> {
    const StateIO::Blobs set = s.parts.io().read_set(blobs, sizes, count);
    if (std::function<void()> fn = s.algorithm->reshard(set)) return fn;
    // Replicated state: this rank's own blob at the same size, else the first.
    const Comm& comm = s.parts.comm();
    const bool own = count == comm.size() && comm.size() > 1;
    std::shared_ptr<const BlobReader> r = set[own ? size_t(comm.rank()) : 0];
    s.state_schema().check(*r);
    s.others_rank_local(*r, false);  // one blob of another rank at this size
    return [&s, r] { s.parts.io().restore(*r); };
  });
}

uint64_t Optimizer::save(void* dst, uint64_t capacity) const {
  return impl_->parts.io().save(dst, capacity);
}

}  // namespace dsopt

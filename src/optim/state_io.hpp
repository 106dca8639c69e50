// An optimizer's state blob: its common sections (optim/common_state.hpp),
// then the masters and the algorithm's own state (AlgorithmImpl::describe_state),
// each part described once as state schema entries. Saves blobs, parses and
// checks them (alone, or as the blobs of one save of a run) and restores
// them; what a load does across ranks is the optimizer's.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "optim/common_state.hpp"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class StateIO {
 public:
  // `algorithm` names the algorithm in blobs; `describe` lists its own
  // state (called once, on first use). Every part outlives this object.
  StateIO(Comm& comm, ParamSet& params, Kernels& kernels, const CommonState& common,
          std::function<std::string()> algorithm, std::function<void(StateSchema&)> describe);

  // Measures (dst null) or writes the blob; returns its size.
  uint64_t save(void* dst, uint64_t capacity) const;
  // Parses a blob and checks what every blob of this optimizer has:
  // algorithm, parameters, groups, the common sections.
  std::unique_ptr<const BlobReader> read(const void* src, uint64_t size) const;
  // read() of each, and checks that they form one save of one run.
  using Blobs = std::vector<std::shared_ptr<const BlobReader>>;
  Blobs read_set(const void* const* blobs, const uint64_t* sizes, int64_t count) const;
  // Restores the common sections of a checked blob (what every blob
  // shares; for resharding), or everything from one blob of this
  // optimizer's own layout (checked by read() and state().check()).
  void restore_common(const BlobReader& r) const { common_.restore(r); }
  void restore(const BlobReader& r) const;
  // The masters and the algorithm's state list, described on first use.
  const StateSchema& state() const;

 private:
  Comm& comm_;
  ParamSet& params_;
  Kernels& kernels_;
  std::function<std::string()> algorithm_;
  std::function<void(StateSchema&)> describe_;
  StateSchema common_;
  mutable std::unique_ptr<StateSchema> state_;  // see state()
};

}  // namespace dsopt

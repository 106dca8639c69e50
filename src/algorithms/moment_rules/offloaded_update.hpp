// ZeRO-Offload's update (docs/design/zero.md section 9, adam.md section 3.6): a
// CUDA optimizer's shard of fp32 masters and moments lives in host memory
// and is updated by the CPU kernels. Each step the averaged gradient shard
// comes down once (fp32); the update then runs tile by tile, and each tile's
// new parameter values go up in the parameters' own dtype (2 bytes per
// element for 16-bit ones) on alternating copy lanes while the CPU updates
// the next tile. The math is the update every device runs (math/adam.hpp, math/lion.hpp),
// so offloaded and device-resident runs give bit-identical parameters.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/device_buffer.hpp"
#include "algorithms/moment_rules/adam_step_consts.hpp"
#include "params/param_set.hpp"
#include "zero/moment_shards.hpp"

namespace dsopt {

class OffloadedUpdate {
 public:
  // `state`: this rank's fragments. masters16, m and v are host arrays (the
  // 16-bit fragments' masters at their master_offset; moments over the
  // shard, v nullptr for a rule without it) owned by the caller; with `pin`
  // they are page-locked here. `rule`: an elementwise moment rule's update
  // (Adam, Lion), whose constants are AdamConsts.
  OffloadedUpdate(const StateLayout& state, const ParamSet& params, Kernels& device, Kernels& host,
                  bool pin, int64_t tile, float* masters16, float* m, float* v, UpdateRule rule);
  ~OffloadedUpdate();
  OffloadedUpdate(const OffloadedUpdate&) = delete;
  OffloadedUpdate& operator=(const OffloadedUpdate&) = delete;

  // Reads the masters of this rank's fragments from the caller's (device)
  // parameters: all of them at creation, the fp32 ones after a load.
  void read_masters(bool half_too);
  // The rule on the host with the device gradient shard, the results
  // written into the caller's parameters (parameters left out by `consts`
  // are not touched).
  void run(const float* shard_grads, const AdamStepConsts& consts, float mul1, float mul2);
  // Rounds the masters of the 16-bit fragments into the caller's parameters.
  void publish();

 private:
  float* master(const StatePiece& p) const;
  // Uploads elements [from, from + n) of piece p from `src` (host, in the
  // parameter's dtype) on `lane`.
  void upload(const StatePiece& p, int64_t from, int64_t n, const void* src, int lane);

  const StateLayout& state_;
  const ParamSet& params_;
  Kernels& device_;
  Kernels& host_;
  bool pin_;
  int64_t tile_;  // elements updated between uploads
  float *masters16_, *m_, *v_;
  UpdateRule rule_;
  std::vector<int64_t> fp32_offset_;  // per piece: its place in fp32_masters_, or -1
  DeviceBuffer fp32_masters_;  // host: masters of the fp32 fragments
  DeviceBuffer grads_;         // host: the gradient shard
  DeviceBuffer staging_;       // host: two tiles of 16-bit values, one per lane
  std::vector<void*> pinned_;
};

}  // namespace dsopt

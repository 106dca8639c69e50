// The LAMB update written once, for every layout of its slots: 1-bit
// LAMB's warmup and LAMB at stage 0 pass whole tensors, LAMB under ZeRO
// passes a shard's fragments (docs/optimizers/lamb.md).
//
// Slot k's group is the index of its parameter; consts[i] holds parameter
// i's constants and lr[i] its learning rate. `sums` returns, for each
// stream in turn, the sum of squares of every parameter's whole tensor in
// the order of math/sum_squares.hpp (so the trust ratios are the same on
// every rank and in every layout); of sharded parameters
// (dsopt_comm_set_shards), the sum over the shard group of each rank's
// sums of its shards (the same on every rank, in another order).
#pragma once
#include <functional>
#include <initializer_list>
#include <vector>

#include "kernels/kernels.hpp"
#include "math/onebit_lamb.hpp"
#include "optim/shard_group.hpp"

namespace dsopt {

// One step's constants and learning rate of every parameter.
struct LambStepConsts {
  std::vector<LambConsts> consts;
  std::vector<double> lr;
};

using TensorSums = std::function<std::vector<double>(const std::vector<UpdateSlot>&,
                                                     std::initializer_list<Operand>)>;

// Sums over slots that are whole tensors, one per parameter; and the same
// as lamb_step's `sums`.
std::vector<double> whole_tensor_sums(Kernels& kernels, const std::vector<UpdateSlot>& slots,
                                      std::initializer_list<Operand> streams);
TensorSums whole_tensors(Kernels& kernels);
// `local` (sums over this rank's slots), each tensor's sums then added over
// the shard group (sharded parameters, dsopt_comm_set_shards) in one
// allreduce: the sums of whole tensors. Inactive shards: `local` itself.
TensorSums shard_summed(TensorSums local, const ShardGroup& shards);

// m, v and the direction u from the gradient (LambWarmupRule), the trust
// ratio ||p|| / ||u|| of every tensor (clamped, math/onebit_lamb.hpp), then
// p += fl32(-lr * ratio) u. Returns the trust ratios.
std::vector<double> lamb_step(Kernels& kernels, const std::vector<UpdateSlot>& slots,
                              std::vector<LambConsts>& consts, const std::vector<double>& lr,
                              float mul1, float mul2, const LambCoeffConfig& k,
                              const TensorSums& sums);

// p += fl32(-lr[i] coeff[i]) u of every parameter i (LambApplyRule).
void lamb_move(Kernels& kernels, const std::vector<UpdateSlot>& slots,
               std::vector<LambConsts>& consts, const std::vector<double>& lr,
               const std::vector<double>& coeff);

}  // namespace dsopt

// Per-tensor sums of squares of arrays that ZeRO shards (docs/guides/zero.md
// "Any update rule"): LAMB's trust ratio needs ||p|| and ||u|| of whole
// tensors, whose elements lie in several ranks' shards. The sums equal,
// bit for bit, those the kernels form over whole tensors (the order of
// math/sum_squares.hpp), whatever the layout cuts:
//
// * a sum block (kSumBlock elements from the tensor's start) that lies in
//   one fragment of one rank is summed by that rank;
// * a block that the layout cuts (between ranks or buckets) is rebuilt
//   whole on every rank: each rank writes its elements of it into a buffer
//   of zeros and one allreduce adds them (x + 0 is exact), then it is
//   summed like any other;
// * one allreduce of every block's sum (each written by one rank, zeros
//   elsewhere) gives every rank all of them, which it adds in block order.
//
// With the default layout (one bucket) at most P - 1 blocks per array are
// cut; with small buckets most are, and the rebuilt blocks approach the
// arrays' size.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/kernels.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

class ShardTensorSums {
 public:
  ShardTensorSums(const ShardLayout& layout, int rank, Comm& comm, Kernels& kernels, const Mem& mem);

  // Collective. `fragments` holds one slot per fragment of this rank
  // (ShardLayout::fragments, in that order) whose `streams` point at the
  // fragment's first element. Returns, for each stream in turn, the sum of
  // squares of every parameter (streams.size() x parameter count).
  std::vector<double> sums(const std::vector<UpdateSlot>& fragments,
                           std::initializer_list<Operand> streams);

 private:
  // A block this rank sums from one of its fragments.
  struct OwnBlock {
    int64_t block;     // global block index
    size_t fragment;   // this rank's fragment holding it
    int64_t offset;    // of the block's first element in the fragment
    int64_t numel;
  };
  // This rank's part of a cut block.
  struct CutPiece {
    size_t fragment;
    int64_t offset;    // in the fragment
    int64_t at;        // in the rebuilt blocks
    int64_t numel;
  };
  struct CutBlock {
    int64_t block;
    int64_t at;        // first element in the rebuilt blocks
    int64_t numel;
  };

  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  int rank_;
  std::vector<int64_t> first_block_;  // per parameter, then the total
  std::vector<OwnBlock> own_;
  std::vector<CutBlock> cut_;
  std::vector<CutPiece> pieces_;
  int64_t cut_numel_ = 0;  // elements of the rebuilt blocks
  size_t fragment_count_ = 0;
  DeviceBuffer rebuilt_;  // the cut blocks, per stream (grown on demand)
};

}  // namespace dsopt

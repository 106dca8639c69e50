// ZeRO's gradient path (docs/design/zero.md section 5, recommended form): this
// rank's local gradients are packed bucket by bucket into fp32 (checked for
// Inf/NaN on the way), each bucket is reduce-scattered as soon as it is
// complete so that every rank receives the sum of its own piece, and the
// shard is averaged with fl(1/(P*G)) (docs/design/decisions.md G3). One scalar allreduce
// then agrees on the status and the global norm.
//
// Gradients come all at once (dsopt_step) or one by one (dsopt_grad_ready,
// src/handover). Over G micro-batches stage 2 reduces every micro-batch and
// adds the reduced pieces to the shard in fp32; stage 1 adds the local
// gradients in one fp32 buffer of the whole model and reduces once, in the
// last micro-batch. Bucket buffers come from a pool: the first is the
// scratch shared with the parameter allgather, more are made only while
// reductions run behind backward.
//
// With a gradient codec (docs/guides/compressed-zero.md) each bucket
// travels compressed instead: this rank encodes its P pieces of the bucket
// (plus its error-feedback residual there), an all-to-all hands every owner
// its piece from every rank, and the owner sums the decoded pieces in rank
// order. The residual is an int8 run of the codec's blocks per bucket
// piece (math/block_codec.hpp). It is double-buffered: a step writes the
// pending copy, and commit_feedback() makes it current once the update
// runs, so a skipped or failed step leaves it as it was. The encoded pieces
// take the bucket's own buffer: piece j > 0 is encoded over the gradients
// of pieces before it, which are read by then, and piece 0 aside, then
// copied in front; the pieces received follow them. Pieces of fewer than
// about two blocks, whose codes would overtake their own gradients, are
// encoded aside instead and received into a bucket buffer.
//
// Node-aware (set_hierarchy, docs/design/node-aware-zero.md): N nodes of R
// ranks. Each bucket is first reduce-scattered in fp32 inside the node, for
// each node k' the pieces of its ranks (local index order) by an all-to-all
// over the node and a sum in the fixed order of comm.hpp: local rank j then
// holds the node's sum of the pieces owned by the ranks of local index j,
// one per node (its node-slice, N pieces).
// It encodes those N pieces (plus its residual there: N int8 runs per
// bucket instead of P), the rail communicator's all-to-all hands each owner
// its piece from every node, and the owner sums the N decoded pieces in node
// order. Every rank still owns the piece of the flat layout.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "handover/gradient_handover.hpp"
#include "kernels/device_buffer.hpp"
#include "comm/rank_agreement.hpp"
#include "comm/topology.hpp"
#include "params/param_set.hpp"
#include "zero/compression.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

// What the reduction of a step's gradients found, agreed across ranks.
struct ReducedShard {
  bool nonfinite = false;  // some rank had a non-finite gradient, or a sum is one
  double sumsq = 0.0;      // of the averaged gradient over every shard (when asked for)
};

class GradientReducer final : public GradientHandover {
 public:
  // reduce_scatter false: each bucket is allreduced and the own piece kept
  // (DeepSpeed's traffic, same sums). `scratch` (device memory of at least
  // scratch_bytes(layout, compression)) holds a bucket during reduce(); it
  // is free between steps.
  GradientReducer(const ShardLayout& layout, int stage, bool reduce_scatter,
                  const ZeroCompression& compression, Comm& comm, Kernels& kernels,
                  const Mem& mem, const ParamSet& params, RankAgreement& agreement,
                  CommRunner& runner, void* scratch);
  static size_t scratch_bytes(const ShardLayout& layout, const ZeroCompression& compression);
  // Bytes of a rank's residual: the int8 runs of every bucket's `pieces`
  // pieces (P flat, N node-aware).
  static size_t residual_bytes(const ShardLayout& layout, int64_t block, int pieces);
  // This rank's residual bytes as it runs now (residual_bytes with pieces()).
  size_t residual_bytes() const;

  // Collective layout choice, before the first step (at creation): the
  // gradient codes run node-aware over `t` (R > 1) with its node and rail
  // communicators, which must outlive this reducer. The residual starts at
  // zero. No-op without a gradient codec.
  void set_hierarchy(const Topology& t, Comm& node, Comm& rail);
  bool hierarchical() const { return node_ != nullptr; }
  // Pieces this rank encodes per bucket: P flat, N node-aware.
  int pieces() const { return hierarchical() ? nodes_ : layout_.world(); }
  // The topology the residual belongs to: (N, R), (P, 1) when flat.
  int residual_nodes() const { return hierarchical() ? nodes_ : layout_.world(); }
  int residual_ranks_per_node() const { return hierarchical() ? per_node_ : 1; }

  // Whether buckets travel compressed (a gradient codec at 2+ ranks), and
  // whether this rank keeps an error-feedback residual (twice).
  bool compressed() const { return codec_.has_value(); }
  bool feedback() const { return residual_.get() != nullptr; }
  // The residual the next step starts from (residual_bytes(); nullptr
  // without feedback); the state blob saves and restores it.
  void* residual() const { return residual_.get(); }
  // Sets the residual to the int8 encoding of n' fp32 values in flat
  // order (host memory): a residual saved in fp32.
  void load_fp32_residual(const float* host);
  // After a step whose update runs: its residual becomes the current one.
  void commit_feedback();
  // Sets the residual to zero (after resharding).
  void reset_feedback();
  // Before a step's reduction: the loss scale its gradients carry. The
  // residual is kept in the units of the scale it was made under; the
  // step's encodings multiply it by new/old (powers of two: exact), and
  // commit_feedback() records the new scale with the new residual.
  void set_gradient_scale(double scale) { step_scale_ = scale; }
  // The scale the residual is in (saved with it).
  double& residual_scale() { return residual_scale_; }

  // Collective. Fills shard() with this rank's piece of the averaged
  // gradient and returns what the ranks found (the sum of squares when
  // `norm`). Fails the step on every rank when any rank's gradients do not
  // fit the parameters (RankAgreement); nothing has changed then.
  ReducedShard reduce_at_once(const dsopt_tensor* grads, int64_t count, bool norm);
  // Opens a window for gradients handed over one by one.
  void open_handover(int micro_batches);
  // Collective, after the window is complete and the runner has finished.
  ReducedShard reduce_handed_over(bool norm);

  // The averaged fp32 gradient of this rank's shard (S elements).
  float* shard() const { return shard_.floats(); }

 protected:
  float* storage(int64_t k, int64_t pos) override;
  bool fresh(int m) const override;
  bool reduces(int m) const override;
  void reduce(int64_t k, int m) override;

 private:
  struct Buffer {
    float* send = nullptr;  // one bucket, packed in flat order
    DeviceBuffer own;       // send's memory, unless it is the scratch
    DeviceBuffer received;  // a reduced piece to add to the shard
  };
  // Bucket buffers kept while reductions run behind backward: one filling,
  // two being reduced.
  static constexpr size_t kBuffers = 3;
  struct InFlight {
    uint64_t ticket;
    size_t buffer;
    int64_t bucket;
    bool add;  // the piece arrived in `received`: add it to the shard
  };
  Plan flat_plan() const;
  bool accumulates_locally() const;  // stage 1 over several micro-batches
  // Returns the buffers of finished reductions to the pool (all: wait for
  // every one), adding received pieces to the shard in posting order.
  void reclaim(bool all);
  // Steps 2-4 once every reduction has finished: average, check, agree.
  ReducedShard finish(float mul, bool nonfinite, bool norm, const std::string& local_error);

  // The compressed form of reduce(): encode, all-to-all, decode and sum.
  // `spare` (a bucket buffer) receives the pieces when they are not
  // encoded in place. Returns the runner's ticket.
  uint64_t exchange_compressed(int64_t k, float* packed, uint8_t* spare, float* dest);
  // exchange_compressed's node-aware form (the runner runs it).
  void exchange_hierarchical(const ReduceBucket& b, float* packed, const uint8_t* e_in, float e_mul,
                             uint8_t* e_out, float* dest);
  // (Re)makes the residual and its pending copy, zero, for pieces() pieces.
  void make_residual();
  // The largest piece of a bucket.
  static int64_t largest_piece(const ShardLayout& layout);
  // Whether a bucket's pieces of `piece` elements are encoded in place
  // (their run bytes are at most 2 * piece).
  static bool in_place(BlockCodec codec, int64_t block, int64_t piece);
  // The int8 runs of a bucket's P pieces' residuals.
  static size_t bucket_residual_bytes(const ShardLayout& layout, const ReduceBucket& b, int64_t block,
                                      int pieces);
  // P run bytes of the largest piece not encoded in place (0: none).
  static size_t aside_bytes(const ShardLayout& layout, BlockCodec codec, int64_t block);
  // What the current residual is multiplied by in this step's units.
  float rescale() const;

  const ShardLayout& layout_;
  int stage_;
  bool reduce_scatter_;
  Comm& comm_;
  Mem mem_;
  const ParamSet& params_;
  RankAgreement& agreement_;
  CommRunner& runner_;
  void* scratch_;
  std::vector<Buffer> pool_;
  std::vector<size_t> free_;
  std::vector<InFlight> in_flight_;
  std::vector<int64_t> bucket_buffer_;  // per bucket: its pool buffer in this micro-batch, or -1
  DeviceBuffer local_sum_;  // stage 1 over several micro-batches: the flat gradient
  DeviceBuffer shard_;      // S floats
  // With a gradient codec: the codec (or none), its block, the buffer of
  // what is encoded aside (the runner runs one exchange at a time), the residual and its
  // pending copy (each bucket's at residual_at_), and which buckets this
  // window has encoded.
  std::optional<BlockCodec> codec_;
  int64_t block_ = 0;
  size_t buffer_bytes_ = 0;  // of a bucket buffer: scratch_bytes()
  DeviceBuffer send_;
  DeviceBuffer residual_, pending_;
  std::vector<size_t> residual_at_;
  std::vector<char> encoded_;
  double residual_scale_ = 1.0;
  double step_scale_ = 1.0;
  // Node-aware: the node and rail communicators, N, R, the rank of
  // (node k, local j) at rank_of_[k * R + j], whether each node's ranks are
  // consecutive (its pieces are then one run of the bucket), and the
  // runner's buffers: the node-slice (N pieces of the largest bucket), the
  // codes sent and received (2 N runs), the R pieces a node's all-to-all
  // receives, and a node's pieces gathered (R pieces; only where some
  // node's ranks are not consecutive).
  Comm* node_ = nullptr;
  Comm* rail_ = nullptr;
  int nodes_ = 1, per_node_ = 1, local_ = 0;
  std::vector<int> rank_of_;
  bool consecutive_ = true;
  DeviceBuffer slice_, codes_, node_blocks_, gathered_;
};

}  // namespace dsopt

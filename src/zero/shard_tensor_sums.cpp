#include "zero/shard_tensor_sums.hpp"

#include <algorithm>
#include <string>

#include "base/error.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {

ShardTensorSums::ShardTensorSums(const ShardLayout& layout, int rank, Comm& comm, Kernels& kernels,
                                 const Mem& mem)
    : comm_(comm), kernels_(kernels), mem_(mem), rank_(rank) {
  const std::vector<int64_t>& numels = layout.numels();
  first_block_.push_back(0);
  for (int64_t n : numels) first_block_.push_back(first_block_.back() + sum_blocks(n));
  const int64_t total = first_block_.back();

  // Calls fn(fragment index, fragment, block within the parameter, its
  // first element, its end) for every block a fragment overlaps.
  auto for_each_block = [&](const std::vector<ShardFragment>& frags, auto fn) {
    for (size_t k = 0; k < frags.size(); ++k) {
      const ShardFragment& f = frags[k];
      const int64_t n = numels[size_t(f.param)];
      for (int64_t b = f.param_offset / kSumBlock; b <= (f.param_offset + f.numel - 1) / kSumBlock; ++b)
        fn(k, f, b, b * kSumBlock, std::min(b * kSumBlock + kSumBlock, n));
    }
  };
  auto inside = [](const ShardFragment& f, int64_t begin, int64_t end) {
    return f.param_offset <= begin && f.param_offset + f.numel >= end;
  };

  // Which blocks some rank holds whole in one fragment.
  std::vector<uint8_t> whole(size_t(total), 0);
  for (int r = 0; r < layout.world(); ++r) {
    const std::vector<ShardFragment> frags = layout.fragments(r);
    if (r == rank) fragment_count_ = frags.size();
    for_each_block(frags, [&](size_t k, const ShardFragment& f, int64_t b, int64_t begin, int64_t end) {
      if (!inside(f, begin, end)) return;
      const int64_t block = first_block_[size_t(f.param)] + b;
      whole[size_t(block)] = 1;
      if (r == rank) own_.push_back(OwnBlock{block, k, begin - f.param_offset, end - begin});
    });
  }
  // The others, rebuilt back to back, and this rank's pieces of them.
  std::vector<int64_t> cut_at(size_t(total), -1);
  for (size_t t = 0; t < numels.size(); ++t)
    for (int64_t block = first_block_[t]; block < first_block_[t + 1]; ++block) {
      if (whole[size_t(block)]) continue;
      const int64_t begin = (block - first_block_[t]) * kSumBlock;
      const int64_t numel = std::min(kSumBlock, numels[t] - begin);
      cut_at[size_t(block)] = cut_numel_;
      cut_.push_back(CutBlock{block, cut_numel_, numel});
      cut_numel_ += numel;
    }
  for_each_block(layout.fragments(rank),
                 [&](size_t k, const ShardFragment& f, int64_t b, int64_t begin, int64_t end) {
                   const int64_t at = cut_at[size_t(first_block_[size_t(f.param)] + b)];
                   if (at < 0) return;
                   const int64_t lo = std::max(f.param_offset, begin);
                   const int64_t hi = std::min(f.param_offset + f.numel, end);
                   pieces_.push_back(CutPiece{k, lo - f.param_offset, at + (lo - begin), hi - lo});
                 });
}

std::vector<double> ShardTensorSums::sums(const std::vector<UpdateSlot>& fragments,
                                          std::initializer_list<Operand> streams) {
  if (fragments.size() != fragment_count_)
    fail(DSOPT_EINTERNAL, "shard sums: " + std::to_string(fragments.size()) + " slots for " +
                              std::to_string(fragment_count_) + " fragments");
  const std::vector<Operand> ops(streams);
  const int64_t total = first_block_.back();
  std::vector<double> blocks(ops.size() * size_t(total), 0.0);

  // Sums of squares of `refs`, stream-major, into their blocks.
  auto sum_into = [&](std::vector<TensorRef>& refs, auto block_of) {
    if (refs.empty()) return;
    std::vector<double> got(refs.size());
    kernels_.transform(refs.data(), int64_t(refs.size()), 1.0f, nullptr, got.data());
    const size_t per_stream = refs.size() / ops.size();
    for (size_t s = 0; s < ops.size(); ++s)
      for (size_t j = 0; j < per_stream; ++j)
        blocks[s * size_t(total) + size_t(block_of(j))] = got[s * per_stream + j];
  };

  std::vector<TensorRef> refs;
  for (Operand o : ops)
    for (const OwnBlock& b : own_)
      refs.push_back(TensorRef{fragments[b.fragment].floats(o) + b.offset, b.numel, DType::F32});
  sum_into(refs, [this](size_t j) { return own_[j].block; });

  if (cut_numel_ > 0) {
    const size_t bytes = ops.size() * size_t(cut_numel_) * 4;
    if (rebuilt_.bytes() < bytes) rebuilt_ = DeviceBuffer(kernels_, bytes);
    float* rebuilt = rebuilt_.floats();
    kernels_.fill_zero(rebuilt, bytes);
    for (size_t s = 0; s < ops.size(); ++s)
      for (const CutPiece& p : pieces_)
        kernels_.copy(rebuilt + int64_t(s) * cut_numel_ + p.at,
                      fragments[p.fragment].floats(ops[s]) + p.offset, size_t(p.numel) * 4);
    comm_.allreduce(rebuilt, rebuilt, ops.size() * size_t(cut_numel_), Elem::F32, ReduceOp::Sum, mem_);
    if (rank_ == 0) {  // every rank has them; one writes their sums
      refs.clear();
      for (size_t s = 0; s < ops.size(); ++s)
        for (const CutBlock& c : cut_)
          refs.push_back(TensorRef{rebuilt + int64_t(s) * cut_numel_ + c.at, c.numel, DType::F32});
      sum_into(refs, [this](size_t j) { return cut_[j].block; });
    }
  }
  comm_.allreduce(blocks.data(), blocks.data(), blocks.size(), Elem::F64, ReduceOp::Sum, Mem::host());

  const size_t count = first_block_.size() - 1;
  std::vector<double> out(ops.size() * count);
  for (size_t s = 0; s < ops.size(); ++s)
    for (size_t t = 0; t < count; ++t) {
      double sum = 0.0;  // block sums in block order, as the kernels add them
      for (int64_t b = first_block_[t]; b < first_block_[t + 1]; ++b) sum += blocks[s * size_t(total) + size_t(b)];
      out[s * count + t] = sum;
    }
  return out;
}

}  // namespace dsopt

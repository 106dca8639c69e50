// CompressedAllreduce::run: one call in pieces (car_pieces.hpp).
//
// Phase 1: the pass that sums the squares of y = x + e_w (W1/W2) also
// writes the signs of y (W4/W5), piece by piece, and each piece's
// all-to-all (A1) starts as soon as its signs are there: only the error
// update (W3) needs the scale. Then the worker scales travel (A2) and the
// server averages the pieces in order as they arrive (S1/S2). Phase 2
// recompresses (S3-S5) and gathers (B1/B2) piece by piece, and decodes
// (F1/F2) each piece as it arrives. The error update, which nothing waits
// for, fills the time the transfers leave (each piece's before its decode
// overwrites x). Transfers are polled between slices of work.
#include <algorithm>
#include <cmath>
#include <utility>

#include "comm/compressed_allreduce.hpp"
#include "base/error.hpp"
#include "comm/transfers.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace {

// Elements of work between two polls of the transfers (about a millisecond).
constexpr int64_t kPollElements = int64_t(1) << 18;

// docs/design/decisions.md C3: s = fl(fl(sqrt(sum_sq)) / fl(sqrt(double(len)))).
float rms_scale(double sum_squares, int64_t len) {
  return float(std::sqrt(sum_squares)) / float(std::sqrt(double(len)));
}

// Block sums added in block order (math/sum_squares.hpp).
double in_order(const double* sums, int64_t blocks) {
  double s = 0.0;
  for (int64_t b = 0; b < blocks; ++b) s += sums[b];
  return s;
}

}  // namespace

class CompressedAllreduce::Call {
 public:
  explicit Call(CompressedAllreduce& car)
      : car_(car), k_(car.kernels_), world_(car.world_), count_(size_t(car.count())),
        host_{car.host_.get(), false}, send_(static_cast<uint8_t*>(car.send_.get())),
        recv_(static_cast<uint8_t*>(car.recv_.get())),
        server_bits_(static_cast<uint8_t*>(car.server_bits_.get())), scales_(count_),
        all_scales_(count_ * size_t(world_)), server_scales_(count_),
        all_server_scales_(count_ * size_t(world_)), first_block_(count_ + 1, 0),
        decoded_(car.tensors_) {
    for (size_t t = 0; t < count_; ++t)
      first_block_[t + 1] = first_block_[t] + sum_blocks(car.tensors_[t].padded);
    worker_sums_.assign(size_t(first_block_.back()), 0.0);
    summed_.assign(worker_sums_.size(), false);
  }

  void run() {
    const std::vector<CarPiece>& pieces = car_.pieces_;
    const size_t n = pieces.size();
    phase_one();

    // S3 from the block sums in block order; S4/S5 and B1 piece by piece
    // (server_bits_ holds the message, send_ receives the pieces).
    std::vector<double> server_sumsq(count_, 0.0);
    for (size_t b = 0; b < block_sums_.size(); ++b) server_sumsq[size_t(block_tensor_[b])] += block_sums_[b];
    for (size_t t = 0; t < count_; ++t)
      server_scales_[t] = rms_scale(server_sumsq[t], car_.tensors_[t].padded / world_);
    const size_t server_scales =
        allgather(server_scales_.data(), all_server_scales_.data(), count_, Elem::F32, host_);
    std::vector<size_t> gathered(n);
    for (size_t p = 0; p < n; ++p) {
      server_pack(pieces[p]);
      gathered[p] = allgather(server_bits_ + pieces[p].begin, send_ + world_ * pieces[p].begin,
                              size_t(pieces[p].bytes), Elem::U8, car_.mem_);
    }

    // F1/F2 in piece order as the pieces arrive, each after its W3.
    for (size_t p = 0; p < n; ++p) {
      while (!(transfers_.ready(server_scales) && transfers_.ready(gathered[p])) && update_errors()) {
      }
      while (updated_ <= p) update_errors();
      transfers_.wait(server_scales);
      transfers_.wait(gathered[p]);
      decode(pieces[p], send_, all_server_scales_.data());
    }
    car_.result_scales_ = all_server_scales_;
  }

  // Phase 1 alone (CompressedAllreduce::reduce_scatter), with every
  // piece's W3.
  void run_reduce_scatter() {
    phase_one();
    while (update_errors()) {
    }
  }

  // F1/F2 write out[t] instead of x[t].
  void set_output(float* const* out) {
    for (size_t t = 0; t < count_; ++t) decoded_[t].x = out[t];
  }

  // F1/F2 of a result that is already here (CompressedAllreduce::decode_result).
  void decode_all(const uint8_t* codes, const float* scales) {
    for (const CarPiece& piece : car_.pieces_) decode(piece, codes, scales);
  }

 private:
  // Phase 1: W1/W2, W4/W5 and A1 piece by piece, then the blocks the
  // pieces cut; A2; S1/S2 in piece order as the pieces arrive (W3 of the
  // pieces while they travel).
  void phase_one() {
    const std::vector<CarPiece>& pieces = car_.pieces_;
    const size_t n = pieces.size();
    std::vector<size_t> sent(n);
    for (size_t p = 0; p < n; ++p) {
      signs(pieces[p]);
      sent[p] = alltoall(send_ + world_ * pieces[p].begin, recv_ + world_ * pieces[p].begin,
                         size_t(pieces[p].bytes));
    }
    sum_cut_blocks();
    for (size_t t = 0; t < count_; ++t) {
      const double sumsq = in_order(worker_sums_.data() + first_block_[t], first_block_[t + 1] - first_block_[t]);
      scales_[t] = rms_scale(sumsq, car_.tensors_[t].padded);
    }
    const size_t worker_scales = allgather(scales_.data(), all_scales_.data(), count_, Elem::F32, host_);
    for (size_t p = 0; p < n; ++p) {
      while (!(transfers_.ready(worker_scales) && transfers_.ready(sent[p])) && update_errors()) {
      }
      transfers_.wait(worker_scales);
      transfers_.wait(sent[p]);
      sum(pieces[p]);
    }
  }

  // The call's collectives: started and left in flight with several
  // pieces; with one there is nothing to overlap, and MPI's blocking
  // collectives finish sooner than its nonblocking ones.
  size_t alltoall(const uint8_t* send, uint8_t* recv, size_t bytes) {
    if (car_.pieces_.size() > 1)
      return transfers_.add(car_.comm_.start_alltoall(send, recv, bytes, Elem::U8, car_.mem_));
    car_.comm_.alltoall(send, recv, bytes, Elem::U8, car_.mem_);
    return transfers_.add(nullptr);
  }
  size_t allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) {
    if (car_.pieces_.size() > 1) return transfers_.add(car_.comm_.start_allgather(send, recv, count, e, mem));
    car_.comm_.allgather(send, recv, count, e, mem);
    return transfers_.add(nullptr);
  }

  // W1/W2 and W4/W5 for one piece: its signs to send_; the sums of the
  // worker blocks it covers whole.
  void signs(const CarPiece& piece) {
    const CarViews v = car_sign_views(car_.tensors_, world_, piece, send_ + world_ * piece.begin);
    std::vector<double> sums(v.views.size());
    in_slices(v, [&](size_t first, size_t count) {
      k_.car_worker_sumsq(v.views.data() + first, int64_t(count), sums.data() + first);
    });
    for (size_t k = 0; k < sums.size(); ++k)
      if (v.block[k] >= 0) record(size_t(v.tensor[k]), v.block[k], sums[k]);
  }

  // W1/W2 of the worker blocks no piece covered whole.
  void sum_cut_blocks() {
    std::vector<CarTensor> views;
    std::vector<std::pair<size_t, int64_t>> at;  // tensor, block
    for (size_t t = 0; t < count_; ++t) {
      const CarTensor& tensor = car_.tensors_[t];
      for (int64_t b = 0; b < first_block_[t + 1] - first_block_[t]; ++b) {
        if (summed_[size_t(first_block_[t] + b)]) continue;
        const int64_t begin = b * kSumBlock;
        views.push_back(car_worker_range(tensor, begin, std::min(tensor.padded - begin, kSumBlock)));
        at.emplace_back(t, b);
      }
    }
    std::vector<double> sums(views.size());
    k_.car_worker_sumsq(views.data(), int64_t(views.size()), sums.data());
    for (size_t k = 0; k < sums.size(); ++k) record(at[k].first, at[k].second, sums[k]);
  }

  void record(size_t tensor, int64_t block, double sum) {
    const size_t i = size_t(first_block_[tensor] + block);
    worker_sums_[i] = sum;
    summed_[i] = true;
  }

  // W3 of the next piece; false when all are done or it cannot run yet.
  // Its signs come out again: to discard_, or with one piece (no discard_)
  // over the ones it received, once they are averaged.
  bool update_errors() {
    const std::vector<CarPiece>& pieces = car_.pieces_;
    if (updated_ == pieces.size()) return false;
    const CarPiece& piece = pieces[updated_];
    auto* out = static_cast<uint8_t*>(car_.discard_.get());
    if (out == nullptr) {
      if (averaged_ <= updated_) return false;
      out = recv_ + world_ * piece.begin;
    }
    ++updated_;
    const CarViews v = car_worker_views(car_.tensors_, world_, piece);
    const std::vector<float> s = per_view(v, scales_.data(), 0);
    in_slices(v, [&](size_t first, size_t count) {
      k_.car_worker_pack(v.views.data() + first, int64_t(count), 1, s.data() + first, out, piece.bytes);
    });
    return true;
  }

  // S1/S2 for one piece; its block sums are appended.
  void sum(const CarPiece& piece) {
    const CarViews v = car_block_views(car_.tensors_, world_, piece);
    const size_t views = v.views.size();
    const float inv_world = 1.0f / float(world_);
    std::vector<float> weights(size_t(world_) * views);
    for (int i = 0; i < world_; ++i)
      for (size_t k = 0; k < views; ++k)
        weights[size_t(i) * views + k] = all_scales_[size_t(i) * count_ + size_t(v.tensor[k])] * inv_world;
    const size_t first = block_sums_.size();
    block_sums_.resize(first + views);
    block_tensor_.insert(block_tensor_.end(), v.tensor.begin(), v.tensor.end());
    k_.car_server_sum(v.views.data(), int64_t(views), world_, recv_ + world_ * piece.begin, piece.bytes,
                      weights.data(), block_sums_.data() + first);
    ++averaged_;
    transfers_.poll();
  }

  // S4/S5 for one piece, into the message at server_bits_.
  void server_pack(const CarPiece& piece) {
    const CarViews v = car_server_views(car_.tensors_, piece);
    const std::vector<float> s = per_view(v, server_scales_.data(), 0);
    k_.car_server_pack(v.views.data(), int64_t(v.views.size()), 1, s.data(), server_bits_);
    transfers_.poll();
  }

  // F1/F2 for one piece: the gathered signs at codes (message layout),
  // the server scales rank-major.
  void decode(const CarPiece& piece, const uint8_t* codes, const float* scales) {
    const CarViews v = car_worker_views(decoded_, world_, piece);
    const std::vector<float> s = per_view(v, scales, count_);
    const uint8_t* in = codes + world_ * piece.begin;
    in_slices(v, [&](size_t first, size_t count) {
      k_.car_decode(v.views.data() + first, int64_t(count), 1, in, piece.bytes, s.data() + first);
    });
  }

  // table[rank * stride + tensor] for every view (stride 0: per tensor only).
  static std::vector<float> per_view(const CarViews& v, const float* table, size_t stride) {
    std::vector<float> out(v.views.size());
    for (size_t k = 0; k < out.size(); ++k)
      out[k] = table[(v.rank.empty() ? 0 : size_t(v.rank[k])) * stride + size_t(v.tensor[k])];
    return out;
  }

  // fn(first, count) over consecutive views of about kPollElements elements
  // together, polling the transfers after each. With one piece there is
  // nothing in flight to poll: one call (one wake-up of the kernel threads).
  template <class Fn>
  void in_slices(const CarViews& v, Fn fn) {
    if (car_.pieces_.size() <= 1) {
      if (!v.views.empty()) fn(0, v.views.size());
      return;
    }
    size_t first = 0;
    int64_t elements = 0;
    for (size_t k = 0; k < v.views.size(); ++k) {
      elements += v.views[k].padded;
      if (elements < kPollElements && k + 1 < v.views.size()) continue;
      fn(first, k + 1 - first);
      transfers_.poll();
      first = k + 1;
      elements = 0;
    }
  }

  CompressedAllreduce& car_;
  Kernels& k_;
  const int world_;
  const size_t count_;
  const Mem host_;
  uint8_t* send_;
  uint8_t* recv_;
  uint8_t* server_bits_;
  std::vector<float> scales_, all_scales_, server_scales_, all_server_scales_;
  std::vector<int64_t> first_block_;  // each tensor's first worker block
  std::vector<double> worker_sums_;   // one per worker block
  std::vector<bool> summed_;
  std::vector<double> block_sums_;     // server sums of squares, one per block, message order
  std::vector<int64_t> block_tensor_;  // the tensor of each
  size_t averaged_ = 0;                // pieces whose server sums are done
  size_t updated_ = 0;                 // pieces whose worker errors are updated
  Transfers transfers_;
  std::vector<CarTensor> decoded_;  // the tensors as F1/F2 write them: x, or the caller's output
};

void CompressedAllreduce::run(float* const* x, float* const* out) {
  if (world_ == 1) {  // C5: identity
    if (out)
      for (int64_t t = 0; t < count(); ++t) {
        const TensorRef in{x[t], tensors_[size_t(t)].n, DType::F32};
        if (out[t] != x[t]) kernels_.transform(&in, 1, 1.0f, out[t], nullptr);
      }
    return;
  }
  for (int64_t t = 0; t < count(); ++t) tensors_[size_t(t)].x = x[t];
  Call call(*this);
  if (out) call.set_output(out);
  call.run();
}

void CompressedAllreduce::reduce_scatter(float* const* x) {
  for (int64_t t = 0; t < count(); ++t) tensors_[size_t(t)].x = x[t];
  if (world_ == 1) fail(DSOPT_EINTERNAL, "CompressedAllreduce::reduce_scatter on one rank");
  Call(*this).run_reduce_scatter();
}

void CompressedAllreduce::decode_result(const void* codes, const float* scales, float* const* x) {
  if (world_ == 1) return;
  for (int64_t t = 0; t < count(); ++t) tensors_[size_t(t)].x = x[t];
  Call(*this).decode_all(static_cast<const uint8_t*>(codes), scales);
}

}  // namespace dsopt

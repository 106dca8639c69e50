#include "comm/compressed_allreduce.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.hpp"
#include "comm/transfers.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace {

// DECISIONS C3: s = fl(fl(sqrt(sum_sq)) / fl(sqrt(double(len)))).
float rms_scale(double sum_squares, int64_t len) {
  return float(std::sqrt(sum_squares)) / float(std::sqrt(double(len)));
}

// Automatic pieces: at least kMinPieceBlocks sum blocks (32 KB of bits per
// rank), at most kMaxPieces per call.
constexpr int64_t kMinPieceBlocks = 64;
constexpr int64_t kMaxPieces = 32;
// Elements of work between two polls of the transfers (about a millisecond).
constexpr int64_t kPollElements = int64_t(1) << 18;

}  // namespace

int64_t CompressedAllreduce::padded_length(int64_t n, int world) {
  const int64_t divider = int64_t(8) * world / std::gcd(int64_t(world), int64_t(8));
  const int64_t unit = int64_t(world) * divider;
  return n % unit == 0 ? n : n + unit - n % unit;
}

CompressedAllreduce::CompressedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem,
                                         std::vector<int64_t> sizes, int64_t piece_blocks)
    : comm_(comm), kernels_(kernels), mem_(mem), host_(make_cpu_kernels(1)), world_(comm.size()) {
  int64_t offset = 0;
  for (int64_t n : sizes) {
    const int64_t padded = padded_length(n, world_);
    tensors_.push_back(CarTensor{nullptr, n, padded, nullptr, nullptr, offset});
    offset += padded / world_ / 8;
    worker_numel_ += padded;
  }
  msg_bytes_ = offset;
  worker_error_ = DeviceBuffer(kernels_, size_t(worker_numel_) * 4);
  server_error_ = DeviceBuffer(kernels_, size_t(worker_numel_ / world_) * 4);
  int64_t w = 0;
  for (CarTensor& t : tensors_) {
    t.worker_error = worker_error_.floats() + w;
    t.server_error = server_error_.floats() + w / world_;
    w += t.padded;
  }
  reset_errors();
  if (world_ > 1) {
    send_ = DeviceBuffer(kernels_, size_t(msg_bytes_) * size_t(world_));
    recv_ = DeviceBuffer(kernels_, size_t(msg_bytes_) * size_t(world_));
    server_bits_ = DeviceBuffer(kernels_, size_t(msg_bytes_));
    int64_t blocks = 0;
    for (const CarTensor& t : tensors_) blocks += sum_blocks(t.padded / world_);
    if (piece_blocks <= 0)
      piece_blocks = comm.overlaps(mem) ? std::max(kMinPieceBlocks, (blocks + kMaxPieces - 1) / kMaxPieces)
                                        : std::max<int64_t>(blocks, 1);
    pieces_ = car_pieces(tensors_, world_, piece_blocks);
  }
}

void CompressedAllreduce::reset_errors() {
  kernels_.fill_zero(worker_error_.get(), worker_error_.bytes());
  kernels_.fill_zero(server_error_.get(), server_error_.bytes());
}

// One run(): the state of its pieces in flight.
class CompressedAllreduce::Call {
 public:
  explicit Call(CompressedAllreduce& car)
      : car_(car), world_(car.world_), count_(size_t(car.count())), host_{car.host_.get(), false},
        send_(static_cast<uint8_t*>(car.send_.get())), recv_(static_cast<uint8_t*>(car.recv_.get())),
        server_bits_(static_cast<uint8_t*>(car.server_bits_.get())), scales_(count_),
        all_scales_(count_ * size_t(world_)), server_scales_(count_), all_server_scales_(count_ * size_t(world_)) {}

  void run() {
    const std::vector<CarPiece>& pieces = car_.pieces_;
    const size_t n = pieces.size();
    Comm& comm = car_.comm_;
    // W1/W2 over whole tensors: a scale needs every element.
    std::vector<double> sumsq(count_);
    car_.kernels_.car_worker_sumsq(car_.tensors_.data(), int64_t(count_), sumsq.data());
    for (size_t t = 0; t < count_; ++t) scales_[t] = rms_scale(sumsq[t], car_.tensors_[t].padded);
    const size_t worker_scales = transfers_.add(
        comm.start_allgather(scales_.data(), all_scales_.data(), count_, Elem::F32, host_));

    // Phase 1: compress and send piece after piece; average (S1/S2) the
    // pieces that arrived meanwhile, in order.
    std::vector<size_t> sent(n);
    size_t summed = 0;
    for (size_t p = 0; p < n; ++p) {
      pack(pieces[p]);
      sent[p] = transfers_.add(comm.start_alltoall(send_ + world_ * pieces[p].begin,
                                                   recv_ + world_ * pieces[p].begin,
                                                   size_t(pieces[p].bytes), Elem::U8, car_.mem_));
      while (summed < p && transfers_.ready(worker_scales) && transfers_.ready(sent[summed]))
        sum(pieces[summed++]);
    }
    transfers_.wait(worker_scales);
    for (; summed < n; ++summed) {
      transfers_.wait(sent[summed]);
      sum(pieces[summed]);
    }

    // S3, from the block sums in block order; phase 2 piece after piece
    // (server_bits_ holds the message, send_ receives the pieces).
    std::vector<double> server_sumsq(count_, 0.0);
    for (size_t b = 0; b < block_sums_.size(); ++b) server_sumsq[size_t(block_tensor_[b])] += block_sums_[b];
    for (size_t t = 0; t < count_; ++t)
      server_scales_[t] = rms_scale(server_sumsq[t], car_.tensors_[t].padded / world_);
    const size_t server_scales = transfers_.add(comm.start_allgather(
        server_scales_.data(), all_server_scales_.data(), count_, Elem::F32, host_));
    std::vector<size_t> gathered(n);
    size_t decoded = 0;
    for (size_t p = 0; p < n; ++p) {
      server_pack(pieces[p]);
      gathered[p] = transfers_.add(comm.start_allgather(server_bits_ + pieces[p].begin,
                                                        send_ + world_ * pieces[p].begin,
                                                        size_t(pieces[p].bytes), Elem::U8, car_.mem_));
      while (decoded < p && transfers_.ready(server_scales) && transfers_.ready(gathered[decoded]))
        decode(pieces[decoded++]);
    }
    transfers_.wait(server_scales);
    for (; decoded < n; ++decoded) {
      transfers_.wait(gathered[decoded]);
      decode(pieces[decoded]);
    }
  }

 private:
  // W3-W6 for one piece.
  void pack(const CarPiece& piece) {
    const CarViews v = car_worker_views(car_.tensors_, world_, piece);
    const std::vector<float> s = per_view(v, scales_, 0);
    uint8_t* out = send_ + world_ * piece.begin;
    in_slices(v, [&](size_t first, size_t count) {
      car_.kernels_.car_worker_pack(v.views.data() + first, int64_t(count), 1, s.data() + first, out,
                                    piece.bytes);
    });
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
    car_.kernels_.car_server_sum(v.views.data(), int64_t(views), world_, recv_ + world_ * piece.begin,
                                 piece.bytes, weights.data(), block_sums_.data() + first);
    transfers_.poll();
  }

  // S4/S5 for one piece, into the message at server_bits_.
  void server_pack(const CarPiece& piece) {
    const CarViews v = car_server_views(car_.tensors_, piece);
    const std::vector<float> s = per_view(v, server_scales_, 0);
    car_.kernels_.car_server_pack(v.views.data(), int64_t(v.views.size()), 1, s.data(), server_bits_);
    transfers_.poll();
  }

  // F1/F2 for one piece.
  void decode(const CarPiece& piece) {
    const CarViews v = car_worker_views(car_.tensors_, world_, piece);
    const std::vector<float> s = per_view(v, all_server_scales_, count_);
    const uint8_t* in = send_ + world_ * piece.begin;
    in_slices(v, [&](size_t first, size_t count) {
      car_.kernels_.car_decode(v.views.data() + first, int64_t(count), 1, in, piece.bytes, s.data() + first);
    });
  }

  // table[rank * stride + tensor] for every view (stride 0: per tensor only).
  static std::vector<float> per_view(const CarViews& v, const std::vector<float>& table, size_t stride) {
    std::vector<float> out(v.views.size());
    for (size_t k = 0; k < out.size(); ++k)
      out[k] = table[(v.rank.empty() ? 0 : size_t(v.rank[k])) * stride + size_t(v.tensor[k])];
    return out;
  }

  // fn(first, count) over consecutive views of about kPollElements elements
  // together, polling the transfers after each.
  template <class Fn>
  void in_slices(const CarViews& v, Fn fn) {
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
  const int world_;
  const size_t count_;
  const Mem host_;
  uint8_t* send_;
  uint8_t* recv_;
  uint8_t* server_bits_;
  std::vector<float> scales_, all_scales_, server_scales_, all_server_scales_;
  std::vector<double> block_sums_;     // server sums of squares, one per block, message order
  std::vector<int64_t> block_tensor_;  // the tensor of each
  Transfers transfers_;
};

void CompressedAllreduce::run(float* const* x) {
  if (world_ == 1) return;  // C5: identity
  for (int64_t t = 0; t < count(); ++t) tensors_[size_t(t)].x = x[t];
  Call(*this).run();
}

}  // namespace dsopt

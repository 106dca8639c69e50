#include "comm/car_pieces.hpp"

#include <algorithm>

#include "math/sum_squares.hpp"

namespace dsopt {

std::vector<CarPiece> car_pieces(const std::vector<CarTensor>& tensors, int world, int64_t blocks) {
  std::vector<CarPiece> pieces;
  CarPiece piece{0, 0, {}};
  int64_t in_piece = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int64_t c = tensors[t].padded / world;
    for (int64_t b = 0; b < c; b += kSumBlock) {
      const int64_t e = std::min(c, b + kSumBlock);
      std::vector<CarSegment>& s = piece.segments;
      if (!s.empty() && s.back().tensor == int64_t(t))
        s.back().end = e;
      else
        s.push_back(CarSegment{int64_t(t), b, e, piece.bytes});
      piece.bytes += (e - b) / 8;
      if (++in_piece == blocks) {
        const int64_t next = piece.begin + piece.bytes;
        pieces.push_back(std::move(piece));
        piece = CarPiece{next, 0, {}};
        in_piece = 0;
      }
    }
  }
  if (in_piece > 0) pieces.push_back(std::move(piece));
  return pieces;
}

CarTensor car_worker_range(const CarTensor& t, int64_t begin, int64_t len) {
  const int64_t n = std::clamp<int64_t>(t.n - begin, 0, len);  // the rest is padding
  return CarTensor{n > 0 ? t.x + begin : t.x, n, len, t.worker_error + begin, nullptr, 0};
}

CarViews car_worker_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece) {
  CarViews v;
  for (const CarSegment& s : piece.segments) {
    const CarTensor& t = tensors[size_t(s.tensor)];
    const int64_t c = t.padded / world;
    for (int j = 0; j < world; ++j) {
      v.views.push_back(car_worker_range(t, j * c + s.begin, s.end - s.begin));
      v.views.back().chunk_offset = j * piece.bytes + s.offset;
      v.tensor.push_back(s.tensor);
      v.rank.push_back(j);
    }
  }
  return v;
}

CarViews car_sign_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece,
                        uint8_t* bits) {
  CarViews v;
  for (const CarSegment& s : piece.segments) {
    const CarTensor& t = tensors[size_t(s.tensor)];
    const int64_t c = t.padded / world;
    for (int j = 0; j < world; ++j) {
      const int64_t first = j * c + s.begin, last = j * c + s.end;
      for (int64_t w = first; w < last;) {
        const int64_t block = w / kSumBlock;
        const int64_t stop = std::min(last, (block + 1) * kSumBlock);
        const bool whole = w == block * kSumBlock && stop == std::min(t.padded, (block + 1) * kSumBlock);
        v.views.push_back(car_worker_range(t, w, stop - w));
        v.views.back().chunk_offset = j * piece.bytes + s.offset + (w - first) / 8;
        v.views.back().bits = bits;
        v.tensor.push_back(s.tensor);
        v.block.push_back(whole ? block : -1);
        w = stop;
      }
    }
  }
  return v;
}

CarViews car_block_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece) {
  CarViews v;
  for (const CarSegment& s : piece.segments) {
    const CarTensor& t = tensors[size_t(s.tensor)];
    for (int64_t b = s.begin; b < s.end; b += kSumBlock) {
      const int64_t len = std::min(s.end, b + kSumBlock) - b;
      v.views.push_back(CarTensor{nullptr, 0, len * world, nullptr, t.server_error + b,
                                  s.offset + (b - s.begin) / 8});
      v.tensor.push_back(s.tensor);
    }
  }
  return v;
}

CarViews car_server_views(const std::vector<CarTensor>& tensors, const CarPiece& piece) {
  CarViews v;
  for (const CarSegment& s : piece.segments) {
    const CarTensor& t = tensors[size_t(s.tensor)];
    v.views.push_back(CarTensor{nullptr, 0, s.end - s.begin, nullptr, t.server_error + s.begin,
                                t.chunk_offset + s.begin / 8});
    v.tensor.push_back(s.tensor);
  }
  return v;
}

}  // namespace dsopt

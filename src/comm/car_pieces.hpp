// How one call of the compressed allreduce is cut into pieces, so that the
// transfer of one piece overlaps the arithmetic of the next
// (compressed_allreduce.cpp).
//
// Every rank's message (each tensor's chunk bits back to back in tensor
// order, docs/design/compressed-allreduce.md section 5) is cut into consecutive byte
// ranges, the pieces, at sum-block boundaries of the chunks
// (math/sum_squares.hpp): a server chunk's sum of squares then adds the
// same block sums in the same order whatever the cut. On the wire, piece
// [begin, begin + bytes) of the message is P blocks of `bytes`: the one for
// (or from) rank j at P * begin + j * bytes of the send (receive) buffer.
// With one piece this is the message layout itself.
//
// The Kernels' car_* primitives run over whole tensors; a piece hands them
// views: CarTensor descriptors of parts of tensors whose pointers and byte
// offsets make the primitives touch exactly the piece's elements and bits.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"

namespace dsopt {

// Chunk elements [begin, end) of one tensor inside a piece; its bits start
// at byte `offset` of the piece's block.
struct CarSegment {
  int64_t tensor;
  int64_t begin, end;
  int64_t offset;
};

struct CarPiece {
  int64_t begin, bytes;  // message bytes [begin, begin + bytes)
  std::vector<CarSegment> segments;
};

// Pieces of `blocks` sum blocks each (the last one may have fewer).
std::vector<CarPiece> car_pieces(const std::vector<CarTensor>& tensors, int world, int64_t blocks);

// Descriptors for one primitive over one piece, with the tensor each one
// belongs to (for per-tensor scales and weights).
struct CarViews {
  std::vector<CarTensor> views;
  std::vector<int64_t> tensor;
  std::vector<int32_t> rank;   // worker and decode views: the chunk's rank j
  std::vector<int64_t> block;  // sign views: the worker sum block covered whole, or -1
};

// Elements [begin, begin + len) of t's x and e_w as a tensor of its own
// (padded length len; x where t has values).
CarTensor car_worker_range(const CarTensor& t, int64_t begin, int64_t len);

// Worker pack and decode (run with world 1): for every segment and rank j,
// elements j*c + [begin, end) of x and e_w, bits at j * bytes + offset.
CarViews car_worker_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece);
// Worker sums with signs (run with bits = the piece's send buffer): the
// worker views cut at worker sum-block boundaries, so a view that covers a
// whole block gives that block's sum of squares.
CarViews car_sign_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece,
                        uint8_t* bits);
// Server sum (run with world P and msg_bytes = piece.bytes): one view per
// sum block, so each view's sum of squares is one block sum.
CarViews car_block_views(const std::vector<CarTensor>& tensors, int world, const CarPiece& piece);
// Server pack (run with world 1): e_s of each segment, bits at the
// message offset of its chunk elements.
CarViews car_server_views(const std::vector<CarTensor>& tensors, const CarPiece& piece);

}  // namespace dsopt

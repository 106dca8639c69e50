// The blob's hyper section (common.hyper): per group, the algorithm's
// hyperparameters other than lr (common.lr holds it), in the order of its
// descriptor (Algorithm::hyper), as 8-byte doubles. For Adam, AdamW, LAMB
// and the 1-bit optimizers: beta1, beta2, eps, weight_decay. Blobs written
// before the section followed the descriptor hold those four for every
// algorithm (Lion's with an unused eps); a section of that size, when it is
// not the descriptor's, is read by name and its other values ignored.
#pragma once
#include <cstdint>
#include <vector>

#include "math/adam.hpp"
#include "optim/hyper_params.hpp"
#include "state/blob.hpp"

namespace dsopt {

// The section's values for `groups`.
std::vector<double> hyper_section_values(const std::vector<HyperParam>& params,
                                         const std::vector<AdamHyper>& groups);
// Throws Error(DSOPT_ECORRUPT) unless `size` bytes are a section of
// `count` groups in the descriptor's layout or the earlier one.
void check_hyper_section_size(const std::vector<HyperParam>& params, uint64_t count, uint64_t size);
// `groups` with the values of a section of `size` bytes, checked first: its
// size, and every value it holds in range (Error(DSOPT_ECORRUPT) otherwise).
std::vector<AdamHyper> read_hyper_values(const std::vector<HyperParam>& params, const uint8_t* bytes,
                                         uint64_t size, const std::vector<AdamHyper>& groups);

// The section's length for `count` groups: the descriptor's layout
// (blob nullptr), or the layout blob r holds when its section has the
// earlier layout's size (the descriptor's otherwise; check_hyper_section_size
// reports a size of neither).
uint64_t hyper_section_bytes(const std::vector<HyperParam>& params, uint64_t count,
                             const BlobReader* r);

}  // namespace dsopt

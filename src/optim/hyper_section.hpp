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
// `groups` with the values of a section of `size` bytes, checked first: its
// size, and every value it holds in range (Error(DSOPT_ECORRUPT) otherwise).
std::vector<AdamHyper> read_hyper_values(const std::vector<HyperParam>& params, const uint8_t* bytes,
                                         uint64_t size, const std::vector<AdamHyper>& groups);

// The section of a blob.
void write_hyper_section(BlobWriter& w, const std::vector<HyperParam>& params,
                         const std::vector<AdamHyper>& groups);
// read_hyper_values on a blob's section; `groups` as they are for a blob
// without it (an earlier layout).
std::vector<AdamHyper> read_hyper_section(const BlobReader& r, const std::vector<HyperParam>& params,
                                          const std::vector<AdamHyper>& groups);

}  // namespace dsopt

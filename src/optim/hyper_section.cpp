#include "optim/hyper_section.hpp"

#include <cstring>
#include <string>

#include "base/error.hpp"
#include "state/section_names.hpp"

namespace dsopt {
namespace {

// The layout of every blob before the section followed the descriptor.
const std::vector<std::string> kEarlierLayout = {"beta1", "beta2", "eps", "weight_decay"};

// The descriptor's layout: its names other than lr.
std::vector<std::string> layout(const std::vector<HyperParam>& params) {
  std::vector<std::string> names;
  for (const HyperParam& p : params)
    if (p.name != kLrName) names.push_back(p.name);
  return names;
}

// The names a section of `size` bytes holds per group, for `count` groups.
std::vector<std::string> section_names(const std::vector<HyperParam>& params, uint64_t count,
                                       uint64_t size) {
  const std::vector<std::string> names = layout(params);
  if (size == count * names.size() * 8) return names;
  if (size == count * kEarlierLayout.size() * 8) return kEarlierLayout;
  fail(DSOPT_ECORRUPT, "state blob: section '" + std::string(kHyperSection) + "' is " +
                           std::to_string(size) + " bytes; " + std::to_string(count) + " groups of " +
                           std::to_string(names.size()) +
                           " hyperparameters (or of the earlier layout's 4) need " +
                           std::to_string(count * names.size() * 8));
}

}  // namespace

std::vector<double> hyper_section_values(const std::vector<HyperParam>& params,
                                         const std::vector<AdamHyper>& groups) {
  std::vector<double> values;
  for (const AdamHyper& h : groups)
    for (const std::string& name : layout(params)) values.push_back(find_hyper(params, name)->get(h));
  return values;
}

void check_hyper_section_size(const std::vector<HyperParam>& params, uint64_t count, uint64_t size) {
  section_names(params, count, size);
}

std::vector<AdamHyper> read_hyper_values(const std::vector<HyperParam>& params, const uint8_t* bytes,
                                         uint64_t size, const std::vector<AdamHyper>& groups) {
  const uint64_t count = groups.size();
  const std::vector<std::string> names = section_names(params, count, size);
  std::vector<AdamHyper> out = groups;
  for (uint64_t g = 0; g < count; ++g) {
    for (size_t i = 0; i < names.size(); ++i) {
      const HyperParam* p = find_hyper(params, names[i]);
      if (!p || p->name == kLrName) continue;  // the earlier layout's eps of an algorithm without it
      double v;
      std::memcpy(&v, bytes + (g * names.size() + i) * 8, 8);
      const std::string why = hyper_value_error(*p, v);
      if (!why.empty())
        fail(DSOPT_ECORRUPT, "state blob: " + p->name + " of group " + std::to_string(g) + " " + why);
      p->set(out[g], v);
    }
  }
  return out;
}

uint64_t hyper_section_bytes(const std::vector<HyperParam>& params, uint64_t count,
                             const BlobReader* r) {
  const uint64_t bytes = count * layout(params).size() * 8;
  if (!r || !r->has(kHyperSection)) return bytes;
  const uint64_t earlier = count * kEarlierLayout.size() * 8;
  return r->section_size(kHyperSection) == earlier ? earlier : bytes;
}

}  // namespace dsopt

#include "algorithms/registry.hpp"

#include <algorithm>
#include <cctype>

namespace dsopt {

// The descriptors, each defined in its algorithm's file here.
extern const Algorithm kAdamAlgorithm;
extern const Algorithm kAdamWAlgorithm;
extern const Algorithm kLambAlgorithm;
extern const Algorithm kOneBitAdamAlgorithm;
extern const Algorithm kOneBitLambAlgorithm;
extern const Algorithm kZeroOneAdamAlgorithm;
extern const Algorithm kLionAlgorithm;
extern const Algorithm kSgdAlgorithm;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

}  // namespace

const std::vector<const Algorithm*>& algorithms() {
  // The moment rules first: messages list them as "Lamb, Lion, Adam, AdamW and SGD".
  static const std::vector<const Algorithm*> all = {
      &kLambAlgorithm,       &kLionAlgorithm,       &kAdamAlgorithm,         &kAdamWAlgorithm,
      &kSgdAlgorithm,        &kOneBitAdamAlgorithm, &kOneBitLambAlgorithm,   &kZeroOneAdamAlgorithm,
  };
  return all;
}

const Algorithm* find_algorithm(const std::string& name) {
  const std::string wanted = lower(name);
  for (const Algorithm* a : algorithms()) {
    if (lower(a->type) == wanted) return a;
    for (const std::string& alias : a->aliases)
      if (lower(alias) == wanted) return a;
  }
  return nullptr;
}

std::string algorithm_types(bool (*has)(const Algorithm&)) {
  std::vector<std::string> names;
  for (const Algorithm* a : algorithms())
    if (has(*a)) names.push_back(a->type);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

}  // namespace dsopt

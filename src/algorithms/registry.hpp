// Every algorithm's descriptor (optim/algorithm.hpp), registered once in
// registry.cpp: one line per algorithm, its descriptor in its own file here
// (extern const, so that registry.cpp can name it).
#pragma once
#include <string>
#include <vector>

#include "optim/algorithm.hpp"

namespace dsopt {

// The descriptors, the moment rules first.
const std::vector<const Algorithm*>& algorithms();
// The algorithm whose type or alias is `name`, compared without case;
// nullptr when none is.
const Algorithm* find_algorithm(const std::string& name);
// The types of the algorithms for which `has` holds, as "A, B and C".
std::string algorithm_types(bool (*has)(const Algorithm&));

}  // namespace dsopt

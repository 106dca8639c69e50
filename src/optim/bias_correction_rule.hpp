// Whether a 1-bit optimizer's moments are bias-corrected is part of its
// state: a blob records the rule it was written with (one int32 section), and
// loading it continues with that rule. Blobs without the section were written
// before the rule existed, by runs without bias correction.
#pragma once
#include <cstdint>

#include "base/error.hpp"
#include "state/blob.hpp"

namespace dsopt {

inline void save_bias_correction(BlobWriter& w, const char* section, bool bias_correction) {
  const int32_t rule = bias_correction ? 1 : 0;
  w.section(section, &rule, 4);
}

// The saved rule; throws Error(DSOPT_ECORRUPT) on a value other than 0 or 1.
inline bool saved_bias_correction(const BlobReader& r, const char* section) {
  if (!r.has(section)) return false;
  FieldReader f(r.section(section, 4), 4);
  const int32_t rule = f.get<int32_t>();
  if (rule != 0 && rule != 1)
    fail(DSOPT_ECORRUPT, std::string("state blob: invalid bias-correction rule in ") + section);
  return rule == 1;
}

}  // namespace dsopt

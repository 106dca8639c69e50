// Rule choices a 1-bit optimizer's state depends on are part of that state:
// a blob records each as one int32 section (0 or 1), and loading it
// continues with the rule it was written with. Blobs without the section
// were written before the choice existed, by runs of the old rule (0):
//   onebit.rule / zoadam.rule    bias correction of both moments
//   onebit.units / zoadam.units  compression in the update's units (the
//                                error buffers hold values of x / d)
//   lamb.units                   the same for 1-bit LAMB, whose compression
//                                stage then also takes LAMB's trust ratio
#pragma once
#include <cstdint>
#include <string>

#include "base/error.hpp"
#include "state/blob.hpp"

namespace dsopt {

// The choices' names in messages.
inline constexpr const char* kBiasCorrectionRule = "bias-correction rule";
inline constexpr const char* kUnitsRule = "compression-units rule";

inline void save_rule_flag(BlobWriter& w, const char* section, bool on) {
  const int32_t flag = on ? 1 : 0;
  w.section(section, &flag, 4);
}

// The saved choice (false when the blob has no such section); throws
// Error(DSOPT_ECORRUPT) on a value other than 0 or 1.
// `what` names the choice in the message.
inline bool saved_rule_flag(const BlobReader& r, const char* section, const char* what) {
  if (!r.has(section)) return false;
  FieldReader f(r.section(section, 4), 4);
  const int32_t flag = f.get<int32_t>();
  if (flag != 0 && flag != 1) fail(DSOPT_ECORRUPT, std::string("state blob: invalid ") + what + " in " + section);
  return flag == 1;
}

}  // namespace dsopt

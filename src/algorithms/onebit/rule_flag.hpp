// Rule choices a 1-bit optimizer's state depends on are part of that state:
// a blob records each as one int32 section (0 or 1, StateSchema::flag), and
// loading it continues with the rule it was written with. Blobs without the
// section were written before the choice existed, by runs of the old rule
// (0):
//   onebit.rule / zoadam.rule    bias correction of both moments
//   onebit.units / zoadam.units  compression in the update's units (the
//                                error buffers hold values of x / d)
//   lamb.units                   the same for 1-bit LAMB, whose compression
//                                stage then also takes LAMB's trust ratio
#pragma once

namespace dsopt {

// The choices' names in messages.
inline constexpr const char* kBiasCorrectionRule = "bias-correction rule";
inline constexpr const char* kUnitsRule = "compression-units rule";

}  // namespace dsopt

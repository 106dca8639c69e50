#include "optim/call_handshake.hpp"

#include <string>

namespace dsopt {

bool CallHandshake::enter(Call call, bool absent, bool* someone_abandons) {
  comm_.prepare();
  comm_.set_timeout(timeout_s_);
  const int64_t mine = int64_t(call) << 48 | (calls_ & ((int64_t(1) << 48) - 1));
  ++calls_;
  const bool abandons = someone_abandons && *someone_abandons;
  if (comm_.size() == 1) return absent;
  bool someone_absent = false, abandoned = false;
  int64_t lowest = 0, highest = 0;
  if (agreement_.same_call(mine, absent, abandons, &someone_absent, &abandoned, &lowest,
                           &highest)) {
    if (someone_abandons) *someone_abandons = abandoned;
    return someone_absent;
  }
  const auto describe = [](int64_t tag) {
    static const char* const names[] = {"?", "dsopt_step", "dsopt_state_load",
                                        "dsopt_state_load_shards", "dsopt_grad_ready"};
    const int64_t op = tag >> 48;
    return std::string(op >= 1 && op <= 4 ? names[op] : "an unknown call") + " (collective call #" +
           std::to_string((tag & ((int64_t(1) << 48) - 1)) + 1) + " of this optimizer)";
  };
  RankAgreement::fail_different_calls(describe(mine), describe(lowest), describe(highest));
}

}  // namespace dsopt

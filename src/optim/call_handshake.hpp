// The handshake that starts each collective call of an optimizer: every rank
// says which call it is in and how many collective calls the optimizer has
// made (one 16-byte allreduce); ranks that disagree all fail with
// DSOPT_EMISMATCH before any other collective, so they cannot block in
// mismatched ones. The same allreduce carries two flags of the step.
#pragma once
#include <cstdint>

#include "comm/comm.hpp"
#include "comm/rank_agreement.hpp"

namespace dsopt {

class CallHandshake {
 public:
  // The collective dsopt calls.
  enum class Call : int64_t { Step = 1, Load = 2, LoadShards = 3, GradReady = 4 };

  // `timeout_s`: the config's, handed to the comm at each call.
  CallHandshake(Comm& comm, RankAgreement& agreement, double timeout_s)
      : comm_(comm), agreement_(agreement), timeout_s_(timeout_s) {}

  // Enters `call`. `absent`: this rank has absent gradients; returns
  // whether some rank has. `someone_abandons` (optional): in, whether this
  // rank abandons the step; out, whether some rank does.
  bool enter(Call call, bool absent = false, bool* someone_abandons = nullptr);

 private:
  Comm& comm_;
  RankAgreement& agreement_;
  double timeout_s_;
  int64_t calls_ = 0;  // collective calls made
};

}  // namespace dsopt

// The ranks that hold the other shards of an optimizer's parameters
// (dsopt_comm_set_shards; docs/reference/c-api.md "Sharded parameters"):
// what whole tensors decide is reduced over them, one small allreduce per
// use, whatever the tensor count. Inactive (every call a no-op returning
// its input) when the communicator has no shard communicator of more than
// one rank.
#pragma once
#include <vector>

#include "comm/comm.hpp"
#include "comm/rank_agreement.hpp"

namespace dsopt {

class ShardGroup {
 public:
  // The shard communicator of `comm` as it is now (borrowed).
  explicit ShardGroup(Comm& comm);

  bool active() const { return shards_ != nullptr; }
  // The shard communicator, prepared for a collective (Comm::prepare, with
  // the timeout of the communicator it was given to); nullptr when inactive.
  Comm* comm() const;

  // Collective over the shard group: every rank's values added (Sum) or
  // their maximum (Max), element by element, in place.
  void sum(std::vector<double>& values) const;
  void max(std::vector<float>& values) const;

  // Collective: the step's status over the shard group, as
  // RankAgreement::settle_sum settles it over a communicator (fails the step
  // on every rank of the group when one rank's part failed). Returns
  // whether some rank found a non-finite value; *sum becomes the sum over
  // the shard group.
  bool settle_step(const LocalOutcome& mine, bool nonfinite, double* sum) const;

  // Collective: `mine` when it failed or every rank of the shard group could
  // take its gradients, else DSOPT_EMISMATCH saying that another rank of
  // the group could not (so that the ranks of `comm`, each in its own shard
  // group, all fail the step together where any of them did).
  LocalOutcome agree_valid(const LocalOutcome& mine) const;

 private:
  Comm& main_;
  Comm* shards_;
};

}  // namespace dsopt

#include "facade/creation.hpp"

#include <zlib.h>

#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/rank_agreement.hpp"
#include "kernels/cpu/thread_budget.hpp"
#include "optim/shard_group.hpp"

namespace dsopt {
namespace {

uint64_t hash64(const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  const uint64_t crc = crc32_z(crc32_z(0L, Z_NULL, 0), p, n);
  const uint64_t adler = adler32_z(adler32_z(0L, Z_NULL, 0), p, n);
  return crc << 32 | adler;
}

uint64_t hash64(const std::string& s) { return hash64(s.data(), s.size()); }

uint64_t shapes_hash(const dsopt_tensor* params, int64_t count) {
  std::string s;
  for (int64_t i = 0; i < count; ++i) {
    const dsopt_tensor& t = params[i];
    s.append(reinterpret_cast<const char*>(&t.numel), 8);
    s.append(reinterpret_cast<const char*>(&t.dtype), 4);
    s.append(reinterpret_cast<const char*>(&t.group), 4);
  }
  return hash64(s.data(), s.size());
}

// What the ranks compare, one row per rank.
enum Field { kConfig, kShapes, kRunId, kMachine, kCores };

// Fails unless every rank built its optimizer with the same config and
// shapes. Returns rank 0's run id and the ranks on this rank's machine and
// cores, itself included.
std::pair<uint64_t, int> agree(Comm& comm, const LocalOutcome& mine, const std::vector<int64_t>& row) {
  RankAgreement agreement(comm, Mem::host());
  const std::vector<std::vector<int64_t>> all =
      agreement.gather(Failure{"dsopt_create", "could not create its optimizer"}, mine, row);
  RankAgreement::require_same(
      "dsopt_create", all,
      {{kConfig, "the config", "passed different settings"},
       {kShapes, "the parameters", "passed different numel, dtype or group"}});
  int cpu_peers = 0;
  for (const std::vector<int64_t>& r : all)
    cpu_peers += r[kMachine] == row[kMachine] && r[kCores] == row[kCores];
  return {uint64_t(all[0][kRunId]), cpu_peers};
}

// ZeRO shards the state of whole parameters over comm; parameters that are
// shards already (dsopt_comm_set_shards) have their state sharded with
// them.
void refuse_zero_on_shards(const OptimizerConfig& cfg, const ShardGroup& shards) {
  if (shards.active() && cfg.zero.stage > 0)
    fail(DSOPT_EUNSUPPORTED,
         "zero_optimization.stage " + std::to_string(cfg.zero.stage) +
             " on a communicator with sharded parameters (dsopt_comm_set_shards): the parameters "
             "are shards already, and each rank keeps the state of its own shards; use stage 0");
}

// Over the shard group (dsopt_comm_set_shards), before the ranks of comm
// agree: the same config and parameter count (the shards' numel may
// differ). Returns this rank's outcome as comm's agreement is to see it
// (a failure of any rank of the shard group fails this rank too, so that
// every rank of comm and of every shard group fails together), and sets
// *cpu_peers to the ranks of the group on this rank's machine and cores.
LocalOutcome agree_over_shards(const ShardGroup& shards, const LocalOutcome& mine,
                               const std::vector<int64_t>& row, int* cpu_peers) {
  *cpu_peers = 1;
  if (!shards.active()) return mine;
  return attempt([&] {
    RankAgreement agreement(*shards.comm(), Mem::host());
    const std::vector<std::vector<int64_t>> all = agreement.gather(
        Failure{"dsopt_create", "could not create its optimizer (in this rank's shard group)"}, mine,
        row);
    RankAgreement::require_same(
        "dsopt_create", all,
        {{kConfig, "the config (of this rank's shard group)", "passed different settings"},
         {kShapes, "the number of parameters (of this rank's shard group)",
          "passed different numbers of parameters"}});
    int peers = 0;
    for (const std::vector<int64_t>& r : all)
      peers += r[kMachine] == row[kMachine] && r[kCores] == row[kCores];
    *cpu_peers = peers;
  });
}

}  // namespace

std::unique_ptr<Optimizer> create_optimizer(Comm& comm,
                                            const std::function<OptimizerConfig()>& parse,
                                            const dsopt_tensor* params, int64_t count) {
  std::unique_ptr<Optimizer> opt;
  uint64_t cfg_hash = 0, run_cfg_hash = 0;
  const LocalOutcome mine = attempt([&] {
    const OptimizerConfig cfg = parse();
    refuse_zero_on_shards(cfg, ShardGroup(comm));
    cfg_hash = hash64(cfg.canonical);
    run_cfg_hash = hash64(cfg.run_canonical);
    opt = std::make_unique<Optimizer>(cfg, comm, params, count);
  });
  const uint64_t shapes = mine.ok() ? shapes_hash(params, count) : 0;
  // A run is named by its config, shapes and initial parameters: blobs
  // stay byte-reproducible, and those of differently seeded runs differ.
  // (Where it runs is not part of a run's name: a blob saved on the CPU is
  // byte-identical to the same run's on CUDA.)
  uint64_t run_id = 0;
  if (mine.ok()) run_id = run_cfg_hash ^ (shapes * 0x9E3779B97F4A7C15ull) ^ opt->params_fingerprint();
  const CpuPlace place = this_cpu_place();
  const std::vector<int64_t> row = {int64_t(cfg_hash), int64_t(shapes), int64_t(run_id),
                                    int64_t(place.machine), int64_t(place.cores)};
  int shard_peers = 1;
  const std::vector<int64_t> shard_row = {int64_t(cfg_hash), count, 0, int64_t(place.machine),
                                          int64_t(place.cores)};
  const LocalOutcome agreed = agree_over_shards(ShardGroup(comm), mine, shard_row, &shard_peers);
  const auto [agreed_run_id, cpu_peers] = agree(comm, agreed, row);
  opt->set_run_id(agreed_run_id);
  opt->set_default_threads(default_threads(place, cpu_peers * shard_peers));
  opt->created();
  return opt;
}

}  // namespace dsopt

#include "optim/optimizer_parts.hpp"

#include <utility>

#include "base/error.hpp"

namespace dsopt {

OptimizerParts::OptimizerParts(const OptimizerConfig& cfg, Comm& comm,
                               std::unique_ptr<Kernels> kernels, const dsopt_tensor* params,
                               int64_t count, std::function<std::string()> blob_name,
                               std::function<void(StateSchema&)> describe,
                               std::function<void(int, const std::string&)> mark_failed)
    : cfg_(cfg),
      comm_(comm),
      kernels_(std::move(kernels)),
      host_(make_cpu_kernels(cfg.threads)),
      shards_(comm),
      params_(params, count, int32_t(cfg.groups.size()), *kernels_, cfg.zero.stage == 0,
              shards_.active()),
      agreement_(comm, Mem::host()),
      pipeline_(cfg.pipeline, comm, *kernels_, Mem{kernels_.get(), cfg.cuda_aware}, params_,
                runner_, agreement_, cfg.zero.reduce_bucket_size),
      groups_(cfg_, params_),
      absent_(*kernels_, params_),
      divergence_(cfg.pipeline.divergence),
      io_(comm, params_, *kernels_, CommonState{groups_, pipeline_.scaler(), run_id_, divergence_},
          std::move(blob_name), std::move(describe)),
      gathers_(cfg.zero.deferred_allgather, comm, runner_, *kernels_, std::move(mark_failed)) {}

void OptimizerParts::find_topology() {
  const TopologyConfig& t = cfg_.topology;
  if (comm_.given_node()) {
    topology_ = given_topology(comm_);
    if (t.ranks_per_node > 0 && t.ranks_per_node != topology_.ranks_per_node)
      fail(DSOPT_EINVAL, "topology.ranks_per_node is " + std::to_string(t.ranks_per_node) +
                             " but the node communicators given with dsopt_comm_set_nodes have " +
                             std::to_string(topology_.ranks_per_node) + " ranks");
  } else if (t.ranks_per_node > 0)
    topology_ = Topology::declared(comm_.rank(), comm_.size(), t.ranks_per_node);
  else if (comm_.size() == 1)
    topology_ = Topology::declared(0, 1, 1);
  else
    topology_ = Topology::discover(comm_);
  comm_.set_nodes(topology_.node_of_rank);
  flat_reason_ = topology_.flat_reason;
}

bool OptimizerParts::node_aware() const {
  switch (cfg_.topology.hierarchy) {
    case TopologyConfig::Hierarchy::Flat: return false;
    case TopologyConfig::Hierarchy::NodeAware: return comm_.size() > 1;
    case TopologyConfig::Hierarchy::Auto: break;
  }
  return topology_.nodes > 1 && topology_.ranks_per_node > 1;
}

NodeComms* OptimizerParts::node_comms() {
  if (node_comms_tried_ || !node_aware()) return node_comms_.get();
  node_comms_tried_ = true;
  if (comm_.given_node()) {  // the caller's, checked by find_topology
    node_comms_ = std::make_unique<NodeComms>();
    node_comms_->node = CommHandle(comm_.given_node(), CommOwnership(false));
    node_comms_->rail = CommHandle(comm_.given_rail(), CommOwnership(false));
    return node_comms_.get();
  }
  try {
    node_comms_ = std::make_unique<NodeComms>(split_by_topology(comm_, topology_));
  } catch (const Error& e) {
    if (e.status() != DSOPT_EUNSUPPORTED || cfg_.topology.hierarchy == TopologyConfig::Hierarchy::NodeAware)
      throw;
    flat_reason_ = e.what();
  }
  return node_comms_.get();
}

StateSchema::Slicer OptimizerParts::flat_slices() const {
  return [this](int64_t i, float* array) {
    const Param& p = params_.params()[size_t(i)];
    return StateSchema::Slice{true, array + p.offset, p.numel, 0};
  };
}

void OptimizerParts::restore_masters(const float* host) {
  kernels_->copy_from_host(params_.masters(), host, uint64_t(params_.master_numel()) * 4);
  params_.write_back();
}

}  // namespace dsopt

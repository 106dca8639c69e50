// The nodes of compressed_allreduce_bench (bench/compressed_allreduce.cpp):
// its --hierarchy flat|node_aware|auto, --ranks-per-node R and
// --node-reduce fp32|1bit flags read as
// the library reads the config's "topology" key (docs/guides/multi-node.md:
// R declared, or 0 for the nodes MPI's shared-memory split finds; "auto"
// node-aware on several nodes of several ranks), the node and rail
// communicators of the node-aware form, and what each timed operation must
// add to the Comm's byte counters, sent and across nodes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "comm/node_aware_allreduce.hpp"
#include "comm/topology.hpp"

namespace bench {

struct CarTopology {
  dsopt::Topology topo;
  bool node_aware = false;
  bool onebit_node = false;  // the 1-bit node step (topology.node_reduce "1bit") where it runs
  dsopt::NodeComms comms;  // the node and rail communicators (node-aware only)

  int nodes() const { return topo.nodes; }
  int ranks_per_node() const { return topo.ranks_per_node; }
  // Whether the counts across nodes have formulas: nodes of equal sizes.
  bool equal_nodes() const { return topo.flat_reason.empty(); }
  std::string describe() const {
    return topo.describe() + (node_aware ? onebit_node ? "; the compressed allreduce node-aware, 1-bit inside the node"
                                                       : "; the compressed allreduce node-aware"
                                         : "; flat");
  }
};

// Collective over `comm`: its nodes (told to it for its count of the bytes
// across nodes) and, node-aware, the node and rail communicators split from
// it (their bytes count in its counters too). Throws dsopt::Error
// (DSOPT_EINVAL) on a bad hierarchy, an R that does not divide the world
// size, or node-aware on nodes of unequal sizes.
inline CarTopology car_topology(dsopt::Comm& comm, const std::string& hierarchy, int ranks_per_node,
                                const std::string& node_reduce = "fp32") {
  if (hierarchy != "flat" && hierarchy != "node_aware" && hierarchy != "auto")
    dsopt::fail(DSOPT_EINVAL, "--hierarchy is flat, node_aware or auto, not '" + hierarchy + "'");
  if (node_reduce != "fp32" && node_reduce != "1bit")
    dsopt::fail(DSOPT_EINVAL, "--node-reduce is fp32 or 1bit, not '" + node_reduce + "'");
  CarTopology c;
  c.topo = ranks_per_node > 0 ? dsopt::Topology::declared(comm.rank(), comm.size(), ranks_per_node)
                              : dsopt::Topology::discover(comm);
  comm.set_nodes(c.topo.node_of_rank);
  c.node_aware = hierarchy == "node_aware" ||
                 (hierarchy == "auto" && c.topo.nodes > 1 && c.topo.ranks_per_node > 1);
  if (c.node_aware && !c.equal_nodes())
    dsopt::fail(DSOPT_EINVAL, "--hierarchy " + hierarchy + ": " + c.topo.flat_reason +
                                  " (declare the nodes with --ranks-per-node)");
  if (c.node_aware) c.comms = dsopt::split_by_topology(comm, c.topo);
  c.onebit_node = c.node_aware && dsopt::NodeAwareAllreduce::onebit_node_step(
                                      node_reduce == "1bit", c.topo.nodes, c.topo.ranks_per_node);
  return c;
}

// Bytes one call adds to the Comm's counters on every rank.
struct CallBytes {
  uint64_t sent = 0;
  uint64_t across = 0;
};

// The fp32 allreduce of n floats: an allreduce of c = 4n bytes counts
// 2 (P-1) c / P sent and 2 (P-R) c / P across nodes, rounded down.
inline CallBytes fp32_bytes(int64_t n, const CarTopology& t) {
  const uint64_t P = uint64_t(t.topo.world()), R = uint64_t(t.ranks_per_node()), c = 4 * uint64_t(n);
  return {2 * (P - 1) * c / P, 2 * (P - R) * c / P};
}

// The flat 1-bit allreduce of one tensor of n floats
// (docs/design/compressed-allreduce.md section 7; across nodes
// NodeAwareAllreduce::flat_cross_node_bytes).
inline CallBytes flat_car_bytes(int64_t n, const CarTopology& t) {
  const int P = t.topo.world();
  const uint64_t padded = uint64_t(dsopt::CompressedAllreduce::padded_length(n, P));
  return {uint64_t(P - 1) * padded / (4 * uint64_t(P)) + 8 * uint64_t(P - 1),
          dsopt::NodeAwareAllreduce::flat_cross_node_bytes({n}, t.nodes(), t.ranks_per_node())};
}

// The node-aware 1-bit allreduce of one tensor of n floats: the node
// communicator's bytes and the rail's, of which only the rail's cross.
inline CallBytes node_aware_car_bytes(int64_t n, const CarTopology& t) {
  const std::vector<int64_t> sizes{n};
  const uint64_t rail = dsopt::NodeAwareAllreduce::rail_bytes(sizes, t.nodes(), t.ranks_per_node(), t.onebit_node);
  return {dsopt::NodeAwareAllreduce::node_bytes(sizes, t.nodes(), t.ranks_per_node(), t.onebit_node) + rail,
          rail};
}

}  // namespace bench

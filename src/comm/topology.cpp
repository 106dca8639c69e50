#include "comm/topology.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "base/error.hpp"

namespace dsopt {

Topology Topology::declared(int rank, int size, int ranks_per_node) {
  if (ranks_per_node < 1 || size % ranks_per_node != 0)
    fail(DSOPT_EINVAL, "ranks_per_node = " + std::to_string(ranks_per_node) +
                           " does not divide the world size " + std::to_string(size) +
                           " (nodes must have equal numbers of ranks)");
  if (rank < 0 || rank >= size)
    fail(DSOPT_EINTERNAL, "Topology::declared: rank " + std::to_string(rank) + " of " +
                              std::to_string(size));
  Topology t;
  t.ranks_per_node = ranks_per_node;
  t.nodes = size / ranks_per_node;
  t.node = rank / ranks_per_node;
  t.local = rank % ranks_per_node;
  for (int r = 0; r < size; ++r) t.node_of_rank.push_back(r / ranks_per_node);
  return t;
}

Topology Topology::from_node_ids(Comm& comm, int node_id) {
  const int P = comm.size(), me = comm.rank();
  std::vector<int32_t> ids(size_t(P), 0);
  const int32_t mine = node_id;
  comm.allgather(&mine, ids.data(), 1, Elem::I32, Mem::host());
  // Nodes in the order of their lowest rank; ranks in rank order inside.
  std::map<int32_t, int> node_of_id;
  std::vector<int> members;
  int local = 0;
  for (int r = 0; r < P; ++r) {
    const auto found = node_of_id.find(ids[size_t(r)]);
    if (found == node_of_id.end()) {
      node_of_id.emplace(ids[size_t(r)], int(members.size()));
      members.push_back(1);
    } else {
      ++members[size_t(found->second)];
    }
    if (r < me && ids[size_t(r)] == mine) ++local;
  }
  const bool equal = std::all_of(members.begin(), members.end(), [&](int m) { return m == members[0]; });
  std::vector<int> node_of_rank;
  for (int r = 0; r < P; ++r) node_of_rank.push_back(node_of_id.at(ids[size_t(r)]));
  Topology t;
  if (!equal) {
    t = declared(me, P, 1);
    t.node_of_rank = node_of_rank;
    t.flat_reason = "nodes of unequal sizes (";
    for (size_t k = 0; k < members.size(); ++k)
      t.flat_reason += (k ? ", " : "") + std::to_string(members[k]);
    t.flat_reason += " ranks): the flat compressed allreduce runs instead";
    return t;
  }
  t.nodes = int(members.size());
  t.ranks_per_node = members[0];
  t.node = node_of_id.at(mine);
  t.local = local;
  t.node_of_rank = node_of_rank;
  return t;
}

std::string Topology::describe() const {
  std::string s = std::to_string(nodes) + " x " + std::to_string(ranks_per_node) + " (node " +
                  std::to_string(node) + ", local " + std::to_string(local) + ")";
  if (!flat_reason.empty()) s += ": " + flat_reason;
  return s;
}

NodeComms split_by_topology(Comm& comm, const Topology& t) {
  if (t.world() != comm.size() || t.node * t.ranks_per_node + t.local < 0)
    fail(DSOPT_EINTERNAL, "split_by_topology: topology " + t.describe() + " for a world of " +
                              std::to_string(comm.size()));
  NodeComms c;
  c.node = comm.split(t.node, t.local);
  c.rail = comm.split(t.local, t.node);
  // The node communicator's ranks share a node; the rail's are each on
  // another one.
  c.node->set_nodes(std::vector<int>(size_t(t.ranks_per_node), 0));
  std::vector<int> rail_nodes(size_t(t.nodes));
  for (int k = 0; k < t.nodes; ++k) rail_nodes[size_t(k)] = k;
  c.rail->set_nodes(rail_nodes);
  if (c.node->size() != t.ranks_per_node || c.node->rank() != t.local || c.rail->size() != t.nodes ||
      c.rail->rank() != t.node)
    fail(DSOPT_EINTERNAL, "split_by_topology: the communicators made do not match " + t.describe());
  return c;
}

}  // namespace dsopt

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
  Comm::mark_node_and_rail(*c.node, *c.rail);
  if (c.node->size() != t.ranks_per_node || c.node->rank() != t.local || c.rail->size() != t.nodes ||
      c.rail->rank() != t.node)
    fail(DSOPT_EINTERNAL, "split_by_topology: the communicators made do not match " + t.describe());
  return c;
}

}  // namespace dsopt

namespace dsopt {

Topology given_topology(Comm& comm) {
  Comm& node = *comm.given_node();
  Comm& rail = *comm.given_rail();
  node.prepare();
  rail.prepare();
  const int P = comm.size(), N = rail.size(), R = node.size();
  // Every rank's (node, local, nodes, ranks per node): the same table on
  // every rank, so the checks of it agree.
  const int32_t mine[4] = {rail.rank(), node.rank(), N, R};
  std::vector<int32_t> all(size_t(4) * size_t(P));
  comm.allgather(mine, all.data(), 4, Elem::I32, Mem::host());
  std::string why;
  if (int64_t(N) * R != P)
    why = "a node communicator of " + std::to_string(R) + " ranks and a rail communicator of " +
          std::to_string(N) + " do not make a world of " + std::to_string(P);
  std::vector<int> at(why.empty() ? size_t(P) : 0, -1);
  for (int r = 0; r < P && why.empty(); ++r) {
    const int32_t* e = all.data() + 4 * r;
    if (e[2] != N || e[3] != R)
      why = "rank " + std::to_string(r) + " has a node communicator of " + std::to_string(e[3]) +
            " ranks and a rail communicator of " + std::to_string(e[2]) + ", rank " +
            std::to_string(comm.rank()) + " of " + std::to_string(R) + " and " + std::to_string(N);
    else if (at[size_t(e[0] * R + e[1])] >= 0)
      why = "ranks " + std::to_string(at[size_t(e[0] * R + e[1])]) + " and " + std::to_string(r) +
            " are both local rank " + std::to_string(e[1]) + " (node rank) of node " +
            std::to_string(e[0]) + " (rail rank)";
    else
      at[size_t(e[0] * R + e[1])] = r;
  }
  if (why.empty()) {
    // The members of each: their ranks here, against the table.
    const int32_t me = comm.rank();
    std::vector<int32_t> members(size_t(std::max(N, R)));
    int32_t bad = 0;
    node.allgather(&me, members.data(), 1, Elem::I32, Mem::host());
    for (int i = 0; i < R; ++i)
      bad |= all[size_t(4 * members[size_t(i)])] != rail.rank() || all[size_t(4 * members[size_t(i)] + 1)] != i;
    rail.allgather(&me, members.data(), 1, Elem::I32, Mem::host());
    for (int k = 0; k < N; ++k)
      bad |= all[size_t(4 * members[size_t(k)] + 1)] != node.rank() || all[size_t(4 * members[size_t(k)])] != k;
    comm.allreduce(&bad, &bad, 1, Elem::I32, ReduceOp::Max, Mem::host());
    if (bad)
      why = "the node communicator of some rank does not hold the ranks of its node in local order, or "
            "its rail communicator those of its local index in node order";
  }
  if (!why.empty())
    fail(DSOPT_EINVAL, "the node and rail communicators given with dsopt_comm_set_nodes do not fit: " + why);
  Topology t;
  t.nodes = N;
  t.ranks_per_node = R;
  t.node = rail.rank();
  t.local = node.rank();
  t.node_of_rank.resize(size_t(P));
  for (int r = 0; r < P; ++r) t.node_of_rank[size_t(r)] = all[size_t(4 * r)];
  return t;
}

}  // namespace dsopt

// Where the ranks of a communicator sit: N nodes of R ranks each
// (docs/design/node-aware-allreduce.md). The node-aware compressed
// collectives (comm/node_aware_allreduce.hpp) run inside a node on the node
// communicator (the R ranks of this rank's node, ranked by local index) and
// across nodes on the rail communicator (the N ranks with this rank's local
// index, one per node, ranked by node index).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace dsopt {

struct Topology {
  int nodes = 1;           // N
  int ranks_per_node = 1;  // R; nodes * ranks_per_node is the world size
  int node = 0;            // this rank's node, 0 <= node < N
  int local = 0;           // this rank's local index, 0 <= local < R
  // Set when the nodes found were of unequal sizes: the topology is then
  // the flat one (N = P nodes of one rank) and this says why.
  std::string flat_reason;
  // The node of every rank (the machines found, also where the nodes are
  // unequal and the topology is flat): what Comm counts the bytes that
  // cross a node boundary by.
  std::vector<int> node_of_rank;

  bool flat() const { return ranks_per_node == 1; }
  int world() const { return nodes * ranks_per_node; }

  // Declared (tests on one machine, or a caller that knows its layout):
  // node = rank / R, local = rank % R. DSOPT_EINVAL unless R >= 1 divides
  // the world size.
  static Topology declared(int rank, int size, int ranks_per_node);
  // Collective over `comm`: the nodes are the groups of ranks that pass the
  // same `node_id`, numbered by their lowest rank; a rank's local index is
  // its place among its node's ranks in rank order. Nodes of unequal sizes
  // give the flat topology with flat_reason set (never an error: the flat
  // form runs on any layout).
  static Topology from_node_ids(Comm& comm, int node_id);
  // from_node_ids with comm.node_id() (MPI: the shared-memory split).
  static Topology discover(Comm& comm) { return from_node_ids(comm, comm.node_id()); }

  // "N x R (node k, local j)", and the flat reason if any.
  std::string describe() const;
};

// A communicator owned (made by split) or borrowed (given by the caller).
struct CommOwnership {
  bool owned = true;
  CommOwnership() = default;
  explicit CommOwnership(bool is_owned) : owned(is_owned) {}
  CommOwnership(std::default_delete<Comm>) {}  // NOLINT: what split returns is owned
  void operator()(Comm* c) const {
    if (owned) delete c;
  }
};
using CommHandle = std::unique_ptr<Comm, CommOwnership>;

// The node and rail communicators of a topology: made by
// split_by_topology, or the caller's (Comm::given_node, given_rail).
struct NodeComms {
  CommHandle node, rail;
};
// The node and rail communicators of `t` (collective over `comm`, whose
// rank must be t's): two Comm::split calls, node = split(t.node, t.local)
// and rail = split(t.local, t.node).
NodeComms split_by_topology(Comm& comm, const Topology& t);
// The topology of the node and rail communicators given to `comm`
// (Comm::set_given_nodes), checked collectively over all three: every rank
// (node k = rail rank, local j = node rank) once on a grid of N = rail size
// nodes of R = node size ranks, the node communicator's ranks those of
// node k in local order, the rail's those of local index j in node order.
// Throws Error(DSOPT_EINVAL) on every rank when they are not.
Topology given_topology(Comm& comm);

}  // namespace dsopt

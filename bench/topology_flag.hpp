// The "topology" config key (docs/guides/multi-node.md) for the benchmarks'
// --hierarchy and --ranks-per-node flags, the step report's count of bytes
// that crossed a node boundary, and the emulated link's count of them.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bench {

// ', "topology": {"hierarchy": H, "ranks_per_node": R}' to add to a config
// object, with "node_reduce": NR where `node_reduce` is not empty; "" when
// `hierarchy` is empty (the library's default).
inline std::string topology_key(const std::string& hierarchy, long long ranks_per_node,
                                const std::string& node_reduce = "") {
  if (hierarchy.empty()) return "";
  char c[200];
  std::snprintf(c, sizeof c, ", \"topology\": {\"hierarchy\": \"%s\", \"ranks_per_node\": %lld%s%s%s}",
                hierarchy.c_str(), ranks_per_node, node_reduce.empty() ? "" : ", \"node_reduce\": \"",
                node_reduce.c_str(), node_reduce.empty() ? "" : "\"");
  return c;
}

// A config object (text ending in '}') with the topology key added.
inline std::string with_topology(std::string config, const std::string& hierarchy,
                                 long long ranks_per_node, const std::string& node_reduce = "") {
  const std::string key = topology_key(hierarchy, ranks_per_node, node_reduce);
  if (!key.empty() && !config.empty() && config.back() == '}') config.insert(config.size() - 1, key);
  return config;
}

// info.bytes_inter_node of a dsopt_step_info.
template <class Info>
long long inter_node_bytes(const Info& info) {
  return static_cast<long long>(info.bytes_inter_node);
}

// Bytes that have crossed between the emulated nodes so far: the sum of
// the htb classes bench/netem_two_nodes.sh names in DSOPT_NETEM_CROSS_CLASSES
// ("1:10,1:20"), read from `tc -s class show dev lo` (IP packets with their
// headers, both directions); -1 outside that script or when tc fails.
inline long long tc_cross_bytes() {
  const char* classes = std::getenv("DSOPT_NETEM_CROSS_CLASSES");
  if (!classes || !*classes) return -1;
  const std::string wanted = std::string(",") + classes + ",";
  FILE* f = popen("tc -s class show dev lo 2>/dev/null", "r");
  if (!f) return -1;
  char line[512];
  bool in = false, any = false;
  long long total = 0;
  while (std::fgets(line, sizeof line, f)) {
    char id[64];
    if (std::sscanf(line, "class htb %63s", id) == 1) {
      in = wanted.find(std::string(",") + id + ",") != std::string::npos;
      continue;
    }
    long long sent = 0;
    if (in && std::sscanf(line, " Sent %lld bytes", &sent) == 1) {
      total += sent;
      any = true;
      in = false;
    }
  }
  pclose(f);
  return any ? total : -1;
}

}  // namespace bench

#include "kernels/cpu/thread_budget.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "base/fnv.hpp"

namespace dsopt {
namespace {

// The host name and the kernel's boot id (containers on one machine may
// share a host name with other machines' containers, never a boot id).
uint64_t machine_id() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  std::string id = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) id += "/" + boot_id;
  return fnv1a(id.data(), id.size());
}

}  // namespace

CpuPlace this_cpu_place() {
  CpuPlace place;
  place.machine = machine_id();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    place.usable = std::max(1, CPU_COUNT(&mask));
    place.cores = fnv1a(&mask, sizeof mask);
  } else {
    place.usable = std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
  }
  return place;
}

int default_threads(const CpuPlace& place, int peers) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env && *env) return std::max(1, std::min(omp_get_max_threads(), place.usable));
  return std::max(1, place.usable / std::max(1, peers));
}

}  // namespace dsopt

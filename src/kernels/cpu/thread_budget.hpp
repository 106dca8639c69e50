// The default number of CPU threads of a rank (config "threads" 0): the
// cores this process may run on, shared with the ranks of its communicator
// that run on the same cores of the same machine.
#pragma once
#include <cstdint>

namespace dsopt {

// What a rank knows of itself before the ranks compare notes.
struct CpuPlace {
  uint64_t machine = 0;  // hash of the host name and boot id: equal on one machine
  uint64_t cores = 0;    // hash of the CPU affinity mask: equal for ranks on the same cores
  int usable = 1;        // cores in the affinity mask (at least 1)
};

CpuPlace this_cpu_place();

// Threads for a rank at `place` among `peers` ranks (itself included) of
// its communicator on the same machine and cores: OMP_NUM_THREADS when the
// user set it (OpenMP's own per-process setting), capped by the usable
// cores; otherwise the usable cores divided among the peers; at least 1.
int default_threads(const CpuPlace& place, int peers);

}  // namespace dsopt

// Build without MPI: the MPI communicator says how to get one.
#include "base/error.hpp"
#include "comm/comm.hpp"

namespace dsopt {

std::unique_ptr<Comm> make_mpi_comm(int64_t) {
  fail(DSOPT_EUNSUPPORTED,
       "this libdsopt was built without MPI; install an MPI (apt-get install libopenmpi-dev) and "
       "rebuild with -DDSOPT_WITH_MPI=ON");
}

std::string mpi_build_info() { return "mpi=off"; }

}  // namespace dsopt

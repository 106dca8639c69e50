// make_nccl_comm in a build without NCCL.
#include "base/error.hpp"
#include "comm/comm.hpp"

namespace dsopt {

std::unique_ptr<Comm> make_nccl_comm(void*, void*) {
  fail(DSOPT_EUNSUPPORTED,
       "this libdsopt was built without NCCL; rebuild with CUDA on and nccl.h found "
       "(cmake -DDSOPT_WITH_CUDA=ON -DDSOPT_WITH_NCCL=ON, -DNCCL_INCLUDE_DIR=<dir of nccl.h> if "
       "it is not in the CUDA toolkit)");
}

}  // namespace dsopt

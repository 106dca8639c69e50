// The CUDA entry points in a build without CUDA.
#include "base/error.hpp"
#include "kernels/device_pointer.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {

std::unique_ptr<Kernels> make_cuda_kernels(void*) {
  fail(DSOPT_EUNSUPPORTED,
       "this libdsopt was built without CUDA; rebuild with nvcc on PATH (cmake "
       "-DDSOPT_WITH_CUDA=ON)");
}

std::string cuda_build_info() { return "cuda=off"; }

bool is_cuda_device_pointer(const void*) { return false; }

int cuda_device_of(const void*) { return -1; }

int cuda_current_device() { return -1; }

}  // namespace dsopt

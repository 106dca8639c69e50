// Where a caller's buffer lives, to reject buffers on the wrong device
// before anything reads them (a CPU kernel reading device memory crashes;
// a CUDA kernel reading another device's or pageable host memory leaves a
// sticky error in the CUDA context).
#pragma once

namespace dsopt {

// The ordinal of the CUDA device whose memory `p` is (managed memory
// counts as device memory), or -1: host memory, a null pointer, or a build
// without CUDA or without a driver.
int cuda_device_of(const void* p);
// The current CUDA device (where make_cuda_kernels makes its kernels), or
// -1 without one.
int cuda_current_device();

}  // namespace dsopt

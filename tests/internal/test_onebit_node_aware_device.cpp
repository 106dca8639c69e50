// The 1-bit family's node-aware compressed allreduce on device buffers
// (docs/design/node-aware-allreduce.md), under mpirun at 4 and 6 ranks as
// nodes of 2 (2 x 2, 3 x 2): 1-bit Adam, 1-bit LAMB and 0/1 Adam on a
// stand-in device (host memory the optimizer treats as CUDA,
// tests/internal/fake_device_kernels.hpp) take the steps of the same
// optimizer on the CPU kernels bit for bit, warmup and compressed steps,
// with either node step (fp32, 1-bit), and send the same bytes, as many
// of them to other nodes. With 2 ranks a node the fp32 node sum of the
// device path (the backend's reduce-scatter) is the host path's
// fixed-order one: a sum of two does not depend on the order. The warmup's
// gradient allreduce on device buffers is the backend's, in its own order:
// the gradients are multiples of 1/64 below 4 in magnitude, whose sums are
// exact in any order, so that both paths enter the compressed steps from
// the same parameters.
// tests/gpu/test_cuda_node_aware.cpp runs the same check on a GPU.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "api/config.hpp"
#include "base/error.hpp"
#include "comm/comm.hpp"
#include "facade/optimizer.hpp"
#include "mpi_test_model.hpp"

using namespace dsopt;
using namespace dsopt::mpi_test;

namespace {

constexpr int kSteps = 10;

std::string config(const std::string& optimizer, const std::string& node_reduce) {
  return "{\"optimizer\": {\"type\": \"" + optimizer + "\", \"params\": " +
         (optimizer == "ZeroOneAdam"
              ? "{\"lr\": 0.01, \"var_freeze_step\": 3, \"var_update_scaler\": 1, \"local_step_scaler\": 2, "
                "\"local_step_clipper\": 2}"
              : "{\"lr\": 0.01, \"freeze_step\": 3}") +
         "}, \"threads\": 1, \"topology\": {\"hierarchy\": \"node_aware\", \"ranks_per_node\": 2, "
         "\"node_reduce\": \"" + node_reduce + "\"}}";
}

// fill_grads's gradients rounded to multiples of 1/64 (sums of a few of
// them are exact in fp32, whatever their order).
void fill_exact_grads(Model& m, int step, int rank) {
  fill_grads(m, step, rank);
  for (size_t t = 0; t < m.grads.size(); ++t) {
    auto* g = reinterpret_cast<float*>(m.grads[t].data());
    for (int64_t i = 0; i < kNumels[t]; ++i) g[i] = std::round(g[i] * 64.0f) / 64.0f;
  }
}

void device_equals_cpu(Comm& comm, const std::string& optimizer, const std::string& node_reduce) {
  const std::string label = optimizer + ", node step " + node_reduce + ", stand-in device";
  const OptimizerConfig cpu = parse_config(config(optimizer, node_reduce).c_str());
  OptimizerConfig device = cpu;
  device.cuda = true;  // the stand-in device counts as device memory
  Model ma = make_model(5), mb = make_model(5);
  auto a = make(cpu, comm, ma, false);
  auto b = make(device, comm, mb, true);
  int compressed = 0;
  for (int s = 0; s < kSteps; ++s) {
    fill_exact_grads(ma, s, comm.rank());
    fill_exact_grads(mb, s, comm.rank());
    const StepResult ra = a->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
    const StepResult rb = b->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
    const std::string at = label + ": step " + std::to_string(s);
    check(ma.params == mb.params, at + ": parameters bit-identical");
    check(ra.phase == rb.phase && ra.bytes_sent == rb.bytes_sent && ra.bytes_inter_node == rb.bytes_inter_node,
          at + ": the same phase and bytes (" + std::to_string(ra.bytes_sent) + "/" +
              std::to_string(ra.bytes_inter_node) + " against " + std::to_string(rb.bytes_sent) + "/" +
              std::to_string(rb.bytes_inter_node) + ")");
    if (rb.phase == DSOPT_PHASE_COMPRESSED || rb.phase == DSOPT_PHASE_SYNC) {
      ++compressed;
      check(rb.bytes_inter_node > 0 && rb.bytes_inter_node < rb.bytes_sent,
            at + ": the compressed allreduce sends inside and across the nodes");
    }
  }
  check(compressed >= 3, label + ": " + std::to_string(compressed) + " steps ran the compressed allreduce");
}

}  // namespace

int main(int argc, char** argv) {
  int size = 0;
  try {
    std::unique_ptr<Comm> comm = start_on_every_rank(&argc, &argv, &size);
    if (size % 2 != 0 || size < 4) {
      check(false, "run at an even world size of 4 or more");
    } else {
      for (const char* optimizer : {"OneBitAdam", "OneBitLamb", "ZeroOneAdam"})
        for (const char* node_reduce : {"fp32", "1bit"}) device_equals_cpu(*comm, optimizer, node_reduce);
    }
  } catch (const Error& e) {
    check(false, std::string("error: ") + e.what());
  }
  return finish_on_every_rank();
}

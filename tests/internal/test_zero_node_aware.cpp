// Node-aware compressed ZeRO (docs/design/node-aware-zero.md) where the
// Python harness cannot reach, under mpirun at 4 and 6 ranks:
//
// - nodes whose ranks are not consecutive (found from the communicator:
//   node = rank mod 2, through a communicator whose node_id() says so), so
//   that each node's pieces of a bucket are gathered before the node's
//   reduce-scatter, and the owners' codes arrive from interleaved ranks.
//   With the same gradients on every rank the node sums (R g, R = 2 or 3
//   ranks of equal values) do not depend on which ranks share a node, so the
//   run must take the steps of the declared, consecutive 2 x R run bit for
//   bit, with the same bytes;
// - device buffers (a stand-in device: host memory the optimizer treats as
//   CUDA, tests/internal/fake_device_kernels.hpp) and CPU offload of the
//   update: the same parameters as on the CPU kernels, bit for bit (the
//   sums inside the node are dsopt's fixed-order ones on device buffers
//   too, where a device reduce-scatter would keep MPI's own order: at
//   3 ranks a node that order shows).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api/config.hpp"
#include "base/error.hpp"
#include "comm/comm.hpp"
#include "facade/optimizer.hpp"
#include "fake_device_kernels.hpp"
#include "mpi_test_model.hpp"

using namespace dsopt;
using namespace dsopt::mpi_test;

namespace {

// `inner`'s collectives, with node_id() = rank mod 2: two nodes of
// interleaved ranks (even, odd).
class InterleavedComm final : public Comm {
 public:
  explicit InterleavedComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  void prepare() override { inner_.prepare(); }
  void wait() override { inner_.wait(); }
  bool concurrent_calls() const override { return inner_.concurrent_calls(); }
  int node_id() override { return rank() % 2; }

 protected:
  void do_allreduce(const void* s, void* r, size_t n, Elem e, ReduceOp op, const Mem& m) override {
    inner_.allreduce(s, r, n, e, op, m);
  }
  void do_reduce_scatter(const void* s, void* r, size_t n, Elem e, ReduceOp op, const Mem& m) override {
    inner_.reduce_scatter(s, r, n, e, op, m);
  }
  void do_allgather(const void* s, void* r, size_t n, Elem e, const Mem& m) override {
    inner_.allgather(s, r, n, e, m);
  }
  void do_alltoallv(const void* s, const size_t* sc, const size_t* so, void* r, const size_t* rc,
                    const size_t* ro, Elem e, const Mem& m) override {
    inner_.alltoallv(s, sc, so, r, rc, ro, e, m);
  }
  std::unique_ptr<Comm> do_split(int color, int key) override { return inner_.split(color, key); }

 private:
  Comm& inner_;
};

std::string config(const std::string& topology, const std::string& compression, int stage,
                   const std::string& extra = "") {
  return "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.05}}, "
         "\"threads\": 1, \"topology\": " + topology + ", \"zero_optimization\": {\"stage\": " +
         std::to_string(stage) + ", \"reduce_bucket_size\": 600, \"allgather_bucket_size\": 900, "
         "\"compression\": " + compression + extra + "}}";
}

void interleaved_equals_consecutive(Comm& comm, Comm& interleaved, const std::string& compression,
                                    int stage) {
  const int P = comm.size();
  const std::string label = compression + ", stage " + std::to_string(stage) + ", interleaved nodes";
  const OptimizerConfig declared =
      parse_config(config("{\"hierarchy\": \"node_aware\", \"ranks_per_node\": " + std::to_string(P / 2) + "}",
                          compression, stage).c_str());
  const OptimizerConfig found = parse_config(config("{\"hierarchy\": \"node_aware\"}", compression, stage).c_str());
  Model ma = make_model(7), mb = make_model(7);
  auto a = make(declared, comm, ma, false);
  auto b = make(found, interleaved, mb, false);
  check(ma.params == mb.params, label + ": parameters after creation");
  for (int s = 0; s < 4; ++s) {
    fill_grads(ma, s, -1);
    fill_grads(mb, s, -1);
    const StepResult ra = a->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
    const StepResult rb = b->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
    check(ma.params == mb.params, label + ": step " + std::to_string(s) + ": parameters bit-identical");
    check(ra.bytes_sent == rb.bytes_sent && ra.bytes_inter_node == rb.bytes_inter_node &&
              rb.bytes_inter_node > 0,
          label + ": step " + std::to_string(s) + ": bytes " + std::to_string(ra.bytes_sent) + "/" +
              std::to_string(ra.bytes_inter_node) + " and " + std::to_string(rb.bytes_sent) + "/" +
              std::to_string(rb.bytes_inter_node));
  }
}

void device_equals_cpu(Comm& comm, const std::string& compression, int stage, bool offload) {
  const int P = comm.size();
  const std::string label = compression + ", stage " + std::to_string(stage) + (offload ? ", offload" : "") +
                            ", stand-in device";
  const std::string topology = std::string("{\"hierarchy\": \"node_aware\", \"ranks_per_node\": ") + std::to_string(P / 2) + "}";
  OptimizerConfig cpu = parse_config(config(topology, compression, stage).c_str());
  OptimizerConfig device = parse_config(
      config(topology, compression, stage,
             offload ? ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}" : "").c_str());
  device.cuda = true;  // the stand-in device counts as device memory
  if (offload) device.zero.offload_tile = 333;
  Model ma = make_model(11), mb = make_model(11);
  auto a = make(cpu, comm, ma, false);
  auto b = make(device, comm, mb, true);
  for (int s = 0; s < 4; ++s) {
    fill_grads(ma, s, comm.rank());
    fill_grads(mb, s, comm.rank());
    const StepResult ra = a->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
    const StepResult rb = b->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
    check(ma.params == mb.params, label + ": step " + std::to_string(s) + ": parameters bit-identical");
    check(ra.bytes_sent == rb.bytes_sent && ra.bytes_inter_node == rb.bytes_inter_node,
          label + ": the same bytes");
  }
}

}  // namespace

int main(int argc, char** argv) {
  int size = 0;
  try {
    std::unique_ptr<Comm> comm = start_on_every_rank(&argc, &argv, &size);
    InterleavedComm interleaved(*comm);
    if (size % 2 != 0 || size < 4) {
      check(false, "run at an even world size of 4 or more");
    } else {
      for (const char* c : {"{\"gradients\": \"int4\", \"parameters\": \"int8\", \"gradient_block_size\": 16, "
                            "\"parameter_block_size\": 32}",
                            "{\"gradients\": \"sign\", \"parameters\": \"bf16\", \"gradient_block_size\": 8}"})
        for (int stage = 1; stage <= 2; ++stage) interleaved_equals_consecutive(*comm, interleaved, c, stage);
      for (int stage = 1; stage <= 2; ++stage) {
        device_equals_cpu(*comm, "{\"gradients\": \"int4\", \"parameters\": \"int8\"}", stage, false);
        device_equals_cpu(*comm, "{\"gradients\": \"int8\", \"gradient_block_size\": 32}", stage, true);
        device_equals_cpu(*comm, "{\"gradients\": \"int8\", \"gradient_block_size\": 32}", stage, false);
      }
    }
  } catch (const Error& e) {
    check(false, std::string("error: ") + e.what());
  }
  return finish_on_every_rank();
}

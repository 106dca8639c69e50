// ZeRO-Offload's update path (src/algorithms/moment_rules/offloaded_update.cpp) without a GPU:
// the optimizer (ZeRO with Adam: ZeroOptimizer) on a stand-in device whose memory is host memory but which the
// optimizer treats as CUDA, so "offload_optimizer": {"device": "cpu"} moves
// masters and moments to the host kernels, uploads through the async lanes
// and pins through the device. Offloaded and device-resident optimizers
// must give bit-identical parameters after every step (fp32, bf16 and fp16
// parameters, tiles smaller than the shard, clipping), identical state
// blobs, blobs that load across the two, and the memory split docs/guides/zero.md
// states. The offloaded update with the deferred allgather equals it
// without. Runs under mpirun at 1, 2 and 4 ranks.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
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

void random_grads(Model& a, Model& b, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (size_t t = 0; t < a.grads.size(); ++t) {
    auto* g = reinterpret_cast<float*>(a.grads[t].data());
    for (int64_t i = 0; i < kNumels[t]; ++i) g[i] = normal(gen);
    b.grads[t] = a.grads[t];
  }
}

bool same_params(const Model& a, const Model& b) { return a.params == b.params; }

std::vector<uint8_t> blob(const Optimizer& o) {
  std::vector<uint8_t> out(o.save(nullptr, 0));
  o.save(out.data(), out.size());
  return out;
}

struct Run {
  FakeDeviceKernels* device;
  std::unique_ptr<Optimizer> opt;
};

Run make(const OptimizerConfig& cfg, Comm& comm, Model& m) {
  auto kernels = std::make_unique<FakeDeviceKernels>();
  FakeDeviceKernels* device = kernels.get();
  Run r{device, std::make_unique<Optimizer>(cfg, comm, std::move(kernels), m.param_desc.data(),
                                            int64_t(m.param_desc.size()))};
  r.opt->set_run_id(42);
  return r;
}

void offloaded_equals_resident(Comm& comm, const std::string& type, int stage, bool pin) {
  const std::string label = type + ", stage " + std::to_string(stage) + (pin ? ", pinned" : "");
  const std::string json =
      "{\"optimizer\": {\"type\": \"" + type + "\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.05}}, "
      "\"threads\": 1, \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": " +
      std::to_string(stage) + ", \"reduce_bucket_size\": 512, \"offload_optimizer\": "
      "{\"device\": \"cpu\", \"pin_memory\": " + (pin ? "true" : "false") + "}}}";
  OptimizerConfig offload = parse_config(json.c_str());
  offload.cuda = true;           // the stand-in device counts as device memory
  offload.zero.offload_tile = 333;  // several tiles per shard, both lanes
  OptimizerConfig resident = offload;
  resident.zero.offload_cpu = false;

  Model ma = make_model(7), mb = make_model(7);
  Run a = make(resident, comm, ma), b = make(offload, comm, mb);
  check(pin ? b.device->pins >= 3 : b.device->pins == 0,
        label + ": pinned regions " + std::to_string(b.device->pins));
  std::mt19937 gen(100 + unsigned(comm.rank()));
  for (int s = 1; s <= 4; ++s) {
    random_grads(ma, mb, gen);
    const StepResult ra = a.opt->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
    const StepResult rb = b.opt->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
    check(same_params(ma, mb), label + ": step " + std::to_string(s) + ": parameters bit-identical");
    check(ra.grad_norm == rb.grad_norm && ra.skipped == rb.skipped, label + ": same step report");
  }
  check(b.device->async_uploads[0] > 0 && b.device->async_uploads[1] > 0,
        label + ": uploads on both lanes");
  check(blob(*a.opt) == blob(*b.opt), label + ": identical state blobs");

  // Memory: the moments and masters moved to the host.
  const Optimizer::MemoryUsage ua = a.opt->memory_usage(), ub = b.opt->memory_usage();
  check(ub.device < ua.device && ub.host > ua.host, label + ": device " + std::to_string(ub.device) +
                                                         " < " + std::to_string(ua.device) + ", host " +
                                                         std::to_string(ub.host));

  // Blobs load across the two, and the runs go on identically.
  const std::vector<uint8_t> saved = blob(*a.opt);
  Model mc = make_model(9);
  Run c = make(offload, comm, mc);
  // fp32 parameters are the caller's: give c the same values as a.
  for (size_t t = 0; t < ma.params.size(); ++t)
    if (kParamTypes[t] == DSOPT_FLOAT32) mc.params[t] = ma.params[t];
  c.opt->load(saved.data(), saved.size());
  check(same_params(ma, mc), label + ": parameters after a load into the offloaded optimizer");
  random_grads(ma, mc, gen);
  a.opt->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
  c.opt->step(mc.grad_desc.data(), int64_t(mc.grad_desc.size()));
  check(same_params(ma, mc), label + ": the step after the load is bit-identical");
  c.opt.reset();
  b.opt.reset();
  check(FakeDeviceKernels::pinned_now() == 0, label + ": every pinned region unpinned");
}

// The deferred parameter allgather after an offloaded update: the shard
// uploaded inside the step, the buckets' gathers on dsopt's thread, waited
// for bucket by bucket in gather order. Parameters after the waits, step
// reports and blobs must be those of the same offloaded run gathering
// inside the step.
void deferred_gather_equals_immediate(Comm& comm, const std::string& type, int stage) {
  const std::string label = type + ", stage " + std::to_string(stage) + ", deferred allgather";
  const std::string json =
      "{\"optimizer\": {\"type\": \"" + type + "\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.05}}, "
      "\"threads\": 1, \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
      ", \"reduce_bucket_size\": 512, \"allgather_bucket_size\": 700, \"deferred_allgather\": true, "
      "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}";
  OptimizerConfig deferred = parse_config(json.c_str());
  deferred.cuda = true;  // the stand-in device counts as device memory
  deferred.zero.offload_tile = 333;
  OptimizerConfig immediate = deferred;
  immediate.zero.deferred_allgather = false;

  Model ma = make_model(11), mb = make_model(11);
  Run a = make(immediate, comm, ma), b = make(deferred, comm, mb);
  const int64_t buckets = b.opt->gather_buckets();
  check(comm.size() == 1 ? buckets == 0 : buckets > 1,
        label + ": " + std::to_string(buckets) + " buckets");
  // MPI_THREAD_MULTIPLE: dsopt's thread may call it, so the gathers leave the step.
  check(comm.concurrent_calls(), label + ": the communicator takes calls from dsopt's thread");
  std::mt19937 gen(200 + unsigned(comm.rank()));
  for (int s = 1; s <= 4; ++s) {
    random_grads(ma, mb, gen);
    const StepResult ra = a.opt->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
    const StepResult rb = b.opt->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
    for (int64_t k = 0; k < buckets; ++k) b.opt->wait_gathers(k, "test");
    check(b.opt->gathers_pending() == 0, label + ": every bucket has arrived");
    check(same_params(ma, mb), label + ": step " + std::to_string(s) + ": parameters bit-identical");
    check(ra.grad_norm == rb.grad_norm && ra.skipped == rb.skipped && ra.bytes_sent == rb.bytes_sent,
          label + ": same step report");
  }
  // One more step, its buckets waited for all at once (as the C API does
  // before any other call), then the blobs.
  random_grads(ma, mb, gen);
  a.opt->step(ma.grad_desc.data(), int64_t(ma.grad_desc.size()));
  b.opt->step(mb.grad_desc.data(), int64_t(mb.grad_desc.size()));
  b.opt->wait_gathers(-1, "test");
  check(same_params(ma, mb), label + ": parameters after waiting for every bucket at once");
  check(blob(*a.opt) == blob(*b.opt), label + ": identical state blobs");
  const Optimizer::MemoryUsage ua = a.opt->memory_usage(), ub = b.opt->memory_usage();
  check(ua.device == ub.device && ua.host == ub.host, label + ": the same memory");
}

}  // namespace

int main(int argc, char** argv) {
  int size = 0;
  try {
    std::unique_ptr<Comm> comm = start_on_every_rank(&argc, &argv, &size);
    for (const char* type : {"AdamW", "Lion"})
      for (int stage = 1; stage <= 2; ++stage)
        for (bool pin : {false, true}) offloaded_equals_resident(*comm, type, stage, pin);
    for (const char* type : {"AdamW", "Lion"})
      for (int stage = 1; stage <= 2; ++stage) deferred_gather_equals_immediate(*comm, type, stage);
  } catch (const Error& e) {
    check(false, std::string("error: ") + e.what());
  }
  return finish_on_every_rank();
}

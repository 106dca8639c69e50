// The deferred parameter allgather of ZeRO on "device": "cuda" (mpirun -np
// 2, both ranks on GPU 0, MPI_THREAD_MULTIPLE so that dsopt gathers on its
// own thread, device buffers staged through host memory): each rank runs
// two CUDA optimizers over the same device parameters' copies, one with
// "deferred_allgather" (its own communicator) and one without, with the
// same gradients; after each step the deferred one is waited for parameter
// by parameter (last first), bucket by bucket or all at once, in turn.
// Then the parameters (downloaded), the step info, the memory used and, at
// the end, the state blobs must be bit-identical, for ZeRO-1/2 with fp32,
// bf16 and fp16 parameters, compressed ZeRO and CPU offload (the update on
// the host, uploaded inside the step, the buckets gathered after it).
// Skips (exit code 77, on every rank) without a CUDA device.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "gpu_mpi.hpp"

using namespace gpu_test;

namespace {

struct Case {
  const char* name;
  const char* body;  // config keys besides "device" and "deferred_allgather"
  int32_t dtype;
  int overflow_step;  // an inf gradient on rank 1 at this step (fp16 loss scaling), or -1
};

const char kAdamW[] = "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}";

const Case kCases[] = {
    {"zero2_fp32_clipping", "\"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 2, "
     "\"reduce_bucket_size\": 50000, \"allgather_bucket_size\": 30000", DSOPT_FLOAT32, -1},
    {"zero1_bf16", "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1, "
     "\"allgather_bucket_size\": 20000", DSOPT_BFLOAT16, -1},
    {"zero2_fp16_overflow_on_one_rank", "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12}, "
     "\"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 40000", DSOPT_FLOAT16, 2},
    {"zero2_compressed_int4_int8", "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, "
     "\"allgather_bucket_size\": 30000, \"compression\": {\"gradients\": \"int4\", \"parameters\": \"int8\"}",
     DSOPT_FLOAT32, -1},
    {"zero2_compressed_bf16_int8", "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2, "
     "\"allgather_bucket_size\": 30000, \"compression\": {\"gradients\": \"int8\", \"parameters\": \"bf16\"}",
     DSOPT_BFLOAT16, -1},
    {"zero2_offload_pinned", "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, "
     "\"allgather_bucket_size\": 30000, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}",
     DSOPT_FLOAT32, -1},
    {"zero1_offload_bf16", "\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1, "
     "\"allgather_bucket_size\": 25000, \"offload_optimizer\": {\"device\": \"cpu\"}", DSOPT_BFLOAT16, -1},
};

const int64_t kSizes[] = {1, 7, 77, 4099, 70001, 120003};
constexpr int kSteps = 6;

std::string config(const Case& c, bool deferred) {
  return std::string("{\"device\": \"cuda\", ") + kAdamW + ", " + c.body +
         (deferred ? ", \"deferred_allgather\": true}}" : "}}");
}

dsopt_step_info new_info() {
  dsopt_step_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  return info;
}

// A communicator of its own over a duplicate of MPI_COMM_WORLD.
dsopt_comm* dup_comm(MPI_Comm* dup) {
  MPI_Comm_dup(MPI_COMM_WORLD, dup);
  dsopt_comm* comm = nullptr;
  if (!CHECK_OK(dsopt_comm_create_mpi(&comm, int64_t(MPI_Comm_c2f(*dup))))) MPI_Abort(MPI_COMM_WORLD, 1);
  return comm;
}

// Waits for the deferred optimizer's gathers the way step `step` asks.
void wait_for(dsopt_optimizer* opt, int step, int64_t count) {
  switch (step % 3) {
    case 0:  // parameter by parameter, the last first
      for (int64_t i = count - 1; i >= 0; --i) CHECK_OK(dsopt_gather_wait(opt, i));
      break;
    case 1: {  // bucket by bucket
      int64_t buckets = 0;
      CHECK_OK(dsopt_gather_num_buckets(opt, &buckets));
      for (int64_t b = 0; b < buckets; ++b) CHECK_OK(dsopt_gather_wait_bucket(opt, b));
      break;
    }
    default:
      CHECK_OK(dsopt_gather_wait(opt, -1));
  }
  int64_t pending = -1;
  CHECK_OK(dsopt_gather_pending(opt, &pending));
  CHECK_EQ_INT(pending, 0);
}

bool same_info(const std::string& label, int step, const dsopt_step_info& a, const dsopt_step_info& b) {
  const bool same = a.skipped == b.skipped && a.step == b.step && a.phase == b.phase &&
                    same_double(a.loss_scale, b.loss_scale) && a.bytes_sent == b.bytes_sent;
  return CHECKF(same, "%s step %d: step info equal with and without deferral (skipped %d/%d, step %lld/%lld,"
                " bytes %llu/%llu)", label.c_str(), step, a.skipped, b.skipped,
                static_cast<long long>(a.step), static_cast<long long>(b.step),
                static_cast<unsigned long long>(a.bytes_sent), static_cast<unsigned long long>(b.bytes_sent));
}

void run_case(const Case& c, int rank, uint64_t seed) {
  const std::string label = c.name;
  rng r = rng_seeded(seed);  // the same initial parameters on every rank
  TensorSet deferred_params, plain_params;
  for (int64_t n : kSizes) {
    std::vector<uint8_t> bytes = random_bytes(&r, n, c.dtype, 0.5);
    deferred_params.add(n, c.dtype, 0, bytes);
    plain_params.add(n, c.dtype, 0, bytes);
  }
  const int64_t count = int64_t(deferred_params.size());
  MPI_Comm dup_a, dup_b;
  dsopt_comm* comm_a = dup_comm(&dup_a);
  dsopt_comm* comm_b = dup_comm(&dup_b);
  dsopt_optimizer *a = nullptr, *b = nullptr;
  std::vector<dsopt_tensor> ta = deferred_params.device_tensors(), tb = plain_params.device_tensors();
  const std::string cfg_a = config(c, true), cfg_b = config(c, false);
  if (!CHECKF(dsopt_create(&a, cfg_a.c_str(), comm_a, ta.data(), count) == DSOPT_OK, "%s: create (%s)",
              label.c_str(), dsopt_last_error()) ||
      !CHECKF(dsopt_create(&b, cfg_b.c_str(), comm_b, tb.data(), count) == DSOPT_OK, "%s: create (%s)",
              label.c_str(), dsopt_last_error()))
    MPI_Abort(MPI_COMM_WORLD, 1);
  int64_t buckets = 0;
  CHECK_OK(dsopt_gather_num_buckets(a, &buckets));
  CHECKF(buckets > 1, "%s: the parameters are gathered in several buckets (%lld)", label.c_str(),
         static_cast<long long>(buckets));

  r = rng_for(seed, uint64_t(rank) + 1, 0);  // each rank's own gradients
  for (int step = 0; step < kSteps; ++step) {
    TensorSet grads;
    for (int64_t n : kSizes) grads.add(n, c.dtype, 0, random_bytes(&r, n, c.dtype, 0.1));
    if (step == c.overflow_step && rank == 1) {
      element_set(grads.host[3].data(), c.dtype, 5, INFINITY);
      grads.upload();
    }
    std::vector<dsopt_tensor> g = grads.device_tensors();
    dsopt_step_info ia = new_info(), ib = new_info();
    const int ra = dsopt_step(a, g.data(), count, &ia);
    const int rb = dsopt_step(b, g.data(), count, &ib);
    CHECKF(ra == rb, "%s step %d: the same status with and without deferral (%d, %d: %s)", label.c_str(), step,
           ra, rb, dsopt_last_error());
    wait_for(a, step, count);
    same_info(label, step, ia, ib);
    for (int64_t i = 0; i < count; ++i) {
      const std::vector<uint8_t> pa = deferred_params.device[size_t(i)].to_host();
      const std::vector<uint8_t> pb = plain_params.device[size_t(i)].to_host();
      const int64_t at = first_difference(pa, pb);
      CHECKF(at < 0, "%s step %d: tensor %lld bit-identical with and without deferral (first byte apart %lld)",
             label.c_str(), step, static_cast<long long>(i), static_cast<long long>(at));
      if (i == count - 1)
        CHECKF(same_on_every_rank(pa.data(), pa.size()), "%s step %d: the parameters the same on every rank",
               label.c_str(), step);
    }
  }
  uint64_t ha = 0, da = 0, hb = 0, db = 0;
  CHECK_OK(dsopt_memory_usage(a, &ha, &da));
  CHECK_OK(dsopt_memory_usage(b, &hb, &db));
  CHECKF(ha == hb && da == db, "%s: the same memory with and without deferral (host %llu/%llu, device %llu/%llu)",
         label.c_str(), static_cast<unsigned long long>(ha), static_cast<unsigned long long>(hb),
         static_cast<unsigned long long>(da), static_cast<unsigned long long>(db));
  // One more step whose gathers are left in flight: the state save waits for them.
  TensorSet grads;
  for (int64_t n : kSizes) grads.add(n, c.dtype, 0, random_bytes(&r, n, c.dtype, 0.1));
  std::vector<dsopt_tensor> g = grads.device_tensors();
  CHECK_OK(dsopt_step(a, g.data(), count, nullptr));
  CHECK_OK(dsopt_step(b, g.data(), count, nullptr));
  const std::vector<uint8_t> blob_a = save_state(a), blob_b = save_state(b);
  CHECKF(first_difference(blob_a, blob_b) < 0, "%s: state blobs bit-identical with and without deferral",
         label.c_str());
  dsopt_destroy(a);
  dsopt_destroy(b);
  dsopt_comm_destroy(comm_a);
  dsopt_comm_destroy(comm_b);
  MPI_Comm_free(&dup_a);
  MPI_Comm_free(&dup_b);
  if (rank == 0) std::printf("%s: %lld buckets, %d steps\n", label.c_str(), static_cast<long long>(buckets),
                             kSteps + 1);
}


}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rank = world_rank();
  std::snprintf(check_prefix, sizeof check_prefix, "rank %d: ", rank);
  skip_unless_every_rank_has_a_device();
  cuda_or_die(cudaSetDevice(0), "cudaSetDevice");
  if (!CHECK_EQ_INT(world_size(), 2) ||
      !CHECKF(provided == MPI_THREAD_MULTIPLE, "MPI provides MPI_THREAD_MULTIPLE (%d)", provided)) {
    MPI_Finalize();
    return check_finish();
  }
  uint64_t seed = 700;
  for (const Case& c : kCases) run_case(c, rank, seed++);
  return finish_on_every_rank();
}

// dsopt_create / step / state / lr entry points.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "api/config.hpp"
#include "api/guard.hpp"
#include "api/handles.hpp"
#include "api/versioned_struct.hpp"
#include "facade/creation.hpp"

using namespace dsopt;

namespace {

// Every call on an optimizer first waits for the parameter allgather still
// in flight (docs/guides/zero.md "Deferred allgather"), so that nothing
// reads or changes half-gathered parameters; the dsopt_gather_* calls wait
// only as they say.
const char* const kSettling = "a call waiting for the deferred parameter allgather";
const dsopt::Optimizer& impl(const dsopt_optimizer* opt) {
  require_nonnull(opt, "opt");
  opt->impl->wait_gathers(-1, kSettling);
  return *opt->impl;
}
dsopt::Optimizer& impl(dsopt_optimizer* opt) {
  require_nonnull(opt, "opt");
  opt->impl->wait_gathers(-1, kSettling);
  return *opt->impl;
}
// The optimizer as it is, gathers in flight or not.
dsopt::Optimizer& unsettled(const dsopt_optimizer* opt) {
  require_nonnull(opt, "opt");
  return *opt->impl;
}

void check_lr(double lr) {
  if (!std::isfinite(lr) || lr < 0)
    fail(DSOPT_EINVAL, "lr must be a finite number >= 0, got " + std::to_string(lr));
}

// dsopt_memory_usage and dsopt_state_memory_usage: `which` of the optimizer.
int report_memory(const dsopt_optimizer* opt, uint64_t* host_bytes, uint64_t* device_bytes,
                  dsopt::Optimizer::MemoryUsage (dsopt::Optimizer::*which)() const) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    if (!host_bytes && !device_bytes) fail(DSOPT_EINVAL, "host_bytes and device_bytes are both NULL");
    const dsopt::Optimizer::MemoryUsage m = (o.*which)();
    if (host_bytes) *host_bytes = m.host;
    if (device_bytes) *device_bytes = m.device;
  });
}

}  // namespace

extern "C" {

DSOPT_API int dsopt_create(dsopt_optimizer** out, const char* config_json, dsopt_comm* comm,
                           const dsopt_tensor* params, int64_t num_params) {
  return guarded([&] {
    require_nonnull(out, "out");
    require_nonnull(comm, "comm");
    comm->impl->prepare();  // collective: every rank, before anything can fail
    auto opt = std::make_unique<dsopt_optimizer>();
    const auto parse = [&] {
      OptimizerConfig cfg = parse_config(config_json);
      opt->config_text = cfg.canonical;
      return cfg;
    };
    opt->impl = create_optimizer(*comm->impl, parse, params, num_params);
    *out = opt.release();
  });
}

DSOPT_API int dsopt_step(dsopt_optimizer* opt, const dsopt_tensor* grads, int64_t num_grads,
                         dsopt_step_info* info) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    if (info) check_versioned(*info, sizeof(uint32_t), "dsopt_step_info");
    const StepResult r = o.step(grads, num_grads);
    if (info) {
      dsopt_step_info full;
      full.skipped = r.skipped ? 1 : 0;
      full.compressed = r.compressed ? 1 : 0;
      full.reserved = 0;
      full.step = r.step;
      full.loss_scale = r.loss_scale;
      full.grad_norm = r.grad_norm;
      full.bytes_sent = r.bytes_sent;
      full.consecutive_skips = r.consecutive_skips;
      full.phase = r.phase;
      full.reserved2 = 0;
      full.grads_replicated = r.grads_replicated ? 1 : 0;
      full.diverging = r.diverging ? 1 : 0;
      full.bytes_inter_node = r.bytes_inter_node;
      write_versioned(*info, full, sizeof(uint32_t), "dsopt_step_info");
    }
    if (!r.alarm.empty()) fail(DSOPT_ENONFINITE, r.alarm);
  });
}

DSOPT_API int dsopt_rebind_params(dsopt_optimizer* opt, const dsopt_tensor* params,
                                  int64_t num_params) {
  return guarded([&] { impl(opt).rebind_params(params, num_params); });
}

DSOPT_API int dsopt_grad_ready(dsopt_optimizer* opt, int64_t param_index, const dsopt_tensor* grad) {
  return guarded([&] { impl(opt).grad_ready(param_index, grad); });
}

DSOPT_API int dsopt_set_lr(dsopt_optimizer* opt, double lr) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    check_lr(lr);
    o.set_lr(lr);
  });
}

DSOPT_API int dsopt_set_gradient_clipping(dsopt_optimizer* opt, double max_norm) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    if (!(max_norm >= 0.0) || !std::isfinite(max_norm))
      fail(DSOPT_EINVAL, "gradient_clipping must be a finite number >= 0 (0: off), got " +
                          std::to_string(max_norm));
    o.set_gradient_clipping(max_norm);
  });
}

DSOPT_API int dsopt_get_threads(const dsopt_optimizer* opt, int32_t* out_threads) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_threads, "out_threads");
    *out_threads = o.threads();
  });
}

DSOPT_API int dsopt_get_gradient_clipping(const dsopt_optimizer* opt, double* out_max_norm) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_max_norm, "out_max_norm");
    *out_max_norm = o.gradient_clipping();
  });
}

DSOPT_API int dsopt_set_group_lr(dsopt_optimizer* opt, int32_t group, double lr) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    check_lr(lr);
    o.set_group_lr(group, lr);
  });
}

DSOPT_API int dsopt_get_lr(const dsopt_optimizer* opt, int32_t group, double* out_lr) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_lr, "out_lr");
    *out_lr = o.lr(group);
  });
}

DSOPT_API int dsopt_get_group_param(const dsopt_optimizer* opt, int32_t group, const char* name,
                                    double* out_value) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(name, "name");
    require_nonnull(out_value, "out_value");
    *out_value = o.group_param(group, name);
  });
}

DSOPT_API int dsopt_set_group_param(dsopt_optimizer* opt, int32_t group, const char* name,
                                    double value) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    require_nonnull(name, "name");
    o.set_group_param(group, name, value);
  });
}

DSOPT_API int dsopt_get_state_view(dsopt_optimizer* opt, int64_t param_index, const char* name,
                                   dsopt_state_view* out) {
  return guarded([&] {
    dsopt::Optimizer& o = impl(opt);
    require_nonnull(name, "name");
    require_nonnull(out, "out");
    check_versioned(*out, sizeof(uint32_t), "dsopt_state_view");
    const dsopt::Optimizer::StateView v = o.state_view(param_index, name);
    int32_t group = 0;
    const int64_t numel = o.param_numel(param_index, &group);
    dsopt_state_view full;
    full.device = v.on_device ? DSOPT_COMM_CUDA : DSOPT_COMM_HOST;
    full.tensor = dsopt_tensor{v.data, v.numel, DSOPT_FLOAT32, group};
    full.offset = v.offset;
    full.param_numel = numel;
    write_versioned(*out, full, sizeof(uint32_t), "dsopt_state_view");
  });
}

DSOPT_API int dsopt_state_names(const dsopt_optimizer* opt, const char** out_names) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_names, "out_names");
    *out_names = o.state_names().c_str();
  });
}

DSOPT_API int dsopt_get_param_step(const dsopt_optimizer* opt, int64_t param_index,
                                   int64_t* out_step) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_step, "out_step");
    *out_step = o.param_step(param_index);
  });
}

DSOPT_API int dsopt_set_param_step(dsopt_optimizer* opt, int64_t param_index, int64_t step) {
  return guarded([&] { impl(opt).set_param_step(param_index, step); });
}

DSOPT_API int dsopt_num_groups(const dsopt_optimizer* opt, int32_t* out_count) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_count, "out_count");
    *out_count = o.num_groups();
  });
}

DSOPT_API int dsopt_get_loss_scale(const dsopt_optimizer* opt, double* out_scale) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_scale, "out_scale");
    *out_scale = o.loss_scale();
  });
}

DSOPT_API int dsopt_state_size(const dsopt_optimizer* opt, uint64_t* out_size) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(out_size, "out_size");
    o.require_intact("dsopt_state_size");
    *out_size = o.save(nullptr, 0);
  });
}

DSOPT_API int dsopt_state_save(const dsopt_optimizer* opt, void* dst, uint64_t capacity,
                               uint64_t* out_written) {
  return guarded([&] {
    const dsopt::Optimizer& o = impl(opt);
    require_nonnull(dst, "dst");
    o.require_intact("dsopt_state_save");
    const uint64_t need = o.save(nullptr, 0);
    if (capacity < need) {
      if (out_written) *out_written = need;
      fail(DSOPT_EBUFS, "dsopt_state_save: the buffer holds " + std::to_string(capacity) +
                            " bytes, the state needs " + std::to_string(need));
    }
    const uint64_t written = o.save(dst, capacity);
    if (out_written) *out_written = written;
  });
}

DSOPT_API int dsopt_set_momentum_mask(dsopt_optimizer* opt, int64_t param_index,
                                      const dsopt_tensor* mask) {
  return guarded([&] { impl(opt).set_momentum_mask(param_index, mask); });
}

DSOPT_API int dsopt_state_load(dsopt_optimizer* opt, const void* src, uint64_t size) {
  return guarded([&] { impl(opt).load(src, size, 0); });
}

DSOPT_API int dsopt_state_load_ex(dsopt_optimizer* opt, const void* src, uint64_t size,
                                  uint32_t flags, int32_t* out_reset) {
  if (out_reset) *out_reset = 0;
  return guarded([&] {
    const bool reset = impl(opt).load(src, size, flags);
    if (out_reset) *out_reset = reset ? 1 : 0;
  });
}

DSOPT_API int dsopt_state_load_shards(dsopt_optimizer* opt, const void* const* blobs,
                                      const uint64_t* sizes, int64_t num_blobs) {
  return guarded([&] { impl(opt).load_shards(blobs, sizes, num_blobs); });
}

DSOPT_API int dsopt_memory_usage(const dsopt_optimizer* opt, uint64_t* host_bytes,
                                 uint64_t* device_bytes) {
  return report_memory(opt, host_bytes, device_bytes, &dsopt::Optimizer::memory_usage);
}

DSOPT_API int dsopt_state_memory_usage(const dsopt_optimizer* opt, uint64_t* host_bytes,
                                       uint64_t* device_bytes) {
  return report_memory(opt, host_bytes, device_bytes, &dsopt::Optimizer::state_memory_usage);
}

DSOPT_API int dsopt_gather_num_buckets(const dsopt_optimizer* opt, int64_t* out_count) {
  return guarded([&] {
    const dsopt::Optimizer& o = unsettled(opt);
    require_nonnull(out_count, "out_count");
    *out_count = o.gather_buckets();
  });
}

DSOPT_API int dsopt_gather_bucket_of(const dsopt_optimizer* opt, int64_t param_index,
                                     int64_t* out_bucket) {
  return guarded([&] {
    const dsopt::Optimizer& o = unsettled(opt);
    require_nonnull(out_bucket, "out_bucket");
    *out_bucket = o.gather_bucket_of(param_index);
  });
}

DSOPT_API int dsopt_gather_pending(dsopt_optimizer* opt, int64_t* out_pending) {
  return guarded([&] {
    dsopt::Optimizer& o = unsettled(opt);
    require_nonnull(out_pending, "out_pending");
    *out_pending = o.gathers_pending();
  });
}

DSOPT_API int dsopt_gather_wait_bucket(dsopt_optimizer* opt, int64_t bucket) {
  return guarded([&] {
    dsopt::Optimizer& o = unsettled(opt);
    if (bucket < -1 || bucket >= std::max<int64_t>(o.gather_buckets(), 1))
      fail(DSOPT_EINVAL, "dsopt_gather_wait_bucket: bucket " + std::to_string(bucket) +
                             " is out of range (-1: every bucket; the optimizer has " +
                             std::to_string(o.gather_buckets()) + ")");
    o.wait_gathers(bucket, "dsopt_gather_wait_bucket");
  });
}

DSOPT_API int dsopt_gather_wait(dsopt_optimizer* opt, int64_t param_index) {
  return guarded([&] {
    dsopt::Optimizer& o = unsettled(opt);
    if (param_index == -1) return o.wait_gathers(-1, "dsopt_gather_wait");
    const int64_t bucket = o.gather_bucket_of(param_index);  // range check
    if (bucket >= 0) o.wait_gathers(bucket, "dsopt_gather_wait");
  });
}

DSOPT_API int dsopt_gather_order(dsopt_optimizer* opt, const int64_t* param_order, int64_t count) {
  return guarded([&] { impl(opt).set_gather_order(param_order, count); });
}

DSOPT_API void dsopt_destroy(dsopt_optimizer* opt) { delete opt; }
}

// dsopt_comm_*: wrappers around the caller's communicators.
#include "api/guard.hpp"
#include "api/handles.hpp"
#include "api/versioned_struct.hpp"

using namespace dsopt;

namespace {
int wrap(dsopt_comm** out, std::unique_ptr<Comm> (*make)(int64_t, void*, void*), int64_t h,
         void* a, void* b) {
  return guarded([&] {
    require_nonnull(out, "out");
    auto c = std::make_unique<dsopt_comm>();
    c->impl = make(h, a, b);
    *out = c.release();
  });
}
}  // namespace

extern "C" {

DSOPT_API int dsopt_comm_create_local(dsopt_comm** out) {
  return wrap(out, [](int64_t, void*, void*) { return make_local_comm(); }, 0, nullptr, nullptr);
}

DSOPT_API int dsopt_comm_create_mpi(dsopt_comm** out, int64_t mpi_comm_f) {
  return wrap(out, [](int64_t h, void*, void*) { return make_mpi_comm(h); }, mpi_comm_f, nullptr,
              nullptr);
}

DSOPT_API int dsopt_comm_create_nccl(dsopt_comm** out, struct ncclComm* comm,
                                     struct CUstream_st* stream) {
  if (out && !comm) {
    return guarded([] { fail(DSOPT_EINVAL, "comm (the ncclComm_t) is NULL"); });
  }
  return wrap(out, [](int64_t, void* c, void* s) { return make_nccl_comm(c, s); }, 0, comm, stream);
}

DSOPT_API int dsopt_comm_create_custom(dsopt_comm** out, const dsopt_comm_ops* ops, void* user) {
  return guarded([&] {
    require_nonnull(out, "out");
    require_nonnull(ops, "ops");
    // error_message and release are optional: NULL past a caller's struct_size.
    dsopt_comm_ops defaults{};
    const dsopt_comm_ops full = read_versioned(*ops, defaults, offsetof(dsopt_comm_ops, error_message),
                                               "dsopt_comm_ops");
    auto c = std::make_unique<dsopt_comm>();
    c->impl = make_custom_comm(full, user);
    *out = c.release();
  });
}

DSOPT_API int dsopt_comm_set_nodes(dsopt_comm* comm, dsopt_comm* node, dsopt_comm* rail) {
  return guarded([&] {
    require_nonnull(comm, "comm");
    if (!node && !rail) return comm->impl->set_given_nodes(nullptr, nullptr);
    require_nonnull(node, "node");
    require_nonnull(rail, "rail");
    if (node == comm || rail == comm || node == rail)
      fail(DSOPT_EINVAL, "node and rail must be two communicators other than comm");
    const int64_t world = int64_t(node->impl->size()) * rail->impl->size();
    if (world != comm->impl->size())
      fail(DSOPT_EINVAL, "a node communicator of " + std::to_string(node->impl->size()) +
                             " ranks and a rail communicator of " + std::to_string(rail->impl->size()) +
                             " do not make a world of " + std::to_string(comm->impl->size()));
    comm->impl->set_given_nodes(node->impl.get(), rail->impl.get());
  });
}

DSOPT_API int dsopt_comm_set_shards(dsopt_comm* comm, dsopt_comm* shards) {
  return guarded([&] {
    require_nonnull(comm, "comm");
    if (shards == comm) fail(DSOPT_EINVAL, "shards must be another communicator than comm");
    comm->impl->set_given_shards(shards ? shards->impl.get() : nullptr);
  });
}

DSOPT_API int dsopt_comm_rank(const dsopt_comm* comm) { return comm ? comm->impl->rank() : -1; }
DSOPT_API int dsopt_comm_size(const dsopt_comm* comm) { return comm ? comm->impl->size() : -1; }
DSOPT_API void dsopt_comm_destroy(dsopt_comm* comm) { delete comm; }
}

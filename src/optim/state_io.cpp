#include "optim/state_io.hpp"

#include <cstring>
#include <string>

#include "base/error.hpp"
#include "state/section_names.hpp"

namespace dsopt {
namespace {

std::string describe(const BlobParam& p) {
  return "numel " + std::to_string(p.numel) + ", dtype " +
         (is_valid_dtype(p.dtype) ? dtype_name(DType(p.dtype)) : std::to_string(p.dtype)) +
         ", group " + std::to_string(p.group);
}

void check_shapes(const std::vector<BlobParam>& saved, const std::vector<BlobParam>& live) {
  if (saved.size() != live.size())
    fail(DSOPT_EMISMATCH, "state blob has " + std::to_string(saved.size()) +
                              " parameters, this optimizer has " + std::to_string(live.size()));
  for (size_t i = 0; i < saved.size(); ++i)
    if (!(saved[i] == live[i]))
      fail(DSOPT_EMISMATCH, "state blob parameter " + std::to_string(i) + " has " +
                                describe(saved[i]) + ", this optimizer's has " + describe(live[i]));
}

}  // namespace

StateIO::StateIO(Comm& comm, ParamSet& params, Kernels& kernels, const CommonState& common,
                 std::function<std::string()> algorithm, std::function<void(StateSchema&)> describe)
    : comm_(comm),
      params_(params),
      kernels_(kernels),
      algorithm_(std::move(algorithm)),
      describe_(std::move(describe)) {
  describe_common_state(common_, common);
}

const StateSchema& StateIO::state() const {
  if (!state_) {
    auto schema = std::make_unique<StateSchema>();
    describe_masters(*schema, params_, kernels_);
    describe_(*schema);  // describing changes nothing
    state_ = std::move(schema);
  }
  return *state_;
}

uint64_t StateIO::save(void* dst, uint64_t capacity) const {
  BlobWriter w(dst, capacity);
  w.header(BlobHeader{algorithm_(), uint32_t(comm_.size()), uint32_t(comm_.rank()), params_.shapes()});
  w.begin_sections(common_.section_count() + state().section_count());
  common_.save(w);
  state().save(w);
  return w.finish();
}

std::unique_ptr<const BlobReader> StateIO::read(const void* src, uint64_t size) const {
  if (!src) fail(DSOPT_EINVAL, "the blob pointer is NULL");
  auto reader = std::make_unique<const BlobReader>(src, size);
  // Values no optimizer writes are corrupt, whatever else the blob holds.
  common_.check_values(*reader);
  const BlobHeader& h = reader->header();
  const std::string algorithm = algorithm_();
  if (h.algorithm != algorithm)
    fail(DSOPT_EMISMATCH, "state blob is from a " + h.algorithm + " optimizer, this one is " + algorithm);
  check_shapes(h.params, params_.shapes());
  common_.check(*reader);
  return reader;
}

StateIO::Blobs StateIO::read_set(const void* const* blobs, const uint64_t* sizes, int64_t count) const {
  if (!blobs) fail(DSOPT_EINVAL, "blobs is NULL");
  if (!sizes) fail(DSOPT_EINVAL, "sizes is NULL");
  if (count < 1) fail(DSOPT_EINVAL, "num_blobs must be >= 1, got " + std::to_string(count));
  Blobs set;
  for (int64_t i = 0; i < count; ++i) {
    try {
      set.push_back(read(blobs[i], sizes[i]));
    } catch (const Error& e) {
      fail(e.status(), "blobs[" + std::to_string(i) + "]: " + e.what());
    }
  }
  if (count == 1) return set;  // one replica, or the only shard of a one-rank run
  const auto run = [](const BlobReader& r) {
    uint64_t id = 0;
    if (r.has(kRunSection)) std::memcpy(&id, r.section(kRunSection, 8), 8);
    return id;
  };
  const auto same = [&](const BlobReader& a, const BlobReader& b, const char* name) {
    if (a.has(name) != b.has(name)) return false;
    if (!a.has(name)) return true;
    const uint64_t n = a.section_size(name);
    return b.section_size(name) == n && std::memcmp(a.section(name, n), b.section(name, n), n) == 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const BlobHeader& h = set[size_t(i)]->header();
    const std::string who = "blobs[" + std::to_string(i) + "]";
    if (h.world_size != uint64_t(count))
      fail(DSOPT_EMISMATCH, who + " was saved by a run of " + std::to_string(h.world_size) +
                                " ranks, but " + std::to_string(count) +
                                " blobs were given (pass all blobs of that run, or one)");
    if (h.rank != uint64_t(i))
      fail(DSOPT_EMISMATCH, who + " is the blob of rank " + std::to_string(h.rank) +
                                " (pass the blobs in rank order, each once)");
    const BlobReader& first = *set[0];
    if (run(*set[size_t(i)]) != run(first))
      fail(DSOPT_EMISMATCH, who + " and blobs[0] were saved by different runs");
    if (!same(*set[size_t(i)], first, kStepsSection) || !same(*set[size_t(i)], first, kScalerSection) ||
        !same(*set[size_t(i)], first, kLrSection) ||
        !same(*set[size_t(i)], first, kParamStepsSection) ||
        !same(*set[size_t(i)], first, kHyperSection))
      fail(DSOPT_EMISMATCH, who + " and blobs[0] were saved at different steps (their step "
                                  "counters, learning rates or loss scalers differ)");
  }
  return set;
}

void StateIO::restore(const BlobReader& r) const {
  common_.restore(r);
  state().restore(r);
}

}  // namespace dsopt

// dsopt_codec_*: compressed ZeRO's codes for the caller's own collectives
// (include/dsopt.h "Codecs"). Every argument is checked here before the
// codec writes anything, so a failed call changes nothing.
#include <climits>
#include <cstring>
#include <string>

#include "api/guard.hpp"
#include "api/handles.hpp"
#include "api/versioned_struct.hpp"

using namespace dsopt;

namespace {

// The smallest layout of dsopt_codec_options: all of its first version.
constexpr size_t kOptionsMinSize = sizeof(dsopt_codec_options);

CodecRuns& impl(const dsopt_codec* codec) {
  require_nonnull(codec, "codec");
  return *codec->impl;
}

void check_n(int64_t n) {
  if (n <= 0) fail(DSOPT_EINVAL, "n must be > 0, got " + std::to_string(n));
}

// runs * bytes, failing where it does not fit in 63 bits.
uint64_t times(int64_t runs, int64_t bytes) {
  if (bytes > 0 && runs > INT64_MAX / bytes)
    fail(DSOPT_EINVAL, std::to_string(runs) + " runs of " + std::to_string(bytes) + " bytes overflow");
  return uint64_t(runs) * uint64_t(bytes);
}

// The fp32 values of a dsopt_tensor cut into `runs` runs: their length n.
int64_t run_length(const dsopt_tensor* t, int64_t runs, const char* what) {
  require_nonnull(t, what);
  const std::string w = what;
  if (!t->data) fail(DSOPT_EINVAL, w + "->data is NULL");
  if (t->numel <= 0) fail(DSOPT_EINVAL, w + "->numel must be > 0, got " + std::to_string(t->numel));
  if (t->dtype != DSOPT_FLOAT32)
    fail(DSOPT_EINVAL, w + "->dtype is " + std::to_string(t->dtype) + ": codecs take fp32 values (DSOPT_FLOAT32)");
  if (runs < 1 || runs > INT_MAX)
    fail(DSOPT_EINVAL, "runs must be in [1, " + std::to_string(INT_MAX) + "], got " + std::to_string(runs));
  if (t->numel % runs)
    fail(DSOPT_EINVAL, w + "->numel " + std::to_string(t->numel) + " is not a multiple of runs " +
                           std::to_string(runs));
  return t->numel / runs;
}

struct Span {
  const void* p;
  uint64_t bytes;
  const char* what;
};

void reject_overlap(const Span& a, const Span& b) {
  if (!a.p || !b.p) return;
  const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
  if (a0 < b0 + b.bytes && b0 < a0 + a.bytes)
    fail(DSOPT_EINVAL, std::string(a.what) + " and " + b.what + " overlap: the codec reads one while it writes the other");
}

}  // namespace

extern "C" {

DSOPT_API int dsopt_codec_create(dsopt_codec** out, const char* name, const dsopt_codec_options* options) {
  return guarded([&] {
    require_nonnull(out, "out");
    require_nonnull(name, "name");
    dsopt_codec_options o{};
    o.struct_size = sizeof o;
    o.device = DSOPT_COMM_HOST;
    if (options) o = read_versioned(*options, o, kOptionsMinSize, "dsopt_codec_options");
    if (o.device != DSOPT_COMM_HOST && o.device != DSOPT_COMM_CUDA)
      fail(DSOPT_EINVAL, "options->device must be DSOPT_COMM_HOST or DSOPT_COMM_CUDA, got " + std::to_string(o.device));
    if (o.reserved != 0) fail(DSOPT_EINVAL, "options->reserved must be 0, got " + std::to_string(o.reserved));
    auto c = std::make_unique<dsopt_codec>();
    c->impl = std::make_unique<CodecRuns>(name, o.block, o.device == DSOPT_COMM_CUDA, o.threads, o.stream);
    *out = c.release();
  });
}

DSOPT_API int dsopt_codec_encoded_size(const dsopt_codec* codec, int64_t n, uint64_t* out_bytes) {
  return guarded([&] {
    const CodecRuns& c = impl(codec);
    require_nonnull(out_bytes, "out_bytes");
    check_n(n);
    *out_bytes = uint64_t(c.encoded_bytes(n));
  });
}

DSOPT_API int dsopt_codec_residual_size(const dsopt_codec* codec, int64_t n, uint64_t* out_bytes) {
  return guarded([&] {
    const CodecRuns& c = impl(codec);
    require_nonnull(out_bytes, "out_bytes");
    check_n(n);
    *out_bytes = uint64_t(c.residual_bytes(n));
  });
}

DSOPT_API int dsopt_codec_encode(dsopt_codec* codec, const dsopt_tensor* values, int64_t runs, void* residual,
                                 uint64_t residual_size, void* dst, uint64_t capacity) {
  return guarded([&] {
    CodecRuns& c = impl(codec);
    const int64_t n = run_length(values, runs, "values");
    require_nonnull(dst, "dst");
    const Span in{values->data, times(runs, 4 * n), "values"};
    if (residual) {
      const uint64_t need = times(runs, c.residual_bytes(n));
      if (residual_size != need)
        fail(DSOPT_EINVAL, "residual_size is " + std::to_string(residual_size) + " bytes; " +
                               std::to_string(runs) + " residual runs of " + std::to_string(n) +
                               " values are " + std::to_string(need));
    }
    const Span err{residual, residual ? residual_size : 0, "residual"};
    const uint64_t need = times(runs, c.encoded_bytes(n));
    if (capacity < need)
      fail(DSOPT_EBUFS, "dst holds " + std::to_string(capacity) + " bytes; the codes of " + std::to_string(runs) +
                            " runs of " + std::to_string(n) + " values are " + std::to_string(need));
    const Span out{dst, need, "dst"};
    reject_overlap(in, out);
    reject_overlap(err, out);
    reject_overlap(in, err);
    c.require_on_device(values->data, "values->data");
    if (residual) c.require_on_device(residual, "residual");
    c.require_on_device(dst, "dst");
    c.encode(static_cast<const float*>(values->data), n, runs, static_cast<uint8_t*>(residual),
             static_cast<uint8_t*>(dst));
  });
}

DSOPT_API int dsopt_codec_decode_sum(dsopt_codec* codec, const void* codes, uint64_t size, int64_t runs,
                                     const dsopt_tensor* out) {
  return guarded([&] {
    CodecRuns& c = impl(codec);
    require_nonnull(codes, "codes");
    const int64_t n = run_length(out, 1, "out");
    if (runs < 1 || runs > INT_MAX)
      fail(DSOPT_EINVAL, "runs must be in [1, " + std::to_string(INT_MAX) + "], got " + std::to_string(runs));
    const uint64_t need = times(runs, c.encoded_bytes(n));
    if (size < need)
      fail(DSOPT_EINVAL, "codes hold " + std::to_string(size) + " bytes; " + std::to_string(runs) +
                             " runs of " + std::to_string(n) + " values are " + std::to_string(need));
    reject_overlap(Span{codes, need, "codes"}, Span{out->data, uint64_t(4 * n), "out"});
    c.require_on_device(codes, "codes");
    c.require_on_device(out->data, "out->data");
    c.decode_sum(static_cast<const uint8_t*>(codes), n, runs, static_cast<float*>(out->data));
  });
}

DSOPT_API int dsopt_codec_set_stream(dsopt_codec* codec, struct CUstream_st* stream) {
  return guarded([&] { impl(codec).set_stream(stream); });
}

DSOPT_API void dsopt_codec_destroy(dsopt_codec* codec) { delete codec; }
}

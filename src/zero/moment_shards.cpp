#include "zero/moment_shards.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "base/dtype.hpp"
#include "base/error.hpp"
#include "state/section_names.hpp"

namespace dsopt {
namespace {


// One blob's state, seen through its layout.
struct SourceBlob {
  StateLayout layout;
  const float* m;
  const float* v;  // nullptr: a rule with one moment (Lion)
  const float* masters;
};

SourceBlob view(const BlobReader& r, const std::vector<BlobParam>& params, size_t index,
                const MomentNames& moments) {
  const std::string who = "blobs[" + std::to_string(index) + "]";
  SourceBlob s;
  const char* masters_section;
  if (r.has(kZeroLayoutSection)) {
    const ZeroLayoutRecord z = decode_zero_layout(r);
    if (z.world != r.header().world_size || z.rank != r.header().rank)
      fail(DSOPT_ECORRUPT, who + ": its zero.layout section does not describe its header");
    std::vector<int64_t> numels;
    for (const BlobParam& p : params) numels.push_back(p.numel);
    const ShardLayout layout(numels, int(z.world), z.bucket_elems);
    if (z.world != r.header().world_size || z.rank != r.header().rank ||
        layout.shard_numel() != z.shard_numel)
      fail(DSOPT_ECORRUPT, who + ": its zero.layout section does not describe its header");
    s.layout = sharded_state_layout(layout, int(z.rank), params);
    // A run with a compressed parameter allgather kept masters of all S.
    if (s.layout.master_numel != z.master_numel)
      s.layout = sharded_state_layout(layout, int(z.rank), params, true);
    if (s.layout.master_numel != z.master_numel)
      fail(DSOPT_ECORRUPT, who + ": its zero.layout section records " +
                               std::to_string(z.master_numel) + " masters, which fits no layout");
    masters_section = kZeroMastersSection;
  } else {
    s.layout = replicated_state_layout(params);
    masters_section = kMastersSection;
  }
  if (!r.has(moments.section(0)))
    fail(DSOPT_EMISMATCH, who + " holds no moments named " + moments.section(0));
  const uint64_t state_bytes = uint64_t(s.layout.state_numel) * 4;
  s.m = reinterpret_cast<const float*>(r.section(moments.section(0), state_bytes));
  s.v = moments.count() > 1
            ? reinterpret_cast<const float*>(r.section(moments.section(1), state_bytes))
            : nullptr;
  s.masters = reinterpret_cast<const float*>(
      r.section(masters_section, uint64_t(s.layout.master_numel) * 4));
  return s;
}

// A source piece with the blob it lives in.
struct Located {
  const SourceBlob* blob;
  StatePiece piece;
};

}  // namespace

std::vector<uint8_t> encode(const ZeroLayoutRecord& z) {
  std::vector<uint8_t> out(kZeroLayoutBytes);
  uint8_t* p = out.data();
  std::memcpy(p, &z.stage, 4);
  std::memcpy(p + 4, &z.world, 4);
  std::memcpy(p + 8, &z.rank, 4);
  std::memcpy(p + 12, &z.bucket_elems, 8);
  std::memcpy(p + 20, &z.shard_numel, 8);
  std::memcpy(p + 28, &z.master_numel, 8);
  return out;
}

ZeroLayoutRecord decode_zero_layout(const BlobReader& r) {
  const uint8_t* p = r.section(kZeroLayoutSection, kZeroLayoutBytes);
  ZeroLayoutRecord z;
  std::memcpy(&z.stage, p, 4);
  std::memcpy(&z.world, p + 4, 4);
  std::memcpy(&z.rank, p + 8, 4);
  std::memcpy(&z.bucket_elems, p + 12, 8);
  std::memcpy(&z.shard_numel, p + 20, 8);
  std::memcpy(&z.master_numel, p + 28, 8);
  // world beyond INT32_MAX turned negative in ShardLayout (a zero bucket
  // size there, and an endless loop of buckets).
  if ((z.stage != 1 && z.stage != 2) || z.world < 1 || z.world > uint32_t(INT32_MAX) ||
      z.rank >= z.world || z.bucket_elems < 1 ||
      z.shard_numel < 0 || z.master_numel < 0 || z.master_numel > z.shard_numel)
    fail(DSOPT_ECORRUPT, "the zero.layout section holds impossible values");
  return z;
}

StateLayout replicated_state_layout(const std::vector<BlobParam>& params) {
  StateLayout s;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool half = params[i].dtype != int32_t(DType::F32);
    s.pieces.push_back(StatePiece{int64_t(i), 0, params[i].numel, s.state_numel,
                                  half ? s.master_numel : -1});
    s.state_numel += params[i].numel;
    if (half) s.master_numel += params[i].numel;
  }
  return s;
}

StateLayout sharded_state_layout(const ShardLayout& layout, int rank,
                                 const std::vector<BlobParam>& params, bool all_masters) {
  StateLayout s;
  s.state_numel = layout.shard_numel();
  for (const ShardFragment& f : layout.fragments(rank)) {
    const bool half = params[size_t(f.param)].dtype != int32_t(DType::F32);
    const int64_t master = all_masters ? f.shard_offset : half ? s.master_numel : -1;
    s.pieces.push_back(StatePiece{f.param, f.param_offset, f.numel, f.shard_offset, master});
    if (half) s.master_numel += f.numel;
  }
  if (all_masters) s.master_numel = s.state_numel;
  return s;
}

HostMomentState assemble_moment_state(const std::vector<std::shared_ptr<const BlobReader>>& blobs,
                                  const std::vector<BlobParam>& params, const StateLayout& target,
                                  const MomentNames& moments, const ReadParam& read_param) {
  const bool sharded = blobs[0]->has(kZeroLayoutSection);
  for (size_t i = 1; i < blobs.size(); ++i)
    if (blobs[i]->has(kZeroLayoutSection) != sharded)
      fail(DSOPT_EMISMATCH, "blobs[" + std::to_string(i) + "] and blobs[0] come from different "
                            "ZeRO stages (one replicated, one sharded)");
  // Replicated state: every blob holds all of it; the first one suffices.
  const size_t used = sharded ? blobs.size() : 1;
  std::vector<SourceBlob> sources;
  const bool second = moments.count() > 1;
  for (size_t i = 0; i < used; ++i) sources.push_back(view(*blobs[i], params, i, moments));

  // Every parameter's pieces, sorted; they must tile it exactly.
  std::vector<std::vector<Located>> by_param(params.size());
  for (const SourceBlob& s : sources)
    for (const StatePiece& p : s.layout.pieces) by_param[size_t(p.param)].push_back(Located{&s, p});
  for (size_t i = 0; i < params.size(); ++i) {
    auto& list = by_param[i];
    std::sort(list.begin(), list.end(), [](const Located& a, const Located& b) {
      return a.piece.param_offset < b.piece.param_offset;
    });
    int64_t at = 0;
    for (const Located& l : list) {
      if (l.piece.param_offset != at)
        fail(DSOPT_EMISMATCH, "the blobs do not hold parameter " + std::to_string(i) +
                                  " exactly once (elements from " + std::to_string(at) +
                                  (l.piece.param_offset > at ? " are missing)" : " appear twice)"));
      at += l.piece.numel;
    }
    if (at != params[i].numel)
      fail(DSOPT_EMISMATCH, "the blobs do not hold all of parameter " + std::to_string(i));
  }

  HostMomentState out;
  out.m.assign(size_t(target.state_numel), 0.0f);
  if (second) out.v.assign(size_t(target.state_numel), 0.0f);
  out.masters.assign(size_t(target.master_numel), 0.0f);
  for (const StatePiece& t : target.pieces) {
    const auto& list = by_param[size_t(t.param)];
    // The first source piece that ends after t begins.
    auto it = std::upper_bound(list.begin(), list.end(), t.param_offset,
                               [](int64_t x, const Located& l) {
                                 return x < l.piece.param_offset + l.piece.numel;
                               });
    for (; it != list.end() && it->piece.param_offset < t.param_offset + t.numel; ++it) {
      const StatePiece& s = it->piece;
      const int64_t lo = std::max(t.param_offset, s.param_offset);
      const int64_t hi = std::min(t.param_offset + t.numel, s.param_offset + s.numel);
      const int64_t n = hi - lo;
      const int64_t from = s.state_offset + (lo - s.param_offset);
      const int64_t to = t.state_offset + (lo - t.param_offset);
      std::memcpy(&out.m[size_t(to)], it->blob->m + from, size_t(n) * 4);
      if (second) std::memcpy(&out.v[size_t(to)], it->blob->v + from, size_t(n) * 4);
      const float* source_master =
          s.master_offset >= 0 ? it->blob->masters + s.master_offset + (lo - s.param_offset) : nullptr;
      if (t.master_offset >= 0) {
        float* master = &out.masters[size_t(t.master_offset + (lo - t.param_offset))];
        if (source_master)
          std::memcpy(master, source_master, size_t(n) * 4);
        else if (read_param)  // an fp32 parameter is its own master in the source
          read_param(t.param, lo, n, master);
        else
          fail(DSOPT_EINTERNAL, "a master of an fp32 parameter is needed but none is readable");
      } else if (source_master) {
        out.fp32_params.push_back(HostMomentState::ParamValues{
            t.param, lo, std::vector<float>(source_master, source_master + n)});
      }
    }
  }
  return out;
}

void write_param_values(const HostMomentState& state, const ParamSet& params, Kernels& kernels) {
  for (const HostMomentState::ParamValues& p : state.fp32_params) {
    auto* data = static_cast<float*>(params.params()[size_t(p.param)].data);
    kernels.copy_from_host(data + p.param_offset, p.values.data(), p.values.size() * 4);
  }
}

}  // namespace dsopt

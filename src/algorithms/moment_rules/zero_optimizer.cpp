#include "algorithms/moment_rules/zero_optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"

namespace dsopt {
namespace {

// This rank's part of parameter `param` under ZeRO: its pieces in the shard,
// merged where they follow each other (in the parameter, the moments and the
// masters), as one run. found is false when the rank holds none of it.
struct ShardRun {
  bool found = false;
  StatePiece piece{};
};

bool follows(const StatePiece& run, const StatePiece& p) {
  const int64_t n = run.numel;
  return p.param_offset == run.param_offset + n && p.state_offset == run.state_offset + n &&
         (p.master_offset < 0 || p.master_offset == run.master_offset + n);
}

ShardRun shard_run(const StateLayout& state, int64_t param, int64_t bucket_elems) {
  std::vector<StatePiece> runs;
  for (const StatePiece& p : state.pieces) {
    if (p.param != param) continue;
    if (!runs.empty() && follows(runs.back(), p))
      runs.back().numel += p.numel;
    else
      runs.push_back(p);
  }
  if (runs.size() > 1)
    fail(DSOPT_EINVAL,
         "parameter " + std::to_string(param) + " spans several reduce buckets (reduce_bucket_size " +
             std::to_string(bucket_elems) + " elements), so this rank's ZeRO shard holds it in " +
             std::to_string(runs.size()) + " separate runs and one view cannot show them; set "
             "\"reduce_bucket_size\" to at least the total numel of the parameters (the default "
             "does) to view its state");
  return runs.empty() ? ShardRun{} : ShardRun{true, runs[0]};
}

// Whether blob r holds its residual as int8 runs (else as fp32 values).
bool int8_residual(const BlobReader& r) {
  return StateSchema::saved_flag(r, kZeroFeedbackInt8Section, "residual format");
}

std::vector<int64_t> numels(const ParamSet& params) {
  std::vector<int64_t> n;
  for (const Param& p : params.params()) n.push_back(p.numel);
  return n;
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(OptimizerParts& parts)
    : ZeroOptimizer(parts, parts.config(), parts.comm()) {}

ZeroOptimizer::ZeroOptimizer(OptimizerParts& parts, const OptimizerConfig& cfg, Comm& comm)
    : AlgorithmImpl(parts),
      rule_(moment_rule(cfg)),
      offload_(cfg.zero.offload_cpu && parts_.kernels().device() == Device::Cuda),
      layout_(numels(parts_.params()), comm.size(), cfg.zero.reduce_bucket_size),
      compressed_params_(comm.size() > 1 && cfg.zero.compression.parameters != ParamCodec::None),
      state_(sharded_state_layout(layout_, comm.rank(), parts_.params().shapes(), compressed_params_)),
      masters_(state_kernels(), size_t(state_.master_numel) * 4),
      moments_(layout_.shard_numel(), state_kernels(), cfg.algorithm->moments),
      scratch_(parts_.kernels(),
               std::max(GradientReducer::scratch_bytes(layout_, cfg.zero.compression),
                        ParamGatherer::scratch_bytes(layout_, cfg.zero.allgather_bucket_size,
                                                     parts_.params(), cfg.zero.compression.parameters,
                                                     cfg.zero.compression.parameter_block))),
      reducer_(layout_, cfg.zero.stage, cfg.zero.reduce_scatter, cfg.zero.compression, comm,
               parts_.kernels(), parts_.mem(), parts_.params(), parts_.agreement(), parts_.runner(),
               scratch_.get()),
      gatherer_(layout_, cfg.zero.allgather_bucket_size, cfg.zero.compression.parameters,
                cfg.zero.compression.parameter_block, comm, parts_.kernels(), parts_.mem(), parts_.params(),
                scratch_.get()) {
  if (compressed_params_) {
    // The config refuses it (src/api/config.cpp): the gatherer reads device masters.
    if (offload_) fail(DSOPT_EINTERNAL, "a compressed parameter allgather with CPU offload");
    parts_.kernels().fill_zero(masters_.get(), masters_.bytes());  // the padding's masters stay 0
    gatherer_.set_masters(masters_.floats());
  }
  if (rule_ == MomentRule::Lamb) {
    // The config refuses it (src/api/config.cpp): the offloaded update is elementwise.
    if (offload_) fail(DSOPT_EINTERNAL, "LAMB under ZeRO with CPU offload");
    u_ = DeviceBuffer(parts_.kernels(), size_t(layout_.shard_numel()) * 4);
    sums_ = std::make_unique<ShardTensorSums>(layout_, comm.rank(), comm, parts_.kernels(), parts_.mem());
  }
  if (offload_) {
    offloaded_ = std::make_unique<OffloadedUpdate>(state_, parts_.params(), parts_.kernels(),
                                                   parts_.host_kernels(), cfg.zero.pin_memory,
                                                   cfg.zero.offload_tile,
                                                   masters_.floats(), moments_.exp_avg(),
                                                   moments_.exp_avg_sq(), cfg.algorithm->update);
    offloaded_->read_masters(true);
    return;
  }
  point_slots();
  for (const StatePiece& f : state_.pieces) {
    if (f.master_offset < 0) continue;  // an fp32 parameter is its own master
    const Param& p = parts_.params().params()[size_t(f.param)];
    const auto* data = static_cast<const uint8_t*>(p.data) + f.param_offset * int64_t(dtype_size(p.dtype));
    parts_.kernels().to_float(TensorRef{data, f.numel, p.dtype}, masters_.floats() + f.master_offset);
  }
}

void ZeroOptimizer::point_slots() {
  slots_.clear();
  for (const StatePiece& f : state_.pieces) {
    const Param& p = parts_.params().params()[size_t(f.param)];
    // Every element has a master with a compressed allgather, which alone
    // writes the caller's buffers (with the decoded values).
    const bool half = p.dtype != DType::F32 && !compressed_params_;
    auto* data = static_cast<uint8_t*>(p.data) + f.param_offset * int64_t(dtype_size(p.dtype));
    float* master = f.master_offset >= 0 ? masters_.floats() + f.master_offset
                                         : reinterpret_cast<float*>(data);
    slots_.push_back(moment_slot(master, half ? data : nullptr, half ? p.dtype : DType::F32,
                                 reducer_.shard() + f.state_offset, DType::F32,
                                 moments_.exp_avg() + f.state_offset,
                                 moments_.exp_avg_sq() ? moments_.exp_avg_sq() + f.state_offset : nullptr,
                                 f.numel, p.group));
    if (u_.get()) slots_.back().set(Operand::U, u_.floats() + f.state_offset);  // LAMB
  }
  slots_generation_ = parts_.params().generation();
}

const std::vector<UpdateSlot>& ZeroOptimizer::slots() {
  if (!offloaded_ && slots_generation_ != parts_.params().generation()) point_slots();
  return slots_;
}

void ZeroOptimizer::open_handover(int micro_batches) {
  reducer_.set_gradient_scale(parts_.loss_scale());
  reducer_.open_handover(micro_batches);
}

PreparedGrads ZeroOptimizer::prepare(const dsopt_tensor* grads, int64_t count) {
  reducer_.set_gradient_scale(parts_.loss_scale());
  return prepared(reducer_.reduce_at_once(grads, count, parts_.pipeline().wants_norm()));
}

PreparedGrads ZeroOptimizer::prepare_handed_over() {
  return prepared(reducer_.reduce_handed_over(parts_.pipeline().wants_norm()));
}

PreparedGrads ZeroOptimizer::prepared(const ReducedShard& reduced) {
  PreparedGrads out;  // grads empty: the update reads the shard
  out.skip = reduced.nonfinite && parts_.pipeline().config().skip_nonfinite;
  parts_.pipeline().set_multipliers(out, reduced.sumsq);
  return out;
}

UpdateOutcome ZeroOptimizer::update(const PreparedGrads& grads) {
  reducer_.commit_feedback();  // the step runs: its residual is the rank's now
  const auto param_of = [this](size_t k) { return state_.pieces[k].param; };
  if (offloaded_) {
    offloaded_->run(reducer_.shard(), adam_step_consts(parts_), grads.mul1, grads.mul2);
  } else {
    ShardTensorSums* sums = sums_.get();  // LAMB's whole-tensor norms
    update_moments(parts_, rule_, slots(), param_of, grads,
                   [sums](const std::vector<UpdateSlot>& fragments, std::initializer_list<Operand> streams) {
                     return sums->sums(fragments, streams);
                   });
  }
  // Deferred: the buckets arrive behind the caller's next forward
  // (docs/guides/zero.md "Deferred allgather").
  if (!parts_.gathers().defer_gathers(gatherer_.chunks(), gatherer_.bytes_per_gather(parts_.comm()),
                     [this](int64_t c) { gatherer_.gather_chunk(c); }))
    gatherer_.gather();
  return UpdateOutcome{};  // the pipeline summed the gradients in the reduction
}

ZeroLayoutRecord ZeroOptimizer::record() const {
  return ZeroLayoutRecord{parts_.config().zero.stage, uint32_t(parts_.comm().size()), uint32_t(parts_.comm().rank()),
                          layout_.bucket_elems(), layout_.shard_numel(), state_.master_numel};
}

void ZeroOptimizer::describe_state(StateSchema& s) {
  s.check([this](const BlobReader& r) { check_layout(r); })
      .record(kZeroLayoutSection, kZeroLayoutBytes,
              [this](FieldWriter& f) { f.add_bytes(encode(record())); }, nullptr, nullptr)
      .array(kZeroMastersSection, state_kernels(), [this] { return masters_.get(); },
             uint64_t(state_.master_numel) * 4)
      // The masters of this rank's 16-bit fragments (ParamSet keeps none
      // under ZeRO); the facade lists "master" with the 16-bit parameters.
      .view("master",
            [this](int64_t i, float* masters) {
              if (parts_.params().params()[size_t(i)].dtype == DType::F32) return StateSchema::Slice{};
              return shard_slice(i, masters, true);
            },
            [] { return false; });
  moments_.describe(s, [this](int64_t i, float* m) { return shard_slice(i, m, false); });
  if (reducer_.feedback()) {
    // Rank-local: check_layout has matched world, rank and buckets.
    s.check([](const BlobReader& r) {
       if (!r.has(kZeroFeedbackSection))
         fail(DSOPT_EMISMATCH, "the blob is from a run without gradient error feedback: load "
                               "it with dsopt_state_load_shards, which starts the residuals at "
                               "zero (nothing was changed)");
     })
        .flag(kZeroFeedbackInt8Section, "residual format", [] { return true; }, [](bool) {})
        .optional_record(kZeroFeedbackTopologySection, 8,
                         [this](FieldWriter& f) {
                           f.add(uint32_t(reducer_.residual_nodes()));
                           f.add(uint32_t(reducer_.residual_ranks_per_node()));
                         },
                         [](FieldReader& f) {
                           const uint32_t n = f.get<uint32_t>(), per_node = f.get<uint32_t>();
                           if (n < 1 || per_node < 1)
                             fail(DSOPT_ECORRUPT, "the zero.feedback_topology section holds an "
                                                  "impossible topology");
                         },
                         nullptr, nullptr)
        .array(kZeroFeedbackSection, parts_.kernels(), [this] { return reducer_.residual(); },
               [this](const BlobReader* r) {
                 if (!r) return uint64_t(reducer_.residual_bytes());
                 if (!int8_residual(*r)) return uint64_t(layout_.padded_numel()) * 4;
                 return uint64_t(GradientReducer::residual_bytes(
                     layout_, parts_.config().zero.compression.gradient_block,
                     int(saved_residual_topology(*r).first)));
               },
               [this](const BlobReader& r) { return residual_fits(r); })
        .then([this](const BlobReader& r) {
          if (residual_fits(r)) return;
          // Another topology's residual, or a load that resets rank-local
          // state: it starts again at zero (the load reports the reset).
          if (parts_.rank_local_world(1) == 0 || drops_rank_local(r)) {
            reducer_.reset_feedback();
            return;
          }
          // An fp32 residual (the flat form's): its int8 encoding.
          const uint64_t bytes = uint64_t(layout_.padded_numel()) * 4;
          reducer_.load_fp32_residual(reinterpret_cast<const float*>(r.section(kZeroFeedbackSection, bytes)));
        })
        .record(kZeroFeedbackScaleSection, 8,
                [this](FieldWriter& f) { f.add(reducer_.residual_scale()); },
                [](FieldReader& f) {
                  const double scale = f.get<double>();
                  if (!(scale > 0.0) || !std::isfinite(scale))
                    fail(DSOPT_ECORRUPT, "the zero.feedback_scale section holds an impossible scale");
                },
                [this](FieldReader& f) { reducer_.residual_scale() = f.get<double>(); });
  }
  s.then([this](const BlobReader&) { publish_parameters(); });
}

StateSchema::Slice ZeroOptimizer::shard_slice(int64_t i, float* array, bool masters) const {
  const ShardRun run = shard_run(state_, i, layout_.bucket_elems());
  if (!run.found) return {true, nullptr, 0, 0};  // this rank holds none of it
  const int64_t at = masters ? run.piece.master_offset : run.piece.state_offset;
  return {true, array + at, run.piece.numel, run.piece.param_offset};
}

void ZeroOptimizer::created() {
  const Topology& t = parts_.topology();
  if (parts_.comm().size() > 1 && t.ranks_per_node > 1 && parts_.node_aware() &&
      (reducer_.compressed() || compressed_params_)) {
    if (NodeComms* c = parts_.node_comms()) {  // collective, on every rank alike
      reducer_.set_hierarchy(t, *c->node, *c->rail);
      gatherer_.set_hierarchy(t, *c->node, *c->rail);
    }
  }
  if (compressed_params_) gatherer_.gather();
}

std::pair<uint32_t, uint32_t> ZeroOptimizer::saved_residual_topology(const BlobReader& r) const {
  const uint32_t world = decode_zero_layout(r).world;
  if (!r.has(kZeroFeedbackTopologySection)) return {world, 1};
  FieldReader f(r.section(kZeroFeedbackTopologySection, 8), 8);
  const uint32_t n = f.get<uint32_t>(), per_node = f.get<uint32_t>();
  if (n < 1 || per_node < 1 || uint64_t(n) * per_node != world)
    fail(DSOPT_ECORRUPT, "the zero.feedback_topology section holds " + std::to_string(n) + " x " +
                             std::to_string(per_node) + " ranks for a blob of " +
                             std::to_string(world) + " ranks");
  return {n, per_node};
}

bool ZeroOptimizer::drops_rank_local(const BlobReader& r) const {
  if (!reducer_.feedback() || !r.has(kZeroFeedbackSection)) return false;
  return saved_residual_topology(r) !=
         std::pair<uint32_t, uint32_t>(uint32_t(reducer_.residual_nodes()),
                                       uint32_t(reducer_.residual_ranks_per_node()));
}

bool ZeroOptimizer::residual_fits(const BlobReader& r) const {
  return int8_residual(r) && !drops_rank_local(r) && parts_.rank_local_world(1) != 0;
}

void ZeroOptimizer::check_layout(const BlobReader& r) const {
  if (!r.has(kZeroLayoutSection))
    fail(DSOPT_EMISMATCH, "the blob is from a run without ZeRO (stage 0): load it with "
                          "dsopt_state_load_shards");
  const ZeroLayoutRecord saved = decode_zero_layout(r), live = record();
  if (saved.world == live.world && saved.rank != live.rank)
    fail(DSOPT_EMISMATCH,
         "the blob is the ZeRO shard of rank " + std::to_string(saved.rank) + " of " +
             std::to_string(saved.world) + ", this optimizer is rank " + std::to_string(live.rank) +
             ": a shard is the state of its rank's part of the parameters and cannot be reset; "
             "load the blob rank " + std::to_string(live.rank) +
             " saved, or every rank's blob with dsopt_state_load_shards (nothing was changed)");
  if (saved.world != live.world || saved.rank != live.rank ||
      saved.bucket_elems != live.bucket_elems || saved.shard_numel != live.shard_numel ||
      saved.master_numel != live.master_numel)
    fail(DSOPT_EMISMATCH,
         "the blob is the ZeRO shard of rank " + std::to_string(saved.rank) + " of " +
             std::to_string(saved.world) + " (reduce bucket " + std::to_string(saved.bucket_elems) +
             "), this optimizer is rank " + std::to_string(live.rank) + " of " +
             std::to_string(live.world) + " (reduce bucket " + std::to_string(live.bucket_elems) +
             "): load all blobs of that run with dsopt_state_load_shards");
}

std::function<void()> ZeroOptimizer::reshard(const Blobs& blobs) {
  // A source without masters of fp32 parameters (no compressed allgather)
  // has their values in the caller's buffers.
  const ReadParam read_param = [this](int64_t param, int64_t offset, int64_t n, float* out) {
    const auto* data = static_cast<const float*>(parts_.params().params()[size_t(param)].data);
    parts_.kernels().copy_to_host(out, data + offset, size_t(n) * 4);
  };
  auto state = std::make_shared<HostMomentState>(
      assemble_moment_state(blobs, parts_.params().shapes(), state_, parts_.config().algorithm->moments,
                          read_param));
  std::shared_ptr<const BlobReader> first = blobs[0];
  return [this, state, first] {
    parts_.restore_common(*first);
    Kernels& k = state_kernels();
    k.copy_from_host(masters_.get(), state->masters.data(), state->masters.size() * 4);
    k.copy_from_host(moments_.exp_avg(), state->m.data(), state->m.size() * 4);
    if (moments_.exp_avg_sq())
      k.copy_from_host(moments_.exp_avg_sq(), state->v.data(), state->v.size() * 4);
    write_param_values(*state, parts_.params(), parts_.kernels());
    reducer_.reset_feedback();  // residuals are rank-local: they start again at zero
    reducer_.residual_scale() = parts_.loss_scale();
    publish_parameters();
  };
}

void ZeroOptimizer::publish_parameters() {
  if (offloaded_) {
    offloaded_->read_masters(false);  // fp32 parameters are the caller's values
    offloaded_->publish();
  }
  for (const UpdateSlot& s : slots())
    if (s.data(Operand::Param16))
      parts_.kernels().from_float(s.floats(Operand::Param), s.data(Operand::Param16), s.param16_dtype, s.numel);
  gatherer_.gather();
}

}  // namespace dsopt

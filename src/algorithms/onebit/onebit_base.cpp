#include "algorithms/onebit/onebit_base.hpp"

#include "algorithms/onebit/divergence_hint.hpp"
#include "algorithms/onebit/rule_flag.hpp"

namespace dsopt {

OneBitOptimizer::OneBitOptimizer(OptimizerParts& parts, Sections sections)
    : AlgorithmImpl(parts),
      sections_(std::move(sections)),
      masks_(parts.params().count()),
      errors_(sections_.errors, {}, nullptr, ""),
      bias_correction_(parts.config().defaults.bias_correction),
      update_units_(parts.config().settings_as<OneBitSettings>().stabilize) {
  if (!sections_.saved_world)
    sections_.saved_world = StageRecord::world_in(sections_.stage, sections_.stage_holds_frozen_after);
}

void OneBitOptimizer::set_momentum_mask(int64_t i, const dsopt_tensor* mask) {
  masks_.set(parts_.kernels(), parts_.params(), i, mask);
}

void OneBitOptimizer::created() {
  if (parts_.comm().size() > 1 && !car_sizes_.empty()) node_comms_ = parts_.node_comms();
  if (from_start_) start_compressed_allreduce();
}

void OneBitOptimizer::compress_params(const std::vector<int64_t>& indices) {
  tensor_of_.assign(size_t(parts_.params().count()), -1);
  car_sizes_.clear();
  for (int64_t i : indices) {
    const int64_t numel = parts_.params().params()[size_t(i)].numel;
    if (numel == 0) continue;  // an empty shard (dsopt_comm_set_shards): nothing to exchange
    tensor_of_[size_t(i)] = int64_t(car_sizes_.size());
    car_sizes_.push_back(numel);
  }
  errors_ = CarErrors(sections_.errors, car_sizes_, sections_.saved_world, sections_.rank_local);
}

void OneBitOptimizer::compress_fused(int64_t padded) {
  tensor_of_.clear();
  car_sizes_ = {padded};
  errors_ = CarErrors(sections_.errors, {parts_.params().total_numel()}, sections_.saved_world,
                      sections_.rank_local, true);
}

void OneBitOptimizer::start_compressed_allreduce() {
  if (parts_.comm().size() <= 1 || car_sizes_.empty()) return;
  if (node_comms_)
    node_car_ = std::make_unique<NodeAwareAllreduce>(*node_comms_->node, *node_comms_->rail, parts_.kernels(),
                                                     parts_.mem(), car_sizes_,
                                                     parts_.config().topology.onebit_node);
  else
    car_ = std::make_unique<CompressedAllreduce>(parts_.comm(), parts_.kernels(), parts_.mem(), car_sizes_);
}

void OneBitOptimizer::tend_node_comms() {
  for (Comm* c : {node_comms_->node.get(), node_comms_->rail.get()}) {
    c->prepare();
    c->set_timeout(parts_.comm().timeout());
    c->finish_others(&parts_.gathers());
  }
}

void OneBitOptimizer::run_compressed(std::vector<float*> tensors) {
  if (car_) car_->run(tensors.data());
  if (node_car_) {
    tend_node_comms();
    node_car_->run(tensors.data());
  }
}

CarErrors::Layout OneBitOptimizer::layout() const {
  const int32_t world = parts_.comm().size() > 1 && !car_sizes_.empty() ? parts_.comm().size() : 0;
  if (!node_comms_) return {world, 1, false};
  const int32_t R = int32_t(node_comms_->node->size()), N = int32_t(node_comms_->rail->size());
  return {world, R, NodeAwareAllreduce::onebit_node_step(parts_.config().topology.onebit_node, N, R)};
}

CarErrors::Layout OneBitOptimizer::live_layout() const {
  CarErrors::Layout l = layout();
  l.world = car_world();
  return l;
}

bool OneBitOptimizer::same_world(const BlobReader& r) const {
  CarErrors::Layout saved = errors_.saved_layout(r);
  saved.world = parts_.rank_local_world(saved.world);
  return saved == live_layout();
}

bool OneBitOptimizer::drops_rank_local(const BlobReader& r) const {
  const CarErrors::Layout saved = errors_.saved_layout(r);
  return saved.world > 1 && saved != layout();
}

void OneBitOptimizer::run_compressed(const std::vector<UpdateSlot>& slots, Operand operand) {
  std::vector<float*> tensors;
  for (const UpdateSlot& s : slots)
    if (s.numel > 0) tensors.push_back(s.floats(operand));  // as compress_params: no empty shards
  run_compressed(std::move(tensors));
}

void OneBitOptimizer::freeze_if_due() {
  // DeepSpeed's counter k = updates + 1 (docs/design/decisions.md G2).
  if (FreezeStage::due(parts_.group_step(0), settings().freeze_step)) enter_compression(parts_.group_step(0));
}

void OneBitOptimizer::enter_compression(int64_t warmup_updates) {
  stage_ = FreezeStage{true, warmup_updates};
  freeze_state();
  start_compressed_allreduce();
}

std::string OneBitOptimizer::stage_divergence_hint(const std::string& lr) const {
  return onebit_divergence_hint(settings().stabilize,
                                "compression stage diverges where the frozen variance", lr,
                                "freeze_step");
}

StateSchema& OneBitOptimizer::describe_stage(StateSchema& s) {
  return StageRecord::describe(s, sections_.stage, sections_.stage_holds_frozen_after, [this] {
    return StageRecord{stage_, settings().freeze_step, car_world()};
  });
}

void OneBitOptimizer::resume_stage(const StageRecord& record) {
  car_.reset();
  node_car_.reset();
  stage_ = FreezeStage{};
  const FreezeStage resumed = record.resumed(settings().freeze_step, parts_.group_step(0));
  if (!resumed.compressing) return;
  if (!record.stage.compressing) {
    enter_compression(resumed.frozen_after);  // frozen now by a changed freeze_step
    return;
  }
  stage_ = resumed;  // what froze with v was restored from the blob
  start_compressed_allreduce();
}

StateSchema& OneBitOptimizer::describe_rules(StateSchema& s) {
  if (sections_.rule)
    s.flag(sections_.rule, kBiasCorrectionRule, [this] { return bias_correction_; },
           [this](bool on) { bias_correction_ = on; });
  return s.flag(sections_.units, kUnitsRule, [this] { return update_units_; },
                [this](bool on) { update_units_ = on; });
}

void OneBitOptimizer::describe_errors(StateSchema& s,
                                      std::function<bool(const BlobReader&)> restore_if) {
  if (!restore_if) restore_if = [this](const BlobReader& r) { return has_car() && same_world(r); };
  // This rank's local index: its errors hold slice `local` of each tensor
  // (node-aware), or all of it (flat).
  const auto local = [this] { return node_comms_ ? node_comms_->node->rank() : 0; };
  StateSchema::Slicer slice;
  if (tensor_of_.empty()) {
    slice = [this, local](int64_t i, float* errors) {
      if (!errors) return StateSchema::Slice{};
      const Param& p = parts_.params().params()[size_t(i)];
      return errors_.fused_slice(errors, p.offset, p.numel, layout(), local());
    };
  } else {
    slice = [this, local](int64_t i, float* errors) {
      const int64_t t = i >= 0 && size_t(i) < tensor_of_.size() ? tensor_of_[size_t(i)] : -1;
      if (t < 0) return StateSchema::Slice{};  // a parameter the allreduce does not compress
      return errors_.tensor_slice(errors, size_t(t), layout(), local());
    };
  }
  errors_.describe(
      s, parts_.kernels(), [this] { return error_car(); },
      [this]() -> float* { return node_car_ ? node_car_->node_error() : nullptr; },
      [this] { return live_layout(); }, std::move(restore_if),
      std::move(slice), [this] { return parts_.comm().size() > 1 && !car_sizes_.empty(); });
}

}  // namespace dsopt

#include "api/config_json.hpp"

#include <nlohmann/json.hpp>

#include <cstring>

#include "config/config_values.hpp"
#include "api/config.hpp"
#include "base/error.hpp"
#include "facade/optimizer.hpp"

namespace dsopt {
namespace {

using json = nlohmann::json;

// The algorithm's hyperparameters of one group.
json hyper(const OptimizerConfig& c, const AdamHyper& h) { return config::write_hyper(c.algorithm->hyper, h); }

// optimizer.params: the keys of the type, aliases resolved, as applied
// (the algorithm's descriptor writes its own).
json optimizer_params(const OptimizerConfig& c) {
  json p = hyper(c, c.defaults);
  if (c.algorithm->write_params) c.algorithm->write_params(c, p);
  return p;
}

json groups(const OptimizerConfig& c) {
  json list = json::array();
  for (size_t g = 0; g < c.groups.size(); ++g) {
    json group = hyper(c, c.groups[g]);
    for (const std::string& key : c.algorithm->group_keys)
      if (key == "non_freeze") group[key] = bool(c.non_freeze[g]);
    list.push_back(group);
  }
  return list;
}

json compression(const ZeroCompression& c) {
  const char* g[] = {"none", "int8", "int4", "sign"};
  const char* p[] = {"none", "bf16", "int8"};
  return {{"gradients", g[int(c.gradients)]}, {"parameters", p[int(c.parameters)]},
          {"error_feedback", c.error_feedback}, {"gradient_block_size", c.gradient_block},
          {"parameter_block_size", c.parameter_block}};
}

const char* hierarchy_name(TopologyConfig::Hierarchy h) {
  switch (h) {
    case TopologyConfig::Hierarchy::Flat: return "flat";
    case TopologyConfig::Hierarchy::NodeAware: return "node_aware";
    case TopologyConfig::Hierarchy::Auto: break;
  }
  return "auto";
}

json to_json(const OptimizerConfig& c, bool bf16) {
  const LossScaleConfig& ls = c.pipeline.loss_scale;
  const DivergenceConfig& d = c.pipeline.divergence;
  const ZeroConfig& z = c.zero;
  return {
      {"device", c.cuda ? "cuda" : "cpu"},
      {"optimizer", {{"type", c.type}, {"params", optimizer_params(c)}}},
      {"param_groups", groups(c)},
      {"fp16", {{"enabled", ls.enabled}, {"loss_scale", ls.static_scale},
                {"initial_scale_power", ls.initial_scale_power}, {"loss_scale_window", ls.window},
                {"hysteresis", ls.hysteresis}, {"consecutive_hysteresis", ls.consecutive_hysteresis},
                {"min_loss_scale", ls.min_scale}}},
      {"bf16", {{"enabled", bf16}}},
      {"gradient_clipping", c.pipeline.gradient_clipping},
      {"skip_nonfinite", c.pipeline.skip_nonfinite},
      {"report_grad_norm", c.pipeline.report_grad_norm},
      {"threads", c.threads},
      {"zero_optimization",
       {{"stage", z.stage}, {"reduce_bucket_size", z.reduce_bucket_size},
        {"allgather_bucket_size", z.allgather_bucket_size}, {"reduce_scatter", z.reduce_scatter},
        {"deferred_allgather", z.deferred_allgather},
        {"offload_optimizer", {{"device", z.offload_cpu ? "cpu" : "none"}, {"pin_memory", z.pin_memory}}},
        {"compression", compression(z.compression)}}},
      {"cuda_aware", c.cuda_aware},
      {"max_consecutive_skips", c.pipeline.max_consecutive_skips},
      {"comm_timeout", c.pipeline.comm_timeout_s},
      {"gradient_accumulation_steps", c.micro_batches},
      {"divergence_check", {{"enabled", d.enabled}, {"factor", d.factor}, {"min_steps", d.min_steps},
                            {"horizon", d.horizon}, {"count", d.count}, {"window", d.window}}},
      {"topology", {{"hierarchy", hierarchy_name(c.topology.hierarchy)},
                    {"ranks_per_node", c.topology.ranks_per_node},
                    {"node_reduce", c.topology.onebit_node ? "1bit" : "fp32"}}}};
}

// bf16.enabled, which only the precision check of parse_config reads.
bool bf16_enabled(const std::string& text) {
  const json root = json::parse(text);
  return root.contains("bf16") && root["bf16"].value("enabled", false);
}

}  // namespace

std::string canonical_config(const char* json_text) {
  const OptimizerConfig c = parse_config(json_text);
  return to_json(c, bf16_enabled(json_text)).dump();
}

std::string current_config(const Optimizer& opt, const std::string& text) {
  OptimizerConfig c = parse_config(text.c_str());
  for (int32_t g = 0; g < opt.num_groups(); ++g) {
    for (const HyperParam& p : c.algorithm->hyper)
      p.set(c.groups[size_t(g)], opt.group_param(g, p.name));
  }
  c.pipeline.gradient_clipping = opt.gradient_clipping();
  return to_json(c, bf16_enabled(text)).dump();
}

void copy_text(const std::string& text, char* dst, uint64_t capacity, uint64_t* out_size) {
  if (!dst && capacity != 0) fail(DSOPT_EINVAL, "dst is NULL with capacity " + std::to_string(capacity));
  if (!dst && !out_size) fail(DSOPT_EINVAL, "dst and out_size are both NULL");
  const uint64_t needed = text.size() + 1;
  if (out_size) *out_size = needed;
  if (!dst) return;
  if (capacity < needed)
    fail(DSOPT_EBUFS, "capacity " + std::to_string(capacity) + " is too small: the text needs " +
                          std::to_string(needed) + " bytes");
  std::memcpy(dst, text.c_str(), needed);
}

}  // namespace dsopt

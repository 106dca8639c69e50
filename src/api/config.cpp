#include "api/config.hpp"

#include <nlohmann/json.hpp>

#include <set>

#include "config/config_values.hpp"
#include "algorithms/registry.hpp"
#include "base/error.hpp"

namespace dsopt {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxThreads = 1024;  // "threads" beyond this is a typo, not a machine

using namespace config;

// optimizer: the algorithm's descriptor (src/algorithms) names its keys and reads them.
void read_optimizer(const json& root, OptimizerConfig& cfg) {
  if (!root.contains("optimizer")) bad("optimizer", "missing (e.g. {\"type\": \"AdamW\"})");
  const json& opt = root.at("optimizer");
  check_keys(opt, "optimizer", {"type", "params"});
  if (!opt.contains("type") || !opt.at("type").is_string())
    bad("optimizer.type", "must be a string (Adam or AdamW)");
  const std::string type = opt.at("type").get<std::string>();
  const Algorithm* alg = find_algorithm(type);
  if (!alg) {
    std::string known;
    for (const Algorithm* a : algorithms()) known += (known.empty() ? "" : ", ") + a->type;
    bad("optimizer.type", "unknown optimizer type '" + type + "' (known: " + known + ")");
  }
  cfg.algorithm = alg;
  cfg.type = alg->type;
  cfg.defaults = alg->defaults;
  set_hyper_defaults(alg->hyper, cfg.defaults);
  const json params = opt.contains("params") ? opt.at("params") : json::object();
  const std::string path = "optimizer.params";
  const std::vector<std::string> hyper = hyper_keys(alg->hyper);
  std::set<std::string> keys(hyper.begin(), hyper.end());
  keys.insert(alg->keys.begin(), alg->keys.end());
  check_keys(params, path, keys, {"comm_backend_name", "cuda_aware"});
  read_hyper(params, path, alg->hyper, cfg.defaults);
  check_group(*alg, cfg.defaults, path);
  if (alg->read_params) alg->read_params(params, path, cfg);
  if (boolean(params, path, "amsgrad", false)) bad(sub(path, "amsgrad"), "AMSGrad is not supported");
  if (boolean(params, path, "cuda_aware", false)) cfg.cuda_aware = true;
}

void read_groups(const json& root, OptimizerConfig& cfg) {
  if (!root.contains("param_groups")) {
    cfg.groups = {cfg.defaults};
    cfg.non_freeze = {false};
    return;
  }
  const json& groups = root.at("param_groups");
  if (!groups.is_array() || groups.empty()) bad("param_groups", "must be a non-empty list of objects");
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string path = "param_groups[" + std::to_string(i) + "]";
    const std::vector<std::string> hyper = hyper_keys(cfg.algorithm->hyper);
    std::set<std::string> keys(hyper.begin(), hyper.end());
    keys.insert(cfg.algorithm->group_keys.begin(), cfg.algorithm->group_keys.end());
    check_keys(groups[i], path, keys);
    AdamHyper h = cfg.defaults;
    read_hyper(groups[i], path, cfg.algorithm->hyper, h);
    check_group(*cfg.algorithm, h, path);
    cfg.groups.push_back(h);
    cfg.non_freeze.push_back(boolean(groups[i], path, "non_freeze", false));
  }
}

void read_precision(const json& root, OptimizerConfig& cfg) {
  LossScaleConfig& ls = cfg.pipeline.loss_scale;
  if (root.contains("fp16")) {
    const json& f = root.at("fp16");
    check_keys(f, "fp16", {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                           "hysteresis", "consecutive_hysteresis", "min_loss_scale"});
    ls.enabled = boolean(f, "fp16", "enabled", false);
    ls.static_scale = number(f, "fp16", "loss_scale", 0.0);
    require(ls.static_scale >= 0, "fp16.loss_scale", "must be >= 0 (0 = dynamic)");
    ls.initial_scale_power = int(integer(f, "fp16", "initial_scale_power", 16, 0, 100));
    ls.window = integer(f, "fp16", "loss_scale_window", 1000, 1, int64_t(1) << 40);
    ls.hysteresis = int(integer(f, "fp16", "hysteresis", 2, 1, 1 << 20));
    ls.consecutive_hysteresis = boolean(f, "fp16", "consecutive_hysteresis", false);
    ls.min_scale = number(f, "fp16", "min_loss_scale", 1.0);
    require(ls.min_scale > 0, "fp16.min_loss_scale", "must be > 0");
  }
  bool bf16 = false;
  if (root.contains("bf16")) {
    check_keys(root.at("bf16"), "bf16", {"enabled"});
    bf16 = boolean(root.at("bf16"), "bf16", "enabled", false);
  }
  if (bf16 && ls.enabled) bad("bf16.enabled", "fp16 and bf16 cannot both be enabled");
}

// zero_optimization.compression: the codecs of ZeRO's traffic
// (docs/guides/compressed-zero.md).
std::string one_of(const json& obj, const std::string& path, const std::string& key,
                   const std::vector<std::string>& names) {
  if (!obj.contains(key)) return names[0];
  const json& v = obj.at(key);
  for (const std::string& n : names)
    if (v.is_string() && v == n) return n;
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "\"" : ", \"") + n + "\"";
  bad(sub(path, key), "must be one of " + list + ", got " + v.dump());
  return names[0];
}

void read_compression(const json& c, const ZeroConfig& zc, bool cuda, ZeroCompression& out) {
  const std::string path = "zero_optimization.compression";
  check_keys(c, path, {"gradients", "parameters", "error_feedback", "gradient_block_size",
                       "parameter_block_size"});
  const std::string g = one_of(c, path, "gradients", {"none", "int8", "int4", "sign"});
  out.gradients = g == "int8"   ? GradientCodec::Int8
                  : g == "int4" ? GradientCodec::Int4
                  : g == "sign" ? GradientCodec::Sign
                                : GradientCodec::None;
  const std::string p = one_of(c, path, "parameters", {"none", "bf16", "int8"});
  out.parameters = p == "bf16" ? ParamCodec::Bf16 : p == "int8" ? ParamCodec::Int8 : ParamCodec::None;
  out.error_feedback = boolean(c, path, "error_feedback", true);
  for (auto [key, block] : {std::pair<const char*, int64_t*>{"gradient_block_size", &out.gradient_block},
                            {"parameter_block_size", &out.parameter_block}}) {
    *block = integer(c, path, key, *block, 8, 65536);
    require(*block % 8 == 0, sub(path, key), "must be a multiple of 8, got " + std::to_string(*block));
  }
  const bool any = out.gradients != GradientCodec::None || out.parameters != ParamCodec::None;
  if (any && zc.stage == 0)
    bad(path, "compresses ZeRO's traffic and needs zero_optimization.stage 1 or 2");
  if (out.gradients != GradientCodec::None && !zc.reduce_scatter)
    bad(path + ".gradients", "sends each owner its compressed piece (an all-to-all) and cannot "
                             "run with \"reduce_scatter\": false");
  if (out.parameters != ParamCodec::None && zc.offload_cpu && cuda)
    fail(DSOPT_EUNSUPPORTED, "config: " + path + ".parameters: a compressed parameter allgather "
                             "reads the masters on the device; it cannot run with "
                             "offload_optimizer.device \"cpu\"");
}

// zero_optimization: stage 1/2 shard the Adam/AdamW state (docs/guides/zero.md "ZeRO").
void read_zero(const json& z, OptimizerConfig& cfg) {
  const std::string path = "zero_optimization";
  check_keys(z, path,
             {"stage", "reduce_bucket_size", "allgather_bucket_size", "reduce_scatter",
              "deferred_allgather",
              "contiguous_gradients", "round_robin_gradients", "offload_optimizer", "compression"},
             {"overlap_comm", "allgather_partitions", "use_multi_rank_bucket_allreduce",
              "elastic_checkpoint", "load_from_fp32_weights", "ignore_unused_parameters"});
  ZeroConfig& zc = cfg.zero;
  const int64_t stage = integer(z, path, "stage", 0, 0, 3);
  if (stage == 3) bad(path + ".stage", "ZeRO stage 3 is not part of dsopt (use 0, 1 or 2)");
  zc.stage = int(stage);
  const int64_t max_bucket = int64_t(1) << 40;
  zc.reduce_bucket_size = integer(z, path, "reduce_bucket_size", zc.reduce_bucket_size, 1, max_bucket);
  zc.allgather_bucket_size =
      integer(z, path, "allgather_bucket_size", zc.allgather_bucket_size, 1, max_bucket);
  zc.reduce_scatter = boolean(z, path, "reduce_scatter", true);
  zc.deferred_allgather = boolean(z, path, "deferred_allgather", false);
  if (!boolean(z, path, "contiguous_gradients", true))
    fail(DSOPT_EUNSUPPORTED, "config: " + path + ".contiguous_gradients: dsopt always packs "
                             "gradients into contiguous buckets (true is the only setting)");
  if (boolean(z, path, "round_robin_gradients", false))
    fail(DSOPT_EUNSUPPORTED, "config: " + path + ".round_robin_gradients: not supported (false is "
                             "the only setting; dsopt's shards are balanced without it)");
  if (z.contains("offload_optimizer")) {
    const json& o = z.at("offload_optimizer");
    check_keys(o, path + ".offload_optimizer", {"device", "pin_memory"},
               {"buffer_count", "fast_init", "ratio"});
    if (o.contains("device")) {
      const json& d = o.at("device");
      if (d.is_string() && d == "nvme")
        fail(DSOPT_EUNSUPPORTED, "config: " + path + ".offload_optimizer.device: NVMe offload is "
                                 "not part of dsopt (use \"cpu\" or \"none\")");
      if (!d.is_string() || (d != "cpu" && d != "none"))
        bad(path + ".offload_optimizer.device", "must be \"cpu\" or \"none\", got " + d.dump());
      zc.offload_cpu = d == "cpu";
    }
    zc.pin_memory = boolean(o, path + ".offload_optimizer", "pin_memory", false);
    if (zc.offload_cpu && zc.stage == 0)
      bad(path + ".offload_optimizer", "CPU offload of the optimizer state needs ZeRO stage 1 or 2");
  }
  if (zc.stage > 0 && !cfg.algorithm->sharded)
    fail(DSOPT_EUNSUPPORTED,
         "config: " + path + ".stage " + std::to_string(zc.stage) + " with " + cfg.type +
             ": ZeRO stage 1/2 shard the state of " +
             algorithm_types([](const Algorithm& a) { return a.sharded; }) +
             "; a 1-bit optimizer's compressed stage needs every rank's whole momentum, so it "
             "runs with stage 0 (docs/guides/zero.md \"Any update rule\")");
  if (z.contains("compression")) read_compression(z.at("compression"), zc, cfg.cuda, zc.compression);
  if (zc.offload_cpu && cfg.cuda && !cfg.algorithm->offload)
    fail(DSOPT_EUNSUPPORTED, "config: " + path + ".offload_optimizer: CPU offload exists for " +
                             algorithm_types([](const Algorithm& a) { return a.offload; }) +
                             "; " + cfg.type + " keeps its shard on the device");
}

// topology: flat or node-aware compressed collectives, and the nodes.
void read_topology(const json& t, TopologyConfig& tc) {
  const std::string path = "topology";
  check_keys(t, path, {"hierarchy", "ranks_per_node", "node_reduce"});
  if (t.contains("hierarchy")) {
    const json& h = t.at("hierarchy");
    if (!h.is_string() || (h != "auto" && h != "flat" && h != "node_aware"))
      bad(sub(path, "hierarchy"), "must be \"auto\", \"flat\" or \"node_aware\", got " + h.dump());
    tc.hierarchy = h == "flat"         ? TopologyConfig::Hierarchy::Flat
                   : h == "node_aware" ? TopologyConfig::Hierarchy::NodeAware
                                       : TopologyConfig::Hierarchy::Auto;
  }
  tc.ranks_per_node = int(integer(t, path, "ranks_per_node", 0, 0, 1 << 20));
  if (t.contains("node_reduce")) {
    const json& r = t.at("node_reduce");
    if (!r.is_string() || (r != "fp32" && r != "1bit"))
      bad(sub(path, "node_reduce"), "must be \"fp32\" or \"1bit\", got " + r.dump());
    tc.onebit_node = r == "1bit";
  }
}

// divergence_check: the rule of dsopt_step_info.diverging
// (optim/divergence_check.hpp).
void read_divergence(const json& d, DivergenceConfig& dc) {
  const std::string path = "divergence_check";
  check_keys(d, path, {"enabled", "factor", "min_steps", "horizon", "count", "window"});
  const int64_t big = int64_t(1) << 40;
  dc.enabled = boolean(d, path, "enabled", dc.enabled);
  dc.factor = number(d, path, "factor", dc.factor);
  require(dc.factor > 1.0, sub(path, "factor"), "must be > 1, got " + std::to_string(dc.factor));
  dc.min_steps = integer(d, path, "min_steps", dc.min_steps, 0, big);
  dc.horizon = integer(d, path, "horizon", dc.horizon, 1, big);
  dc.window = int(integer(d, path, "window", dc.window, 1, 64));
  dc.count = int(integer(d, path, "count", dc.count, 1, 64));
  require(dc.count <= dc.window, sub(path, "count"),
          "must be <= window (" + std::to_string(dc.window) + "), got " + std::to_string(dc.count));
}

// Arrays and objects nested deeper than this are rejected before parsing:
// dsopt's configs nest 4 levels, and nlohmann::json's dump() (error
// messages, the canonical text) recurses once per level.
constexpr int kMaxNesting = 64;

void check_nesting(const char* text) {
  int depth = 0;
  bool in_string = false;
  for (const char* p = text; *p; ++p) {
    const char c = *p;
    if (in_string) {
      if (c == '\\' && p[1]) ++p;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting)
        fail(DSOPT_EINVAL, "config: nested deeper than " + std::to_string(kMaxNesting) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace

OptimizerConfig parse_config(const char* json_text) {
  if (!json_text) fail(DSOPT_EINVAL, "config_json is NULL");
  check_nesting(json_text);
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for numbers beyond double (1e400).
    fail(DSOPT_EINVAL, std::string("config is not valid JSON: ") + e.what());
  }
  check_keys(root, "",
             {"device", "optimizer", "param_groups", "fp16", "bf16", "gradient_clipping",
              "skip_nonfinite", "report_grad_norm", "threads", "zero_optimization", "cuda_aware",
              "max_consecutive_skips", "comm_timeout", "gradient_accumulation_steps",
              "divergence_check", "topology"},
             {"train_batch_size", "train_micro_batch_size_per_gpu", "steps_per_print",
              "wall_clock_breakdown"});
  OptimizerConfig cfg;
  if (root.contains("device")) {
    const json& d = root.at("device");
    if (!d.is_string() || (d != "cpu" && d != "cuda")) bad("device", "must be \"cpu\" or \"cuda\", got " + d.dump());
    cfg.cuda = d == "cuda";
  }
  read_optimizer(root, cfg);
  read_groups(root, cfg);
  read_precision(root, cfg);
  PipelineConfig& p = cfg.pipeline;
  p.gradient_clipping = number(root, "", "gradient_clipping", 0.0);
  require(p.gradient_clipping >= 0, "gradient_clipping", "must be >= 0 (0 = off)");
  p.skip_nonfinite = boolean(root, "", "skip_nonfinite", true);
  if (!p.skip_nonfinite && p.loss_scale.enabled && p.loss_scale.static_scale == 0.0)
    bad("skip_nonfinite", "dynamic fp16 loss scaling needs overflowing steps skipped");
  p.report_grad_norm = boolean(root, "", "report_grad_norm", false);
  p.max_consecutive_skips = integer(root, "", "max_consecutive_skips", 50, 0, int64_t(1) << 62);
  p.comm_timeout_s = number(root, "", "comm_timeout", 0.0);
  require(p.comm_timeout_s >= 0, "comm_timeout", "must be >= 0 seconds (0 = no limit)");
  cfg.threads = int(integer(root, "", "threads", 0, 0, kMaxThreads));
  cfg.micro_batches = int(integer(root, "", "gradient_accumulation_steps", 1, 1, 1 << 20));
  if (boolean(root, "", "cuda_aware", false)) cfg.cuda_aware = true;
  if (root.contains("zero_optimization")) read_zero(root.at("zero_optimization"), cfg);
  if (root.contains("divergence_check")) read_divergence(root.at("divergence_check"), p.divergence);
  if (root.contains("topology")) read_topology(root.at("topology"), cfg.topology);
  if (cfg.topology.onebit_node && !cfg.algorithm->compresses)
    bad("topology.node_reduce",
        "\"1bit\" is the node step of the 1-bit allreduce (" +
            algorithm_types([](const Algorithm& a) { return a.compresses; }) + "); " + cfg.type +
            " reduces inside the node in fp32");
  cfg.canonical = root.dump();
  json run = root;
  for (const char* key : {"device", "threads", "cuda_aware", "comm_timeout",
                          "gradient_accumulation_steps"})
    run.erase(key);
  // Where the state lives does not change it: offloaded and device blobs mix.
  // Nor how the parameters are gathered: the same bytes arrive.
  if (run.contains("zero_optimization") && run["zero_optimization"].is_object())
    for (const char* key : {"offload_optimizer", "deferred_allgather", "allgather_bucket_size"})
      run["zero_optimization"].erase(key);
  cfg.run_canonical = run.dump();
  return cfg;
}

}  // namespace dsopt

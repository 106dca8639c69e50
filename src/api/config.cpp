#include "api/config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <set>

#include "base/error.hpp"

namespace dsopt {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxThreads = 1024;  // "threads" beyond this is a typo, not a machine

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail(DSOPT_EINVAL, "config: " + path + ": " + what);
}

std::string join(const std::set<std::string>& keys) {
  std::string s;
  for (const std::string& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// Rejects keys outside `known`; `ignored` keys are accepted and skipped.
void check_keys(const json& obj, const std::string& path, const std::set<std::string>& known,
                const std::set<std::string>& ignored = {}) {
  if (!obj.is_object()) bad(path.empty() ? "(top level)" : path, "must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (known.count(it.key()) || ignored.count(it.key())) continue;
    bad((path.empty() ? "" : path + ".") + it.key(), "unknown key (known here: " + join(known) + ")");
  }
}

std::string sub(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

double number(const json& obj, const std::string& path, const std::string& key, double dflt) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  if (!v.is_number()) bad(sub(path, key), "must be a number, got " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(sub(path, key), "must be finite");
  return d;
}

// An integer in [lo, hi], checked before any narrowing.
int64_t integer(const json& obj, const std::string& path, const std::string& key, int64_t dflt,
                int64_t lo, int64_t hi) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  const bool integral = v.is_number_integer() ||
                        (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (!integral) bad(sub(path, key), "must be an integer, got " + v.dump());
  const double d = v.get<double>();
  if (d < double(lo) || d > double(hi) ||
      (v.is_number_integer() && (v.get<int64_t>() < lo || v.get<int64_t>() > hi)))
    bad(sub(path, key), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
}

bool boolean(const json& obj, const std::string& path, const std::string& key, bool dflt) {
  if (!obj.contains(key)) return dflt;
  const json& v = obj.at(key);
  if (!v.is_boolean()) bad(sub(path, key), "must be true or false, got " + v.dump());
  return v.get<bool>();
}

void require(bool ok, const std::string& path, const std::string& what) {
  if (!ok) bad(path, what);
}

// The update runs in fp32: a value must survive the conversion.
void require_fp32(double v, const std::string& path, bool nonzero) {
  const float f = float(v);
  if (!std::isfinite(f)) bad(path, "is too large for fp32 (" + std::to_string(v) + ")");
  if (nonzero && v != 0.0 && !(std::fabs(f) >= FLT_MIN))
    bad(path, "is too small for fp32 (" + std::to_string(v) + ")");
}

// lr, betas, eps, weight_decay of `obj` over `h` (optimizer.params or a group).
void read_hyper(const json& obj, const std::string& path, AdamHyper& h) {
  h.lr = number(obj, path, "lr", h.lr);
  require(h.lr >= 0, sub(path, "lr"), "must be >= 0, got " + std::to_string(h.lr));
  require_fp32(h.lr, sub(path, "lr"), false);
  if (obj.contains("betas")) {
    const json& b = obj.at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number())
      bad(sub(path, "betas"), "must be a list of two numbers, got " + b.dump());
    h.beta1 = b[0].get<double>();
    h.beta2 = b[1].get<double>();
    for (double beta : {h.beta1, h.beta2})
      require(beta >= 0 && beta < 1 && float(beta) < 1.0f, sub(path, "betas"),
              "each beta must be in [0, 1) and below 1 in fp32 (at most 0.99999994), got " +
                  b.dump());
  }
  h.eps = number(obj, path, "eps", h.eps);
  require(h.eps > 0, sub(path, "eps"), "must be > 0, got " + std::to_string(h.eps));
  require_fp32(h.eps, sub(path, "eps"), true);
  h.weight_decay = number(obj, path, "weight_decay", h.weight_decay);
  require(h.weight_decay >= 0, sub(path, "weight_decay"), "must be >= 0");
  require_fp32(h.weight_decay, sub(path, "weight_decay"), false);
}

// stabilize_limit's default, measured: 4 for every 1-bit optimizer. For 1-bit
// LAMB and 0/1 Adam the smallest of 1, 2, 4 at which their stabilized runs
// match DeepSpeed's where DeepSpeed's rule is healthy
// (docs/design/stable-1bit.md); for 1-bit Adam, compressing in the update's
// units, the limit at which it matches AdamW on the small GPTs and the MLPs
// (docs/design/zero-one-adam-transformers.md).
constexpr double kDefaultStabilizeLimit = 4.0;

// The keys the 1-bit optimizers share.
void read_onebit(const json& params, const std::string& path, OptimizerConfig& cfg) {
  if (params.contains("max_grad_norm"))
    bad(sub(path, "max_grad_norm"), "is not used by 1-bit optimizers (DeepSpeed ignores it); "
                                    "clip with the top-level \"gradient_clipping\"");
  read_hyper(params, path, cfg.defaults);
  // 1-bit Adam and 0/1 Adam correct both moments by default (false:
  // DeepSpeed's rule). 1-bit LAMB accepts the key and ignores it: its trust
  // ratio cancels a per-tensor factor. eps_inside_sqrt is accepted and
  // ignored: eps is always outside the square root.
  const bool corrected = boolean(params, path, "bias_correction", true);
  cfg.defaults.bias_correction = cfg.type != "OneBitLamb" && corrected;
  boolean(params, path, "eps_inside_sqrt", false);
  cfg.defaults.decoupled = true;
  cfg.freeze_step = integer(params, path, "freeze_step", 100000, 1, int64_t(1) << 62);
  cfg.stabilize = boolean(params, path, "stabilize", true);
  cfg.stabilize_limit = number(params, path, "stabilize_limit", kDefaultStabilizeLimit);
  require(cfg.stabilize_limit > 0, sub(path, "stabilize_limit"),
          "must be > 0, got " + std::to_string(cfg.stabilize_limit));
  require_fp32(cfg.stabilize_limit, sub(path, "stabilize_limit"), true);
}

// 1-bit LAMB's trust-ratio clamps, its EMA and the factor's clamps.
void read_lamb(const json& params, const std::string& path, LambCoeffConfig& k) {
  k.max_coeff = number(params, path, "max_coeff", k.max_coeff);
  k.min_coeff = number(params, path, "min_coeff", k.min_coeff);
  require(k.min_coeff > 0, sub(path, "min_coeff"), "must be > 0");
  require(k.max_coeff >= k.min_coeff, sub(path, "max_coeff"), "must be >= min_coeff");
  k.coeff_beta = number(params, path, "coeff_beta", k.coeff_beta);
  require(k.coeff_beta >= 0 && k.coeff_beta < 1, sub(path, "coeff_beta"), "must be in [0, 1)");
  k.factor_max = number(params, path, "factor_max", k.factor_max);
  k.factor_min = number(params, path, "factor_min", k.factor_min);
  require(k.factor_min > 0, sub(path, "factor_min"), "must be > 0");
  require(k.factor_max >= k.factor_min, sub(path, "factor_max"), "must be >= factor_min");
  k.factor_threshold = number(params, path, "factor_threshold", k.factor_threshold);
  require(k.factor_threshold >= 0, sub(path, "factor_threshold"), "must be >= 0");
}

// LAMB (docs/optimizers/lamb.md): DeepSpeed's FusedLamb keys, with the
// update of 1-bit LAMB's warmup.
void read_plain_lamb(const json& params, const std::string& path,
                     const std::set<std::string>& ignored, OptimizerConfig& cfg) {
  check_keys(params, path,
             {"lr", "betas", "eps", "weight_decay", "bias_correction", "max_coeff", "min_coeff",
              "max_grad_norm", "eps_inside_sqrt", "amsgrad"},
             ignored);
  if (params.contains("max_grad_norm"))
    bad(sub(path, "max_grad_norm"), "is not used by dsopt's LAMB; clip with the top-level "
                                    "\"gradient_clipping\"");
  if (boolean(params, path, "eps_inside_sqrt", false))
    bad(sub(path, "eps_inside_sqrt"), "eps is always added outside the square root");
  read_hyper(params, path, cfg.defaults);
  cfg.defaults.bias_correction = boolean(params, path, "bias_correction", true);
  cfg.defaults.decoupled = true;
  read_lamb(params, path, cfg.lamb);
}

// 0/1 Adam's schedules (docs/design/zero-one-adam.md section 1).
void read_zero_one(const json& params, const std::string& path, OptimizerConfig& cfg) {
  const int64_t big = int64_t(1) << 62;
  cfg.var_freeze_step = integer(params, path, "var_freeze_step", 100000, 0, big);
  cfg.var_update_scaler = integer(params, path, "var_update_scaler", 16, 1, big);
  cfg.local_step_scaler = integer(params, path, "local_step_scaler", 32678, 1, big);
  cfg.local_step_clipper = integer(params, path, "local_step_clipper", 16, 1, big);
  cfg.decoupled_sync_weight_decay = boolean(params, path, "decoupled_sync_weight_decay", false);
}

std::string canonical_type(const std::string& type) {
  std::string t = type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (t == "adam") return "Adam";
  if (t == "adamw") return "AdamW";
  if (t == "onebitadam") return "OneBitAdam";
  if (t == "onebitlamb") return "OneBitLamb";
  if (t == "zerooneadam") return "ZeroOneAdam";
  if (t == "lamb") return "Lamb";
  bad("optimizer.type", "unknown optimizer type '" + type +
                            "' (known: Adam, AdamW, Lamb, OneBitAdam, OneBitLamb, ZeroOneAdam)");
}

void read_optimizer(const json& root, OptimizerConfig& cfg) {
  if (!root.contains("optimizer")) bad("optimizer", "missing (e.g. {\"type\": \"AdamW\"})");
  const json& opt = root.at("optimizer");
  check_keys(opt, "optimizer", {"type", "params"});
  if (!opt.contains("type") || !opt.at("type").is_string())
    bad("optimizer.type", "must be a string (Adam or AdamW)");
  cfg.type = canonical_type(opt.at("type").get<std::string>());
  const json params = opt.contains("params") ? opt.at("params") : json::object();
  const std::string path = "optimizer.params";
  const std::set<std::string> ignored = {"comm_backend_name", "cuda_aware"};
  const bool zero_one = cfg.type == "ZeroOneAdam";
  if (cfg.type == "OneBitAdam" || cfg.type == "OneBitLamb" || zero_one) {
    std::set<std::string> keys = {"lr", "betas", "eps", "weight_decay", "freeze_step",
                                  "bias_correction", "eps_inside_sqrt", "amsgrad", "max_grad_norm",
                                  "stabilize", "stabilize_limit"};
    if (zero_one) {
      keys.erase("freeze_step");
      keys.insert({"var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper",
                   "decoupled_sync_weight_decay"});
    }
    if (cfg.type == "OneBitLamb")
      keys.insert({"max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min", "factor_threshold"});
    check_keys(params, path, keys, ignored);
    read_onebit(params, path, cfg);
    if (cfg.type == "OneBitLamb") read_lamb(params, path, cfg.lamb);
    if (zero_one) read_zero_one(params, path, cfg);
  } else if (cfg.type == "Lamb") {
    read_plain_lamb(params, path, ignored, cfg);
  } else {
    check_keys(params, path,
               {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "amsgrad"},
               ignored);
    read_hyper(params, path, cfg.defaults);
    cfg.defaults.bias_correction = boolean(params, path, "bias_correction", true);
    const bool adam_w_mode = boolean(params, path, "adam_w_mode", true);
    if (cfg.type == "AdamW" && !adam_w_mode)
      bad(sub(path, "adam_w_mode"), "AdamW always decouples weight decay; use \"type\": \"Adam\" with "
                                    "\"adam_w_mode\": false for L2 weight decay");
    cfg.defaults.decoupled = adam_w_mode;
  }
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
    std::set<std::string> keys = {"lr", "betas", "eps", "weight_decay"};
    if (cfg.type == "OneBitAdam") keys.insert("non_freeze");
    check_keys(groups[i], path, keys);
    AdamHyper h = cfg.defaults;
    read_hyper(groups[i], path, h);
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
  if (zc.stage > 0 && cfg.type != "Adam" && cfg.type != "AdamW" && cfg.type != "Lamb")
    fail(DSOPT_EUNSUPPORTED,
         "config: " + path + ".stage " + std::to_string(zc.stage) + " with " + cfg.type +
             ": ZeRO stage 1/2 shard the state of Lamb, Adam and AdamW; a 1-bit optimizer's "
             "compressed stage needs every rank's whole momentum, so it runs with stage 0 "
             "(docs/guides/zero.md \"Any update rule\")");
  if (z.contains("compression")) read_compression(z.at("compression"), zc, cfg.cuda, zc.compression);
  if (zc.offload_cpu && cfg.cuda && cfg.type == "Lamb")
    fail(DSOPT_EUNSUPPORTED, "config: " + path + ".offload_optimizer: CPU offload exists for "
                             "Adam and AdamW; Lamb keeps its shard on the device");
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
              "divergence_check"},
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

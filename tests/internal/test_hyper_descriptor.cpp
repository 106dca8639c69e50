// An algorithm's group hyperparameters follow its descriptor alone: a list
// with hyperparameters Adam lacks ("gamma", and "mix", a key of two values,
// held in AdamHyper::extra) is read from a config, written back, stored in
// and restored from the blob's hyper section, and refused when out of range,
// with no code but the list. Also: the earlier 4-value layout of the hyper
// section is read by name, and sizes that fit no layout are refused.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config/config_values.hpp"
#include "base/error.hpp"
#include "optim/hyper_params.hpp"
#include "optim/hyper_section.hpp"

namespace {

using dsopt::AdamHyper;
using dsopt::HyperParam;
using dsopt::HyperRange;
using json = nlohmann::json;

int failures = 0, passes = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
    return;
  }
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
}

// The status and message `fn` throws (status 0: it did not throw).
template <class Fn>
std::pair<int, std::string> thrown(Fn fn) {
  try {
    fn();
  } catch (const dsopt::Error& e) {
    return {e.status(), e.what()};
  }
  return {0, ""};
}

std::vector<HyperParam> descriptor() {
  std::vector<HyperParam> params = dsopt::adam_hyper_params({"lr", "weight_decay"});
  params.push_back({"gamma", "gamma", 0.5, HyperRange::Beta, false,
                    [](AdamHyper& h) -> double& { return h.extra[0]; }});
  params.push_back({"mix_a", "mix", 1.0, HyperRange::NonNegative, false,
                    [](AdamHyper& h) -> double& { return h.extra[1]; }});
  params.push_back({"mix_b", "mix", 2.0, HyperRange::NonNegative, true,
                    [](AdamHyper& h) -> double& { return h.extra[2]; }});
  return params;
}

void test_config() {
  const std::vector<HyperParam> params = descriptor();
  expect(dsopt::hyper_keys(params) == std::vector<std::string>{"lr", "weight_decay", "gamma", "mix"},
         "keys, each once, in order");
  AdamHyper h;
  dsopt::set_hyper_defaults(params, h);
  expect(h.extra[0] == 0.5 && h.extra[1] == 1.0 && h.extra[2] == 2.0, "defaults");
  dsopt::config::read_hyper(json::parse(R"({"gamma": 0.25, "mix": [3, 4], "lr": 0.1})"), "optimizer.params",
                            params, h);
  expect(h.extra[0] == 0.25 && h.extra[1] == 3.0 && h.extra[2] == 4.0 && h.lr == 0.1, "read");
  const json written = dsopt::config::write_hyper(params, h);
  expect(written == json::parse(R"({"lr": 0.1, "weight_decay": 0.0, "gamma": 0.25, "mix": [3.0, 4.0]})"),
         "written: " + written.dump());
  const auto bad = [&](const char* text, const char* where) {
    AdamHyper k = h;
    const auto [status, message] =
        thrown([&] { dsopt::config::read_hyper(json::parse(text), "param_groups[1]", params, k); });
    expect(status == DSOPT_EINVAL && message.find(where) != std::string::npos,
           std::string(text) + " refused naming " + where + ": " + message);
  };
  bad(R"({"gamma": 1.0})", "param_groups[1].gamma");
  bad(R"({"mix": [1]})", "must be a list of two numbers");
  bad(R"({"mix": [1, 0]})", "param_groups[1].mix: must be > 0");
  bad(R"({"mix": 1})", "param_groups[1].mix");
  expect(dsopt::find_hyper(params, "mix_b") && !dsopt::find_hyper(params, "eps"), "names");
  expect(!dsopt::hyper_value_error(*dsopt::find_hyper(params, "gamma"), 1.0).empty() &&
             dsopt::hyper_value_error(*dsopt::find_hyper(params, "gamma"), 0.999).empty(),
         "a set value's range");
}

std::vector<uint8_t> bytes_of(const std::vector<double>& v) {
  std::vector<uint8_t> b(v.size() * 8);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void test_section() {
  const std::vector<HyperParam> params = descriptor();
  std::vector<AdamHyper> groups(2);
  for (AdamHyper& h : groups) dsopt::set_hyper_defaults(params, h);
  groups[1].weight_decay = 0.125;
  groups[1].extra[0] = 0.75;
  groups[1].extra[2] = 8.0;
  const std::vector<double> values = dsopt::hyper_section_values(params, groups);
  expect(values == std::vector<double>{0.0, 0.5, 1.0, 2.0, 0.125, 0.75, 1.0, 8.0},
         "the section: every name but lr, per group, in order");
  std::vector<AdamHyper> fresh(2);
  for (AdamHyper& h : fresh) dsopt::set_hyper_defaults(params, h);
  fresh[0].lr = 0.3;
  std::vector<uint8_t> b = bytes_of(values);
  const std::vector<AdamHyper> loaded = dsopt::read_hyper_values(params, b.data(), b.size(), fresh);
  expect(loaded[1].weight_decay == 0.125 && loaded[1].extra[0] == 0.75 && loaded[1].extra[2] == 8.0 &&
             loaded[0].lr == 0.3,
         "restored, lr left to common.lr");
  b = bytes_of({0.0, 0.5, 1.0, 2.0, 0.125, 1.5, 1.0, 8.0});
  const auto [status, message] = thrown([&] { dsopt::read_hyper_values(params, b.data(), b.size(), fresh); });
  expect(status == DSOPT_ECORRUPT && message.find("gamma of group 1") != std::string::npos,
         "a value out of range refused: " + message);
  b.resize(7 * 8);
  expect(thrown([&] { dsopt::read_hyper_values(params, b.data(), b.size(), fresh); }).first == DSOPT_ECORRUPT,
         "a size of no layout refused");
  // The earlier layout (beta1, beta2, eps, weight_decay per group): read by
  // name, the names this list lacks ignored.
  const std::vector<HyperParam> three = dsopt::adam_hyper_params({"lr", "beta1", "beta2", "weight_decay"});
  std::vector<AdamHyper> lion(2);
  b = bytes_of({0.8, 0.95, 1e-8, 0.01, 0.7, 0.9, 7.0, 0.02});
  const std::vector<AdamHyper> old = dsopt::read_hyper_values(three, b.data(), b.size(), lion);
  expect(old[0].beta1 == 0.8 && old[0].beta2 == 0.95 && old[0].weight_decay == 0.01 && old[1].beta1 == 0.7 &&
             old[1].weight_decay == 0.02 && old[1].eps == AdamHyper().eps,
         "the earlier layout read by name");
  b = bytes_of({0.8, 0.95, 0.01, 0.7, 0.9, 0.02});
  const std::vector<AdamHyper> now = dsopt::read_hyper_values(three, b.data(), b.size(), lion);
  expect(now[1].beta2 == 0.9 && now[1].weight_decay == 0.02, "the descriptor's layout");
}

}  // namespace

int main() {
  test_config();
  test_section();
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}

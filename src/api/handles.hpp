// What the opaque C handles hold.
#pragma once
#include <memory>
#include <string>

#include "comm/codec_runs.hpp"
#include "comm/comm.hpp"
#include "facade/optimizer.hpp"

struct dsopt_comm {
  std::unique_ptr<dsopt::Comm> impl;
};

struct dsopt_optimizer {
  std::unique_ptr<dsopt::Optimizer> impl;
  std::string config_text;  // the config it was created from, normalised (dsopt_get_config)
};

struct dsopt_codec {
  std::unique_ptr<dsopt::CodecRuns> impl;
};

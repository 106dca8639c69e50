// `--write-seeds DIR`, which every fuzz target takes in LLVMFuzzerInitialize:
// writes the target's seed corpus into DIR and exits.
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>

inline void write_seeds_if_asked(int argc, char** argv, void (*write_seeds)(const std::string& dir)) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--write-seeds") == 0) {
      write_seeds(argv[i + 1]);
      std::exit(0);
    }
}

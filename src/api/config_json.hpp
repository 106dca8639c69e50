// The canonical configuration (dsopt_get_config, dsopt_config_canonical):
// every key of docs/reference/config.md with its effective value.
#pragma once
#include <cstdint>
#include <string>

namespace dsopt {

class Optimizer;

// The canonical JSON of a config text; throws what parse_config throws.
std::string canonical_config(const char* json_text);

// The canonical JSON of an optimizer created from `config_text`: that
// config with the group hyperparameters and gradient clipping it runs with now.
std::string current_config(const Optimizer& opt, const std::string& config_text);

// dsopt's string-buffer convention: *out_size (may be NULL) receives the
// bytes `text` needs with its terminating NUL; dst NULL with capacity 0 only
// asks for that size; a capacity too small is DSOPT_EBUFS, nothing written.
void copy_text(const std::string& text, char* dst, uint64_t capacity, uint64_t* out_size);

}  // namespace dsopt

// The sampling flags of kiln run, kiln chat and kiln serve (llama.cpp's names and defaults; for serve, the defaults
// of the requests' sampling fields): --temp --top-k --top-p --min-p --typical --repeat-penalty --repeat-last-n
// --presence-penalty --frequency-penalty --dry-multiplier --dry-base --dry-allowed-length --dry-penalty-last-n
// --dry-sequence-breaker --xtc-probability --xtc-threshold --mirostat --mirostat-lr --mirostat-ent -l/--logit-bias
// -s/--seed.
#pragma once

#include <cstdint>
#include <string>

#include "cli/args.h"
#include "runtime/sampler.h"
#include "util/status.h"

namespace kiln::cli {

void add_sampling_options(ArgParser& args, SamplerParams* p);
// Range checks of the sampling flags before the model loads; errors name the flag (--top-p 7 like --min-p 2).
Status check_sampling_options(const SamplerParams& p);
// After the model loaded: every --logit-bias token is in its vocabulary.
Status check_sampling_vocab(const SamplerParams& p, int32_t n_vocab);
// llama.cpp's TOKEN_ID(+/-)BIAS ("15043+1", "15043-0.5", "2-inf" bans token 2); errors name `flag`.
Result<LogitBias> parse_logit_bias(const std::string& flag, const std::string& value);

}  // namespace kiln::cli

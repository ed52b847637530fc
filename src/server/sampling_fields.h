// The sampler fields of a chat or completions request beyond OpenAI's temperature/top_p/penalties/seed, named as
// llama-server names them: typical_p, xtc_probability, xtc_threshold, dry_multiplier, dry_base, dry_allowed_length,
// dry_penalty_last_n, dry_sequence_breakers, mirostat (0, 1, 2), mirostat_tau, mirostat_eta, and logit_bias
// (OpenAI's {"token id": bias} with bias in [-100, 100], llama-server's [[token id, bias], ["text", bias], ...],
// false for a banned token; a text key or entry biases each of its tokens). Each field given replaces the server's default (kiln serve's sampling flags); a value out of range
// is a 400 naming the field. tfs_z is refused unless neutral (kiln has no such sampler).
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/sampler.h"
#include "server/openai.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

std::optional<ApiError> parse_sampler_fields(const json& body, const Tokenizer& tok, SamplerParams* sp);

// llama-server's speculative-decoding fields against the server's SpecConfig (kiln serve's --spec-* and -md):
// speculative.n_max (0 .. --spec-draft-n-max), speculative.n_min (0 .. n_max) and speculative.p_min ([0, 1], a
// draft model's only) go into *out; speculative.type, speculative.ngram_size_n / _m and speculative.ngram_min_hits
// are accepted when they name what the server runs and refused otherwise, as is a nested "speculative" object.
std::optional<ApiError> parse_spec_fields(const json& body, const SpecConfig& server, SpecRequest* out);

}  // namespace kiln::server

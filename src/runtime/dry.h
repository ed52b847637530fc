// DRY ("don't repeat yourself", as llama.cpp's llama_sampler_dry defines it): which tokens would extend a
// repetition of the context's end, and by how much; and the sequence breakers a repetition never extends across,
// resolved for a vocabulary. The sampler (runtime/sampler.h) turns the lengths into logit penalties.
//
// Definitions. w: the window of accepted tokens (oldest first), N = |w|. A sequence breaker is a token sequence
// (head, tail...). rep_limit: the number of tokens after the end of the latest breaker occurrence in w (N when
// none). For each earlier position i (0 <= i < N - 1), L(i) = min(rep_limit, the length of the longest common
// suffix of w[0..i] and w); the token w[i + 1] would extend that repetition, so len[w[i + 1]] = max L(i) over
// the positions with L(i) >= allowed_length. Nothing is reported when N <= allowed_length or rep_limit <
// allowed_length. Cost: O(N) (Z-algorithm over the reversed window) plus the breaker scan.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kiln {

class DryBreakers {
 public:
  inline static constexpr size_t kMaxBytes = 40;      // a breaker string longer than this is cut (llama.cpp)
  inline static constexpr size_t kMaxTailTokens = 20;  // a breaker's tail is cut to this many tokens (llama.cpp)
  inline static constexpr size_t kMaxBreakers = 64;    // strings per request (each costs a scan of the vocabulary)

  DryBreakers() = default;
  // From token sequences (head first); empty ones are skipped, duplicates kept once.
  explicit DryBreakers(std::vector<std::vector<int32_t>> seqs);
  // The breaker strings for a vocabulary, as llama.cpp resolves them: every token whose text contains a breaker
  // is a breaker alone; a token whose text ends with a proper prefix of a breaker heads the breaker
  // (token, encode(rest of the breaker)). Empty strings are skipped.
  static DryBreakers for_vocabulary(const Tokenizer& tok, const std::vector<std::string>& breakers);

  // The tails of the breakers headed by t ([first, last) into entries()).
  std::pair<size_t, size_t> headed_by(int32_t t) const;
  bool single(int32_t t) const;  // t alone is a breaker (a tail of length 0)
  const std::vector<std::pair<int32_t, std::vector<int32_t>>>& entries() const { return entries_; }

 private:
  void finish();  // sorts by (head, tail) and drops duplicates
  std::vector<std::pair<int32_t, std::vector<int32_t>>> entries_;  // (head, tail), sorted
};

// The repetition lengths of the definition above for window w: len[t] = len(t) + 1 for every t it names (0 stays
// "none"; ids outside [0, len.size()) are skipped), each such t listed once in *touched; len must be all zero on
// entry. z: scratch.
void dry_repeat_lengths(std::span<const int32_t> w, const DryBreakers* breakers, int32_t allowed_length,
                        std::vector<int32_t>* z, std::vector<int32_t>* len, std::vector<int32_t>* touched);

// The penalty for a repetition of length L: multiplier * base^(L - allowed_length), the exponent capped so the
// power stays finite in float.
float dry_penalty(float multiplier, float base, int32_t allowed_length, int32_t L);

}  // namespace kiln

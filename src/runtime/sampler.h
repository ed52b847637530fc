// Sampler chain (llama.cpp's default order and defaults): penalties -> top-k -> top-p -> min-p -> temperature ->
// draw, seeded. temp <= 0 means greedy: argmax of the penalized logits, ties to the lowest id.
//
// Semantics (as llama.cpp's llama_sampler_* of the same names):
//   penalties: for each distinct token t among the last penalty_last_n accepted tokens, seen c times:
//              logit[t] = logit[t] <= 0 ? logit[t] * repeat_penalty : logit[t] / repeat_penalty,
//              then logit[t] -= c * frequency_penalty + presence_penalty.
//   top-k:     keep the k highest logits (ties broken by the lower id).
//   top-p:     softmax over the survivors; keep the shortest prefix (by descending logit) whose probability mass
//              reaches top_p (at least one token).
//   min-p:     keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
//   temp:      divide the surviving logits by temp, softmax, draw one with the RNG.
// Truncation happens at temperature 1 (temperature comes after it), as in llama.cpp's default chain.
//
// Cost: sample() allocates nothing (its buffers are sized to n_vocab at construction); O(n_vocab) plus a partial
// sort of top_k candidates (or an adaptive sort when top_k is off).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "util/status.h"

namespace kiln {

inline constexpr uint64_t kRandomSeed = 0xFFFFFFFF;  // LLAMA_DEFAULT_SEED

struct SamplerParams {
  float temp = 0.8f;
  int32_t top_k = 40;             // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.05f;            // <= 0: off
  float repeat_penalty = 1.0f;    // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;    // window of recent tokens the penalties look at (-1: whole context, 0: off)
  uint64_t seed = kRandomSeed;    // LLAMA_DEFAULT_SEED: pick a random seed
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p, int32_t n_vocab);
  Status validate() const;  // names the parameter out of range
  // Picks the next token from one row of n_vocab logits (not modified). logits.size() must be n_vocab.
  int32_t sample(std::span<const float> logits);
  // The chain without the draw: the candidates that survive truncation with their final probabilities (after
  // temperature, summing to 1), highest first when any truncation sorted them. Greedy: the argmax with p = 1.
  // For tests and for reporting log-probabilities.
  struct TokenProb {
    int32_t id;
    float p;
  };
  void candidates(std::span<const float> logits, std::vector<TokenProb>* out);
  // Records a token of the context (prompt or generated) for the penalties. Ids outside the vocabulary are
  // ignored (they cannot be penalized).
  void accept(int32_t token);
  // Forgets the accepted tokens and restarts the RNG from the seed.
  void reset();
  // Forgets the accepted tokens only (the RNG keeps its state): for rewinding a sequence.
  void clear_history() { history_.clear(); }
  uint64_t seed() const { return seed_; }
  const SamplerParams& params() const { return p_; }
  bool greedy() const { return p_.temp <= 0.0f; }
  // Greedy with no penalty active: the next token is the plain argmax of the logits, which the backend can compute
  // (OutputKind::kArgmax) so the logits row never leaves the device. Same NaN rule and ties as argmax() below.
  bool argmax_only() const { return greedy() && !penalties_active(); }

 private:
  struct Cand {
    int32_t id;
    float logit;
    float p;
  };
  bool penalties_active() const;
  size_t prepare(std::span<const float> logits, double* sum);  // the chain into cands_[0..n), p unnormalized
  void apply_penalties();                 // on cands_ while cands_[i].id == i
  size_t top_k_cut(size_t n);             // sorts the first k of cands_ by (logit desc, id asc); returns new size
  size_t top_p_cut(size_t n, bool sorted);
  size_t min_p_cut(size_t n);
  double uniform();                       // [0, 1) with 53 random bits

  SamplerParams p_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  std::vector<int32_t> history_;          // accepted tokens; the penalty window is its tail
  std::vector<int32_t> counts_;           // [n_vocab] scratch, all zero between calls
  std::vector<Cand> cands_;               // [n_vocab] scratch
};

// Index of the largest value, ties to the lowest index; NaN never wins. -1 for an empty span.
int32_t argmax(std::span<const float> logits);

}  // namespace kiln

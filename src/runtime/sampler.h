// Sampler chain, in llama.cpp's default order and with its defaults and definitions:
//   logit bias -> penalties -> DRY -> top-k -> typical -> top-p -> min-p -> XTC -> temperature -> draw, seeded.
// temp <= 0 means greedy: the highest logit that survives the chain, ties to the lowest id (the truncations of
// top-k, top-p and min-p always keep it; typical and XTC may not).
//
// Semantics (as llama.cpp's llama_sampler_* of the same names):
//   logit bias: logit[t] += bias for each (t, bias) given (a bias of -inf bans t).
//   penalties: for each distinct token t among the last penalty_last_n accepted tokens, seen c times:
//              logit[t] = logit[t] <= 0 ? logit[t] * repeat_penalty : logit[t] / repeat_penalty,
//              then logit[t] -= c * frequency_penalty + presence_penalty.
//   DRY:       ("don't repeat yourself", runtime/dry.h) a token t that would extend a repetition of the context's
//              last L tokens (L >= dry_allowed_length, over the last dry_penalty_last_n accepted tokens, L cut at
//              the last sequence breaker) gets logit[t] -= dry_multiplier * dry_base^(L - dry_allowed_length).
//   top-k:     keep the k highest logits (ties broken by the lower id).
//   typical:   softmax over the survivors, entropy H = -sum p log p; keep the tokens closest to it (by
//              |-log p - H|, ascending) up to the first whose cumulative probability exceeds typical_p.
//   top-p:     softmax over the survivors; keep the shortest prefix (by descending logit) whose probability mass
//              reaches top_p (at least one token).
//   min-p:     keep tokens with p >= min_p * p_max, i.e. logit >= max_logit + log(min_p).
//   XTC:       ("exclude top choices") with probability xtc_probability (its own RNG, seeded like the draw's):
//              softmax over the survivors; of the tokens with p >= xtc_threshold, all but the least probable are
//              removed (nothing happens when fewer than two qualify; xtc_threshold > 0.5 is off).
//   temp:      divide the surviving logits by temp, softmax, draw one with the RNG.
// Truncation happens at temperature 1 (temperature comes after it), as in llama.cpp's default chain.
//
// Mirostat (mirostat 1 or 2; llama.cpp's llama_sampler_mirostat / _v2, Basu et al. 2020) replaces the chain after
// the logit bias, as in llama.cpp's common sampler: logit bias -> temperature -> mirostat -> draw. Penalties, DRY,
// top-k, typical, top-p, min-p and XTC do not run. State: mu, the surprise budget in bits, starts at 2 * tau and
// after each draw moves by mu -= eta * (-log2 p(drawn) - tau), p over the candidates the token was drawn from.
//   v1: softmax over the vocabulary, sorted; from the top m = 100 probabilities (those > 0) the Zipf exponent
//       s = sum t_i b_i / sum t_i^2 with t_i = ln((i + 2) / (i + 1)), b_i = ln(p_i / p_(i+1)); e = s - 1;
//       k = (e * 2^mu / (1 - n_vocab^-e))^(1 / s); keep the top max(k, 1) tokens.
//   v2: softmax; keep the tokens with surprise -log2 p <= mu (at least the most probable one).
// temp <= 0 with mirostat is greedy too (llama.cpp's temperature keeps only the top token).
//
// Cost: sample() allocates nothing once the history has reached its window (its buffers are sized to n_vocab at
// construction); O(n_vocab) plus a partial sort of top_k candidates (or an adaptive sort when top_k is off); DRY
// adds O(window), typical and XTC a sort of the survivors.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace kiln {

inline constexpr uint64_t kRandomSeed = 0xFFFFFFFF;  // LLAMA_DEFAULT_SEED

struct LogitBias {
  int32_t token;
  float bias;  // -inf: the token is never picked
};

class DryBreakers;  // runtime/dry.h

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
  float typical_p = 1.0f;         // >= 1: off
  float xtc_probability = 0.0f;   // <= 0: off
  float xtc_threshold = 0.1f;     // > 0.5: off
  float dry_multiplier = 0.0f;    // 0: off
  float dry_base = 1.75f;         // >= 1
  int32_t dry_allowed_length = 2;
  int32_t dry_penalty_last_n = -1;  // window of recent tokens DRY looks at (-1: whole context, 0: off)
  // DRY's sequence breakers as text (at most 40 bytes each are used, as llama.cpp); a repetition never extends
  // across one. The engine loop resolves them for its vocabulary into dry_breakers (Scheduler::submit).
  std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};
  std::shared_ptr<const DryBreakers> dry_breakers;  // null: no breakers
  std::vector<LogitBias> logit_bias;
  int32_t mirostat = 0;           // 0: off, 1: mirostat, 2: mirostat 2.0 (replaces the truncations, see above)
  float mirostat_tau = 5.0f;      // target surprise in bits (llama.cpp's --mirostat-ent)
  float mirostat_eta = 0.1f;      // learning rate of mu (llama.cpp's --mirostat-lr)

  bool dry_enabled() const { return dry_multiplier != 0.0f && dry_base >= 1.0f && dry_penalty_last_n != 0; }
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
  // Records a token of the context (prompt or generated) for the penalties and DRY. Ids outside the vocabulary
  // are ignored (they cannot be penalized).
  void accept(int32_t token);
  // How many of the latest accepted tokens the chain reads (penalties, DRY): -1 all, 0 none. A rewound sequence
  // re-accepts that many.
  int64_t history_window() const;
  // Forgets the accepted tokens, restarts the RNGs from the seed and mirostat's mu from 2 * tau.
  void reset();
  // Mirostat's surprise budget (bits), updated by each sample(); 2 * tau until the first.
  float mirostat_mu() const { return mu_; }
  // Forgets the accepted tokens only (the RNG and mu keep their state): for rewinding a sequence.
  void clear_history() { history_.clear(); }
  uint64_t seed() const { return seed_; }
  const SamplerParams& params() const { return p_; }
  bool greedy() const { return p_.temp <= 0.0f; }
  // Greedy with nothing that changes logits or truncates past the top: the next token is the plain argmax of the
  // logits, which the backend can compute (OutputKind::kArgmax) so the logits row never leaves the device. Same
  // NaN rule and ties as argmax() below.
  bool argmax_only() const {
    if (mirostat_on()) return greedy() && p_.logit_bias.empty();
    return greedy() && !penalties_active() && p_.logit_bias.empty() && !dry_active() && !typical_on() && !xtc_on();
  }

 private:
  struct Cand {
    int32_t id;
    float logit;
    float p;
    float score;  // typical: |-log p - H|
  };
  bool mirostat_on() const { return p_.mirostat != 0; }
  bool penalties_active() const;
  bool dry_active() const;
  bool typical_on() const { return p_.typical_p < 1.0f; }
  bool xtc_on() const { return p_.xtc_probability > 0.0f && p_.xtc_threshold <= 0.5f; }
  size_t prepare(std::span<const float> logits, double* sum);  // the chain into cands_[0..n), p unnormalized
  // The stages. Those before truncation run while cands_[i].id == i; the cuts return the new size.
  void apply_logit_bias();
  void apply_penalties();
  void apply_dry();
  size_t top_k_cut(size_t n);             // sorts the first k of cands_ by (logit desc, id asc)
  size_t typical_cut(size_t n);           // leaves cands_ in typical order (not by logit)
  size_t top_p_cut(size_t n, bool sorted);
  size_t min_p_cut(size_t n);
  size_t xtc_cut(size_t n, bool sorted);  // leaves cands_ sorted by logit when it draws
  size_t mirostat_cut(size_t n, double* sum);  // temperature and mirostat's truncation; p and *sum as prepare()
  double uniform();                       // [0, 1) with 53 random bits (the draw)
  size_t draw(size_t n, double sum);      // the index of the drawn candidate of cands_[0..n)

  SamplerParams p_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  std::mt19937 xtc_rng_;                  // XTC's own draws (as llama.cpp: the draw's sequence does not depend on it)
  int64_t window_ = 0;                    // history_window()
  float mu_ = 0.0f;                       // mirostat's surprise budget (bits)
  std::vector<int32_t> history_;          // accepted tokens; the windows are its tail
  std::vector<int32_t> counts_;           // [n_vocab] scratch, all zero between calls
  std::vector<Cand> cands_;               // [n_vocab] scratch
  std::vector<int32_t> dry_z_;            // DRY: [window] scratch
  std::vector<int32_t> dry_len_;          // DRY: [n_vocab] longest repetition each token would extend (0 between calls)
  std::vector<int32_t> dry_touched_;      // DRY: the tokens with dry_len_ set
};

// Index of the largest value, ties to the lowest index; NaN never wins. -1 for an empty span.
int32_t argmax(std::span<const float> logits);
// The argmax over the allowed entries (mask: bit i % 64 of word i / 64, ceil(size / 64) words, bits past the span
// ignored) with Backend::argmax_masked's rule: the first maximum, NaN below every number, the first allowed index
// when every allowed entry is NaN, -1 when none is allowed.
int32_t masked_argmax(std::span<const float> logits, std::span<const uint64_t> mask);

}  // namespace kiln

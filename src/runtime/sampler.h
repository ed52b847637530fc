// Sampler chain (llama.cpp's default order and defaults): penalties -> top-k -> top-p -> min-p -> temperature ->
// draw, seeded. temp <= 0 means greedy (argmax, ties to the lowest id).
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "util/status.h"

namespace kiln {

struct SamplerParams {
  float temp = 0.8f;
  int32_t top_k = 40;             // <= 0: off
  float top_p = 0.95f;            // >= 1: off
  float min_p = 0.05f;            // <= 0: off
  float repeat_penalty = 1.0f;    // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;    // window of recent tokens the penalties look at (-1: whole context)
  uint64_t seed = 0xFFFFFFFF;     // LLAMA_DEFAULT_SEED: pick a random seed
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p, int32_t n_vocab);
  Status validate() const;  // names the parameter out of range
  // Picks the next token from one row of n_vocab logits (not modified).
  int32_t sample(std::span<const float> logits);
  // Records a token of the context (prompt or generated) for the penalties.
  void accept(int32_t token);
  void reset();
  uint64_t seed() const { return seed_; }

 private:
  SamplerParams p_;
  int32_t n_vocab_;
  uint64_t seed_;
  std::mt19937 rng_;
  std::deque<int32_t> recent_;
  struct Cand {
    int32_t id;
    float logit;
    float p;
  };
  std::vector<Cand> cands_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace kiln

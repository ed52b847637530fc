// Prompt lookup ("ngram-simple" speculative decoding, no second model): the tokens that followed the most recent
// earlier occurrence of the sequence's last size_n tokens are proposed as drafts, at most size_m of them. It pays
// where the output copies from the context (code edits, quoting, extraction); elsewhere it proposes nothing and
// costs a hash lookup per step.
//
// Index: one hash map from the hash of every size_n-gram of the sequence (prompt and generated) to the position
// just past its latest occurrence, extended incrementally as the sequence grows (each token is hashed once per
// size_n-gram it ends: O(size_n) per token). A hit is confirmed by comparing the tokens (hash collisions never
// propose).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

#include "runtime/hooks.h"

namespace kiln {

struct NgramDraftParams {
  int32_t size_n = 12;  // lookup length (llama.cpp --spec-ngram-simple-size-n)
  int32_t size_m = 48;  // at most this many drafts per step (--spec-ngram-simple-size-m)
};

class NgramDraft final : public DraftProposer {
 public:
  explicit NgramDraft(NgramDraftParams p) : p_(p) {}
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override;
  void accepted(int32_t /*n*/) override {}

 private:
  uint64_t hash_at(std::span<const int32_t> tokens, size_t end) const;  // tokens[end - size_n, end)
  NgramDraftParams p_;
  size_t indexed_ = 0;  // n-grams ending at positions < indexed_ are in the map
  std::unordered_map<uint64_t, size_t> last_end_;  // hash -> end (one past the n-gram) of its latest occurrence
};

}  // namespace kiln

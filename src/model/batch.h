// A batch is a flat list of tokens from any number of sequences: prefill chunks and decode tokens of many
// sequences go through one forward pass together (docs/ARCHITECTURE.md, "A step"). Within one sequence, positions in a batch
// must be consecutive and continue that sequence (pos == the sequence's length at that point; the runtime checks it
// when it plans the step).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

struct BatchToken {
  int32_t token = 0;
  int32_t pos = 0;      // position in its sequence (RoPE position and KV slot)
  int32_t seq_id = 0;
  bool want_logits = false;
};

struct Batch {
  std::vector<BatchToken> tokens;

  void add(int32_t token, int32_t pos, int32_t seq_id, bool want_logits) {
    tokens.push_back({token, pos, seq_id, want_logits});
  }
  void clear() { tokens.clear(); }
  size_t size() const { return tokens.size(); }
  size_t n_logits() const {
    size_t n = 0;
    for (auto& t : tokens) n += t.want_logits;
    return n;
  }
};

}  // namespace kiln

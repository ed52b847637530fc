// Pools the final-norm hidden rows of one embedding request (runtime/embedding.h), fed chunk by chunk as the
// engine loop runs them (a long input spans several steps; a preempted one starts over after reset()).
#pragma once

#include <cstdint>
#include <vector>

#include "model/embedding.h"
#include "runtime/embedding.h"

namespace kiln {

class Pooler {
 public:
  // head: the model's EmbeddingInfo (its classification head for rank); must outlive the Pooler.
  Pooler(Pooling p, const EmbeddingInfo& head) : p_(p), head_(head) {}
  void reset();
  // rows: [n][n_embd], the vectors of positions pos0 .. pos0 + n - 1 of the input, in order; `ends`: the input's
  // last token is the last of them.
  void add(const float* rows, int64_t n, int64_t pos0, bool ends);
  // The result (runtime/embedding.h, EmbeddingSetup::n_out): none [n_tok * n_embd], mean/cls/last [n_embd],
  // rank [n_cls].
  std::vector<float> result() const;

 private:
  Pooling p_;
  const EmbeddingInfo& head_;
  std::vector<double> sum_;   // mean: the sum of the rows so far
  std::vector<float> pick_;   // none: every row; cls/last/rank: the chosen row
  int64_t n_ = 0;             // rows seen
};

}  // namespace kiln

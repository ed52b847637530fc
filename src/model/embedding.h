// What a GGUF file says about its model's embedding output, read on the host once (llama.cpp's keys):
//   <arch>.pooling_type              0 none, 1 mean, 2 cls, 3 last, 4 rank (the file's integer; -1 when absent)
//   cls.output.weight [n_embd, n_cls] and cls.output.bias [n_cls]
//                                    the classification head of a rank (reranker) model: scores = W h + b over
//                                    the pooled hidden state h; dequantized here into f32 rows
//   cls.weight [n_embd, n_embd] and cls.bias [n_embd]
//                                    a dense layer before it (BERT cross-encoders): h = tanh(W h + b) first; with no
//                                    cls.output.weight its n_embd outputs are the scores
//   <arch>.classifier.output_labels  names of the head's outputs
//   tokenizer.chat_template.rerank   the prompt of a (query, document) pair, with {query} and {document}
// A qwen3 file without cls.output.weight gets the head of the Qwen3-Reranker recipe: the output projection's rows of
// the tokens "yes" and "no" (the two logits of the answer), when the vocabulary has both. qwen3 heads are followed
// by a softmax over their outputs (as llama.cpp does for qwen3 rank models): the score is P("yes").
// Pooling itself happens on the host over fetched hidden rows (runtime/pooler.h); the model only computes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "util/status.h"

namespace kiln {

struct EmbeddingInfo {
  int64_t n_embd = 0;
  int32_t pooling_type = -1;  // <arch>.pooling_type as stored; -1: the file has none
  // Classification head (n_cls = 0: none): w [n_cls][n_embd] row-major, b [n_cls] or empty.
  int64_t n_cls = 0;
  std::vector<float> cls_w, cls_b;
  std::vector<float> dense_w, dense_b;  // cls.weight [n_embd][n_embd], cls.bias [n_embd]; empty: no dense layer
  bool cls_softmax = false;         // scores are softmax(W h + b)
  bool rank_last = false;           // rank pooling reads the last token (qwen3), else the first (llama.cpp's rule)
  std::string cls_source;           // where the head comes from, for messages ("cls.output.weight", ...)
  std::vector<std::string> labels;  // <arch>.classifier.output_labels (may be empty)
  std::string rerank_template;      // tokenizer.chat_template.rerank ("" when absent)
};

// Reads the keys and tensors above from the model's file; errors name the key or tensor at fault (a head whose
// shape does not match n_embd, a pooling type out of range).
Result<EmbeddingInfo> read_embedding_info(const Model& model);

}  // namespace kiln

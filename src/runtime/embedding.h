// Embeddings and reranking (POST /v1/embeddings, /embedding, /v1/rerank, kiln embed). An embedding request
// (GenRequest::embed) runs its tokens through the model once and generates nothing: the engine loop asks the model
// for the final-norm hidden state of every token (model/step.h, hidden steps), pools them on the host
// (runtime/pooler.h) and returns the pooled vector in RequestEnd::embedding. The caller then truncates it
// (`dimensions`) and normalizes it (embd_normalize) with the functions below.
//
// Pooling (one per engine, as llama-server: the file's <arch>.pooling_type, or --pooling):
//   none   every token's vector ([n_tok][n_embd]; not for the OpenAI shape)
//   mean   the mean of the token vectors          cls    the first token's      last   the last token's
//   rank   the classification head over the last token's (qwen3) or the first token's vector: one score per
//          head output (qwen3: softmax over "yes"/"no", the score is P(yes)); reranking uses output 0
// A model whose file has no pooling type pools as none (llama-server's default).
//
// This header names no model or backend type (the server includes it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

// The values are GGUF's pooling_type numbers.
enum class Pooling : int32_t { kNone = 0, kMean = 1, kCls = 2, kLast = 3, kRank = 4 };
const char* pooling_name(Pooling p);  // "none", "mean", "cls", "last", "rank"
// Parses a pooling name; the error names `what` (the flag or field).
Result<Pooling> parse_pooling(std::string_view s, const char* what);

// What an engine with embeddings on produces (Scheduler::embedding()).
struct EmbeddingSetup {
  bool on = false;           // embedding requests are served (EngineConfig::embeddings)
  Pooling pooling = Pooling::kNone;
  bool model_pooling = false;  // the model's file declares a pooling type: an embedding model
  int64_t n_embd = 0;        // floats of a token vector (and of a pooled one, but for rank)
  int64_t n_out = 0;         // floats of a request's result: n_embd (mean, cls, last), the head's outputs (rank);
                             // none: n_embd per token
  std::vector<std::string> labels;  // rank: names of the head's outputs (may be empty)
  // rank: the prompt of a (query, document) pair, with {query} and {document} (the file's, else the
  // Qwen3-Reranker format when the vocabulary has its chat markers); "": the pair format of rerank_prompt.
  std::string rerank_template;
};

// Normalization (llama.cpp's embd_normalize): -1 none, 0 max-abs scaled to the int16 range (x * 32760 / max|x|),
// 1 taxicab, 2 euclidean (the default), p > 2 the p-norm. A zero vector stays zero. check_normalize: the error
// names `what`.
Status check_normalize(int32_t mode, const char* what);
void normalize(std::span<float> v, int32_t mode);

// The tokens of an embedding input: the text with special tokens parsed and the vocabulary's own added (BOS, EOS,
// [CLS]/[SEP] where its flags say so: an embedding model's EOS is part of its input), as llama-server tokenizes one.
std::vector<int32_t> embedding_tokens(const Tokenizer& tok, std::string_view text);

// The tokens of a (query, document) pair for a rank model. With a template: {query} and {document} replaced, then
// tokenized with special tokens parsed and none added. Without: [BOS] query [EOS] [SEP] document [EOS], each
// special token where the vocabulary adds it (add_bos, add_eos, add_sep), as llama-server lays a pair out.
std::vector<int32_t> rerank_prompt(const Tokenizer& tok, const std::string& tmpl, const std::string& query,
                                   const std::string& doc);

}  // namespace kiln

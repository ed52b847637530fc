// Byte-pair encoding by merge rank (tokenizer.ggml.model "gpt2" and "gemma4").
//
// Symbols are interned strings: ids below n_vocab are the vocabulary tokens, ids above name merge parts and
// results that are not tokens themselves. A merge is a pair of symbol ids -> (rank, result id). A word is merged
// with a min-heap of candidate pairs keyed (rank, left position), as llama.cpp orders them; a stale candidate
// (one of its symbols changed since it was queued) is skipped when popped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/vocab.h"

namespace kiln::tok {

class BpeModel {
 public:
  // Reads tokenizer.ggml.merges ("left right" strings, rank = index; a repeated pair keeps its first rank).
  static Result<std::unique_ptr<BpeModel>> create(const gguf::File& file, const Vocab& vocab);

  // Encodes raw text (no special tokens in it), appending ids.
  void encode(std::string_view text, std::vector<int32_t>* out) const;

  const PreTokenizerSpec& spec() const { return spec_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  BpeModel(const Vocab& vocab) : vocab_(vocab) {}
  int32_t intern(std::string_view s);
  int32_t lookup(std::string_view s) const;
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  void emit_symbol(std::string_view text, int32_t sym, std::vector<int32_t>* out) const;

  const Vocab& vocab_;
  PreTokenizerSpec spec_;
  std::shared_ptr<const PreTokenizer> pre_;
  std::unordered_map<std::string, int32_t> extra_;  // non-token symbol strings -> ids >= n_vocab
  std::unordered_map<uint64_t, Merge> merges_;       // (left id << 32 | right id)
  int32_t byte_symbol_[256];                          // byte-level mode: symbol of each byte's code point, or -1
};

}  // namespace kiln::tok

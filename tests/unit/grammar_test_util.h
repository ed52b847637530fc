// Shared by the grammar tests: small and real vocabularies, whole-string matching, and sampling under the mask
// with random logits until the grammar completes.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace kiln::grammar::test {

// Every single byte as a token (id = byte value) and an end-of-generation token, id 256.
inline std::shared_ptr<const VocabIndex> byte_vocab() {
  static const std::shared_ptr<const VocabIndex> v = [] {
    Vocabulary voc;
    for (int b = 0; b < 256; ++b) voc.tokens.push_back(std::string(1, static_cast<char>(b)));
    voc.tokens.push_back("");
    voc.eog_ids = {256};
    return VocabIndex::build(std::move(voc));
  }();
  return v;
}

// The committed ggml-vocab-<name>.gguf (test::vocab_path) as the grammar layer sees it: each token's output bytes ("" for
// control tokens), the end-of-generation ids from the tokenizer.
inline std::shared_ptr<const VocabIndex> gguf_vocab(const std::string& path) {
  auto f = gguf::File::open(path);
  if (!f) return nullptr;
  auto t = Tokenizer::from_gguf(*f);
  if (!t) return nullptr;
  Vocabulary voc;
  for (int32_t id = 0; id < (*t)->n_vocab(); ++id) {
    voc.tokens.push_back((*t)->token_to_piece(id, false));
    if ((*t)->is_eog(id)) voc.eog_ids.push_back(id);
  }
  return VocabIndex::build(std::move(voc));
}

inline std::shared_ptr<const VocabIndex> gpt2_vocab() {
  static const std::shared_ptr<const VocabIndex> v =
      gguf_vocab(kiln::test::vocab_path("gpt-2"));
  return v;
}

inline std::shared_ptr<const CompiledGrammar> compile(const std::string& gbnf,
                                                      const std::shared_ptr<const VocabIndex>& vocab) {
  auto g = Grammar::from_gbnf(gbnf);
  EXPECT_TRUE(g) << g.status().message() << "\n" << gbnf;
  if (!g) return nullptr;
  auto cg = CompiledGrammar::compile(*g, vocab, 2);
  EXPECT_TRUE(cg) << cg.status().message();
  return cg ? *cg : nullptr;
}

// The whole of `text` is in the grammar's language.
inline bool matches(const std::string& gbnf, const std::string& text) {
  auto cg = compile(gbnf, byte_vocab());
  if (!cg) return false;
  Matcher m(cg);
  return m.accept_bytes(text).is_ok() && m.is_complete();
}

inline bool mask_bit(const std::vector<uint32_t>& words, int32_t id) { return (words[id >> 5] >> (id & 31)) & 1; }

struct Sample {
  std::string text;
  int tokens = 0;
  bool complete = false;  // ended with an end-of-generation token
  std::string error;      // a contract violation, "" when none
};

// Samples under the mask: each step takes the argmax of i.i.d. random logits over the allowed tokens (a uniform
// draw among them). After `budget` tokens it finishes the text instead: the single-byte token that brings the
// grammar closest to completion (every stack can always finish, so this ends), then an end-of-generation token.
inline Sample sample(const std::shared_ptr<const CompiledGrammar>& cg, std::mt19937_64& rng, int budget) {
  const VocabIndex& v = cg->vocab();
  std::vector<int32_t> byte_tokens;
  for (int32_t id = 0; id < v.size(); ++id)
    if (v.token(id).size() == 1 && !v.is_eog(id)) byte_tokens.push_back(id);
  Matcher m(cg);
  std::vector<uint32_t> words(v.mask_words());
  std::vector<int32_t> allowed;
  Sample s;
  for (int step = 0; step < budget + 100'000; ++step) {
    m.fill_mask(words);
    allowed.clear();
    for (size_t w = 0; w < words.size(); ++w)
      for (uint32_t bits = words[w]; bits; bits &= bits - 1)
        allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<uint32_t>(__builtin_ctz(bits))));
    if (allowed.empty()) {
      s.error = "empty mask before completion";
      return s;
    }
    int32_t pick = -1;
    if (step < budget) {
      std::uniform_int_distribution<size_t> d(0, allowed.size() - 1);
      pick = allowed[d(rng)];
    } else if (m.is_complete()) {
      for (int32_t id : allowed)
        if (v.is_eog(id)) pick = id;
    } else {
      uint32_t best = UINT32_MAX;
      for (int32_t id : byte_tokens) {
        if (!mask_bit(words, id) || !m.accept_token(id).is_ok()) continue;
        if (m.min_bytes_to_complete() < best) {
          best = m.min_bytes_to_complete();
          pick = id;
        }
        (void)m.rollback(1);
      }
    }
    if (pick < 0) {
      s.error = "no token to finish with";
      return s;
    }
    Status st = m.accept_token(pick);
    if (!st) {
      s.error = "masked token refused: " + st.message();
      return s;
    }
    ++s.tokens;
    if (v.is_eog(pick)) {
      s.complete = true;
      return s;
    }
    s.text += v.token(pick);
  }
  s.error = "did not finish";
  return s;
}

}  // namespace kiln::grammar::test

// Shared by the grammar fuzz targets: small limits, a small vocabulary, and the matcher exercise with its checks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace kiln::fuzz {

inline void check(bool ok, const char* what, const std::string& detail) {
  if (ok) return;
  std::fprintf(stderr, "grammar fuzz: check failed: %s: %s\n", what, detail.c_str());
  std::abort();
}

inline grammar::Limits small_limits() {
  grammar::Limits l;
  l.max_text_bytes = 256 * 1024;
  l.max_nesting = 40;
  l.max_rules = 500;
  l.max_repeat = 200;
  l.max_nfa_states = 20'000;
  l.max_dfa_states = 4'000;
  l.max_dfa_work = 400'000;
  l.max_chain_words = 200'000;
  l.max_stacks = 256;
  return l;
}

// Every byte, a few multi-byte pieces that cross JSON and GBNF-ish structure, UTF-8 characters and their halves,
// a control token without text, and an end-of-generation token.
inline std::shared_ptr<const grammar::VocabIndex> small_vocab() {
  static const std::shared_ptr<const grammar::VocabIndex> v = [] {
    grammar::Vocabulary voc;
    for (int b = 0; b < 256; ++b) voc.tokens.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"\":", "\",", "{\"", "\"}", "},", "],", " \"", "\n  ", "true", "false", "null", "ab",
                          "abc", "12", "0.", "-1", "é", "\xC3", "\xA9", "日本", "\xE6\x97", "😀", "\\n", "\\u00",
                          "aaaa", "  ", "::=", "[^", "\"\"", "\"a\"", "x\"", ":\"", "1,", "e+"})
      voc.tokens.push_back(t);
    voc.tokens.push_back("");  // a control token
    voc.tokens.push_back("");  // end of generation
    voc.eog_ids = {static_cast<int32_t>(voc.tokens.size() - 1)};
    return grammar::VocabIndex::build(std::move(voc));
  }();
  return v;
}

inline void exercise(const std::shared_ptr<const grammar::Grammar>& g, const uint8_t* data, size_t size) {
  auto cg = grammar::CompiledGrammar::compile(g, small_vocab());
  check(cg.is_ok(), "mask cache compiles", cg.is_ok() ? "" : cg.status().message());
  grammar::Matcher m(*cg);
  const auto& v = (*cg)->vocab();
  std::vector<uint32_t> words(v.mask_words()), before(v.mask_words());
  for (size_t step = 0; step < 12; ++step) {
    m.fill_mask(words);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < v.size(); ++id) {
      const bool bit = (words[id >> 5] >> (id & 31)) & 1;
      check(bit == m.can_accept(id), "mask bit equals the token check", std::to_string(id));
      if (bit) allowed.push_back(id);
    }
    if (allowed.empty()) {
      check(m.is_terminated(), "only a terminated matcher has an empty mask", std::to_string(step));
      return;
    }
    const int32_t pick = allowed[(size > 0 ? data[(step * 7) % size] + step : step) % allowed.size()];
    before = words;
    check(m.accept_token(pick).is_ok(), "a masked token is accepted", std::to_string(pick));
    if (step % 3 == 2) {
      check(m.rollback(1).is_ok(), "rollback of one token", "");
      m.fill_mask(words);
      check(words == before, "rollback restores the mask", std::to_string(pick));
      check(m.accept_token(pick).is_ok(), "the token again", std::to_string(pick));
    }
  }
}

}  // namespace kiln::fuzz

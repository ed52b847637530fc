// The matcher: token masks equal the token-by-token check (the cache's accepted / rejected / uncertain split
// loses nothing), end-of-generation handling, rollback, UTF-8 across token boundaries, and errors as values.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace kiln::grammar {
namespace {

using test::compile;
using test::mask_bit;

const char* kJsonLike = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";

// Along random walks under the mask, the mask equals can_accept() for every token of the vocabulary.
void expect_mask_equals_brute_force(const std::string& gbnf, int walks, int steps, uint64_t seed) {
  auto cg = compile(gbnf, test::gpt2_vocab());
  ASSERT_TRUE(cg);
  // The stack walk over uncertain tokens is part of what is checked.
  EXPECT_GT(cg->stats().uncertain_tokens, 0u);
  const VocabIndex& v = cg->vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> words(v.mask_words());
  for (int w = 0; w < walks; ++w) {
    Matcher m(cg);
    for (int s = 0; s < steps && !m.is_terminated(); ++s) {
      m.fill_mask(words);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < v.size(); ++id) {
        const bool bit = mask_bit(words, id);
        ASSERT_EQ(bit, m.can_accept(id)) << "token " << id << " '" << v.token(id) << "' at step " << s;
        if (bit) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      ASSERT_TRUE(m.accept_token(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]));
    }
  }
}

TEST(GrammarMatcher, MaskEqualsBruteForceJsonLike) { expect_mask_equals_brute_force(kJsonLike, 3, 12, 1); }

TEST(GrammarMatcher, MaskEqualsBruteForceAmbiguousAndNullable) {
  // Several stacks at once (ambiguity), rules that match nothing, and pops across several levels at one byte.
  // The recursive alternatives keep a, b, c and d rules of their own (small rules are inlined into callers).
  const char* g = R"g(
root ::= (a | b)* "." c
a    ::= "x" "y"? e | "(" a ")"
b    ::= "x" "yz"? e | "(" b ")"
e    ::= ""
c    ::= (d d)? | "[" c "]"
d    ::= ("q" | "qq") e | "<" d ">"
)g";
  expect_mask_equals_brute_force(g, 4, 10, 2);
}

TEST(GrammarMatcher, MaskEqualsBruteForceUtf8) {
  expect_mask_equals_brute_force(R"g(root ::= item+ "!"
item ::= [α-ω] | [一-龥] | "é" [^a-z] | "(" item ")")g", 3, 8, 3);
}

TEST(GrammarMatcher, EndOfGenerationOnlyWhenComplete) {
  auto cg = compile(R"(root ::= "ab" "c"?)", test::byte_vocab());
  ASSERT_TRUE(cg);
  Matcher m(cg);
  std::vector<uint32_t> words(cg->vocab().mask_words());
  EXPECT_FALSE(m.is_complete());
  m.fill_mask(words);
  EXPECT_FALSE(mask_bit(words, 256));
  EXPECT_EQ(m.accept_token(256).message(), "grammar: end-of-generation token 256 before the grammar is complete");
  ASSERT_TRUE(m.accept_token('a'));
  ASSERT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.is_complete());
  m.fill_mask(words);
  EXPECT_TRUE(mask_bit(words, 256));
  EXPECT_TRUE(mask_bit(words, 'c'));
  EXPECT_FALSE(mask_bit(words, 'b'));
  ASSERT_TRUE(m.accept_token(256));
  EXPECT_TRUE(m.is_terminated());
  m.fill_mask(words);
  for (uint32_t w : words) EXPECT_EQ(w, 0u);
  EXPECT_EQ(m.accept_token('c').message(), "grammar: token 99 after the end of generation");
}

TEST(GrammarMatcher, RejectedTokenLeavesStateUnchanged) {
  auto cg = compile(R"(root ::= "abc")", test::byte_vocab());
  ASSERT_TRUE(cg);
  Matcher m(cg);
  ASSERT_TRUE(m.accept_token('a'));
  EXPECT_EQ(m.accept_token('x').message(), "grammar: token 120 (\"x\") does not match at byte 0");
  EXPECT_EQ(m.accept_token(999).message(), "grammar: token id 999 is outside the vocabulary (257 tokens)");
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('c'));
  EXPECT_TRUE(m.is_complete());
}

TEST(GrammarMatcher, RollbackRestoresMasksExactly) {
  auto cg = compile(kJsonLike, test::gpt2_vocab());
  ASSERT_TRUE(cg);
  const VocabIndex& v = cg->vocab();
  std::mt19937_64 rng(7);
  Matcher m(cg);
  std::vector<std::vector<uint32_t>> masks;
  std::vector<int32_t> taken;
  std::vector<uint32_t> words(v.mask_words());
  for (int s = 0; s < 40 && !m.is_complete(); ++s) {
    m.fill_mask(words);
    masks.push_back(words);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < v.size(); ++id)
      if (mask_bit(words, id) && !v.is_eog(id)) allowed.push_back(id);
    const int32_t pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    ASSERT_TRUE(m.accept_token(pick));
    taken.push_back(pick);
  }
  ASSERT_GE(taken.size(), 8u);
  // Undo in two pieces (as a speculative step rejecting drafts would), checking each mask on the way back.
  for (int k : {3, 5}) {
    ASSERT_TRUE(m.rollback(k));
    taken.resize(taken.size() - static_cast<size_t>(k));
    m.fill_mask(words);
    EXPECT_EQ(words, masks[taken.size()]) << "after rolling back to " << taken.size() << " tokens";
  }
  EXPECT_EQ(m.history_size(), static_cast<int>(taken.size()));
  EXPECT_FALSE(m.rollback(1000));
  // Replaying the same tokens gives the same masks.
  ASSERT_TRUE(m.rollback(static_cast<int>(taken.size())));
  for (size_t i = 0; i < taken.size(); ++i) {
    m.fill_mask(words);
    EXPECT_EQ(words, masks[i]);
    ASSERT_TRUE(m.accept_token(taken[i]));
  }
}

TEST(GrammarMatcher, Utf8CharacterSplitAcrossTokens) {
  // "é" is C3 A9: as two byte tokens the first leaves the matcher inside the character, where only A9 fits.
  auto cg = compile(R"(root ::= "é" [a-z])", test::byte_vocab());
  ASSERT_TRUE(cg);
  Matcher m(cg);
  std::vector<uint32_t> words(cg->vocab().mask_words());
  ASSERT_TRUE(m.accept_token(0xC3));
  m.fill_mask(words);
  for (int id = 0; id < 257; ++id) EXPECT_EQ(mask_bit(words, id), id == 0xA9) << id;
  ASSERT_TRUE(m.accept_token(0xA9));
  ASSERT_TRUE(m.accept_token('z'));
  EXPECT_TRUE(m.is_complete());
}

TEST(GrammarMatcher, MinBytesToComplete) {
  auto cg = compile(R"(root ::= "{" item* "}"
item ::= "[" "ab"{2} "]")", test::byte_vocab());
  ASSERT_TRUE(cg);
  Matcher m(cg);
  EXPECT_EQ(m.min_bytes_to_complete(), 2u);
  ASSERT_TRUE(m.accept_bytes("{[a"));
  EXPECT_EQ(m.min_bytes_to_complete(), 5u);  // "bab]}"
}

}  // namespace
}  // namespace kiln::grammar

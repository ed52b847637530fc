// Regex (guided_regex) and choice (guided_choice) grammars: the language equals std::regex's (ECMAScript) on
// random strings for patterns whose meaning is the same in both, and unsupported constructs are errors naming
// the construct and the offset.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace kiln::grammar {
namespace {

// std::regex matches bytes, so the sampling side of the comparison draws ASCII only.
std::shared_ptr<const VocabIndex> ascii_vocab() {
  Vocabulary v;
  for (int b = 0; b < 128; ++b) v.tokens.push_back(std::string(1, static_cast<char>(b)));
  v.tokens.push_back("");
  v.eog_ids = {128};
  return VocabIndex::build(std::move(v));
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& cg, const std::string& text) {
  Matcher m(cg);
  return m.accept_bytes(text).is_ok() && m.is_complete();
}

TEST(GrammarRegex, AgreesWithStdRegexOnRandomStrings) {
  const char* patterns[] = {
      "a(b|cd)*e?",       "[a-c]{2,4}x|y+",  "(ab|a)(bc|c)",  "\\d{3}-\\d{2}", "[^abc]+",      "(a|b){0,3}c{2}",
      "x*y*z*",           "((a|b)c)+",       "a.c",           "\\w+\\s\\w+",   "[a-]?[\\]b]+", "(?:ab)+(?<n>c)?",
      "a{2}b{1,}c{0,1}",  "\\.\\*\\+\\?",    "[0-9a-f]{1,3}", "(a*)*b",
  };
  const std::string alphabet = "abcdexyz012-. *+?]\\";
  std::mt19937_64 rng(11);
  for (const char* p : patterns) {
    auto gbnf = regex_to_gbnf(p);
    ASSERT_TRUE(gbnf) << p << ": " << gbnf.status().message();
    auto cg = test::compile(*gbnf, test::byte_vocab());
    ASSERT_TRUE(cg) << p;
    const std::regex re(p == std::string("(?:ab)+(?<n>c)?") ? "(?:ab)+(c)?" : p, std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const size_t len = std::uniform_int_distribution<size_t>(0, 7)(rng);
      for (size_t k = 0; k < len; ++k) s += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      ASSERT_EQ(accepts(cg, s), std::regex_match(s, re)) << "pattern " << p << " text '" << s << "'";
    }
    // The other side: strings sampled from the grammar (random bytes under the mask) all match the regex.
    auto ascii = test::compile(*gbnf, ascii_vocab());
    ASSERT_TRUE(ascii);
    for (int i = 0; i < 40; ++i) {
      const test::Sample smp = test::sample(ascii, rng, 12);
      ASSERT_TRUE(smp.error.empty()) << p << ": " << smp.error;
      ASSERT_TRUE(std::regex_match(smp.text, re)) << "pattern " << p << " sampled '" << smp.text << "'";
    }
  }
  auto cg = test::compile(*regex_to_gbnf("^(cat|dog)s?$"), test::byte_vocab());
  EXPECT_TRUE(accepts(cg, "cats"));
  EXPECT_TRUE(accepts(cg, "dog"));
  EXPECT_FALSE(accepts(cg, "^cat"));
}

TEST(GrammarRegex, UnicodeClassesAndEscapes) {
  auto cg = test::compile(*regex_to_gbnf("[α-γ]+\\u00e9\\x41\\u{1F600}"), test::byte_vocab());
  ASSERT_TRUE(cg);
  EXPECT_TRUE(accepts(cg, "αβγéA😀"));
  EXPECT_FALSE(accepts(cg, "δéA😀"));
  cg = test::compile(*regex_to_gbnf("a.b"), test::byte_vocab());
  EXPECT_TRUE(accepts(cg, "a\xE2\x82\xAC" "b"));  // '.' is one character, of any length in bytes
  EXPECT_FALSE(accepts(cg, "a\nb"));
}

TEST(GrammarRegex, ErrorsNameTheConstruct) {
  const auto err = [](const char* p) {
    auto r = regex_to_gbnf(p);
    return r ? std::string("(ok)") : r.status().message();
  };
  EXPECT_EQ(err("a(?=b)"), "regex: offset 2: lookaround, flags and other (?...) groups are not supported");
  EXPECT_EQ(err("(a)\\1"), "regex: offset 5: backreferences are not supported");
  EXPECT_EQ(err("\\bword"), "regex: offset 2: word boundaries (\\b) are not supported");
  EXPECT_EQ(err("a^b"), "regex: offset 1: the anchor '^' is supported only at the very start / end of the pattern");
  EXPECT_EQ(err("\\p{L}"), "regex: offset 2: Unicode property classes (\\p{...}) are not supported");
  EXPECT_EQ(err("(ab"), "regex: offset 3: expecting ')'");
  EXPECT_EQ(err("ab)"), "regex: offset 2: unbalanced ')'");
  EXPECT_EQ(err("[z-a]"), "regex: offset 4: character range is reversed");
  EXPECT_EQ(err("a{3,1}"), "regex: offset 6: repetition {3,1}: the maximum is below the minimum");
  EXPECT_EQ(err("*a"), "regex: offset 0: '*' must follow an item");
  EXPECT_EQ(err("a**"), "(ok)");  // a repeated repetition is still a language
  EXPECT_EQ(err("a++"), "regex: offset 2: possessive quantifiers are not supported");
  EXPECT_EQ(err("ab\\"), "regex: offset 3: pattern ends with a backslash");
}

TEST(GrammarChoice, ExactlyOneOfTheStrings) {
  auto gbnf = choice_to_gbnf({"yes", "no", "maybe \"so\"", "ünï"});
  ASSERT_TRUE(gbnf);
  auto cg = test::compile(*gbnf, test::byte_vocab());
  ASSERT_TRUE(cg);
  for (const char* ok : {"yes", "no", "maybe \"so\"", "ünï"}) EXPECT_TRUE(accepts(cg, ok)) << ok;
  for (const char* bad : {"ye", "yesno", "", "maybe"}) EXPECT_FALSE(accepts(cg, bad)) << bad;
  EXPECT_EQ(choice_to_gbnf({}).status().message(), "guided_choice: the list is empty");
  EXPECT_EQ(choice_to_gbnf({"a", ""}).status().message(), "guided_choice: choice 1 is an empty string");
}

}  // namespace
}  // namespace kiln::grammar

// GBNF parsing and the automaton: what is accepted, what is refused and with which message, and that the bytes a
// grammar matches are exactly those its text describes (checked through a matcher fed raw bytes).
#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.h"
#include "unit/grammar_test_util.h"

namespace kiln::grammar {
namespace {

using test::matches;

std::string error_of(const std::string& gbnf, const Limits& limits = {}) {
  auto g = Grammar::from_gbnf(gbnf, limits);
  return g ? std::string("(ok)") : g.status().message();
}

TEST(GrammarGbnf, LiteralsAlternationGrouping) {
  const std::string g = R"(root ::= "ab" ("c" | "de")+ end   # comment
end ::= "!" | )";
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "abdec!"));
  EXPECT_TRUE(matches(g, "abcccde"));
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_FALSE(matches(g, "abd"));
  EXPECT_FALSE(matches(g, "abc!!"));
}

TEST(GrammarGbnf, Repetitions) {
  const std::string g = R"(root ::= "a"{2} "b"{1,3} "c"{2,} "d"{,1} "e"? "f"*)";
  EXPECT_TRUE(matches(g, "aabcc"));
  EXPECT_TRUE(matches(g, "aabbbccccdeff"));
  EXPECT_FALSE(matches(g, "abcc"));
  EXPECT_FALSE(matches(g, "aabbbbcc"));
  EXPECT_FALSE(matches(g, "aabc"));
  EXPECT_FALSE(matches(g, "aabccdd"));
}

TEST(GrammarGbnf, CharacterClassesAndEscapes) {
  const std::string g = R"(root ::= [a-c0-9_] [^a-z\n] "\x41\u00e9\U0001F600" [\-\]] "\t\\\"" .)";
  EXPECT_TRUE(matches(g, "a#Aé😀-\t\\\"x"));
  EXPECT_TRUE(matches(g, "9Z" "Aé😀]\t\\\"é"));
  EXPECT_FALSE(matches(g, "dZAé😀-\t\\\"x"));
  EXPECT_FALSE(matches(g, "aqAé😀-\t\\\"x"));
  EXPECT_FALSE(matches(g, "a\nAé😀-\t\\\"x"));
}

TEST(GrammarGbnf, Utf8ClassesMatchWholeCharacters) {
  // A class over code points matches complete UTF-8 sequences only: never half a character, never a surrogate.
  const std::string g = R"(root ::= [α-ω]+ [^a])";
  EXPECT_TRUE(matches(g, "αβγ\xF0\x9F\x98\x80"));
  EXPECT_TRUE(matches(g, "ωb"));
  EXPECT_FALSE(matches(g, "\xCE"));            // half of α
  EXPECT_FALSE(matches(g, "αa"));
  EXPECT_FALSE(matches(g, "α\xED\xA0\x80"));   // an encoded surrogate
  EXPECT_FALSE(matches(g, "α\xC0\x80"));       // overlong
  EXPECT_FALSE(matches(g, "Ab"));
}

TEST(GrammarGbnf, RecursionAndRuleReferences) {
  const std::string g = R"(
root  ::= value
value ::= "[" ws (value (ws "," ws value)*)? ws "]" | [0-9]+
ws    ::= [ ]*
)";
  EXPECT_TRUE(matches(g, "[1, [2,[]], 33]"));
  EXPECT_TRUE(matches(g, "[[[[]]]]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  EXPECT_FALSE(matches(g, "[[]"));
}

TEST(GrammarGbnf, MultiLineRules) {
  const std::string g = "root ::= (\n  \"a\"\n  | \"b\"\n) tail\ntail ::= \"x\" |\n  \"y\"\r\n";
  EXPECT_TRUE(matches(g, "ax"));
  EXPECT_TRUE(matches(g, "by"));
  EXPECT_FALSE(matches(g, "a"));
}

TEST(GrammarGbnf, ErrorsNameLineColumnAndCause) {
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "grammar: line 2, column 1: rule 'root' is defined twice (first at line 1)");
  EXPECT_EQ(error_of("root ::= foo"), "grammar: line 1, column 10: undefined rule 'foo'");
  EXPECT_EQ(error_of("start ::= \"a\""), "grammar: no rule named 'root'");
  EXPECT_EQ(error_of("root ::= \"abc"), "grammar: line 1, column 14: unterminated string literal");
  EXPECT_EQ(error_of("root ::= [a-"), "grammar: line 1, column 13: unterminated character class");
  EXPECT_EQ(error_of("root ::= [z-a]"), "grammar: line 1, column 14: character range U+7A-U+61 is reversed");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= \"\\x4\""), "grammar: line 1, column 11: expecting 2 hex digits after '\\x'");
  EXPECT_EQ(error_of("root ::= \"\\uD800\""), "grammar: line 1, column 11: escape '\\u' names U+D800, which is not a Unicode character");
  EXPECT_EQ(error_of("root ::= (\"a\""), "grammar: line 1, column 14: expecting ')', found end of text");
  EXPECT_EQ(error_of("root ::= * \"a\""), "grammar: line 1, column 10: '*' must follow an item");
  EXPECT_EQ(error_of("root ::= \"a\"{3,1}"), "grammar: line 1, column 17: repetition {3,1}: the maximum is below the minimum");
  EXPECT_EQ(error_of("root ::= \"a\"{2"), "grammar: line 1, column 15: expecting ',' or '}', found end of text");
  EXPECT_EQ(error_of("root = \"a\""), "grammar: line 1, column 6: expecting '::=' after rule name 'root', found '='");
  EXPECT_EQ(error_of("root ::= \"a\" )"), "grammar: line 1, column 14: expecting end of line after the rule, found ')'");
  EXPECT_EQ(error_of("root ::= <[1000]>"), "grammar: line 1, column 10: token references ('<...>', '!<...>') are not supported");
  EXPECT_EQ(error_of("root ::= [^\\x00-\\U0010FFFF]"), "grammar: line 1, column 28: character class matches no character");
  EXPECT_EQ(error_of("root ::= \"\xff\""), "grammar: line 1, column 11: invalid UTF-8");
}

TEST(GrammarGbnf, AutomatonErrors) {
  EXPECT_EQ(error_of("root ::= root \"a\" | \"b\""),
            "grammar: rule 'root' is left-recursive (it can reach itself without matching a byte)");
  EXPECT_EQ(error_of("root ::= e x\ne ::= \"\"?\nx ::= e root | \"b\""),
            "grammar: rule 'root' is left-recursive (it can reach itself without matching a byte)");
  EXPECT_EQ(error_of("root ::= \"a\" | \"b\" x\nx ::= \"c\" x"),
            "grammar: line 2: rule 'x' can never finish (every alternative refers back to it)");
}

TEST(GrammarGbnf, LimitsBoundHostileInput) {
  Limits l;
  l.max_nesting = 20;
  EXPECT_EQ(error_of("root ::= " + std::string(21, '(') + "\"a\"" + std::string(21, ')'), l),
            "grammar: line 1, column 30: parentheses nested deeper than 20");
  EXPECT_EQ(error_of("root ::= \"a\"{10001}"),
            "grammar: line 1, column 18: repetition count is more than the limit of 10000");
  l = Limits{};
  l.max_nfa_states = 5000;
  EXPECT_EQ(error_of("root ::= (\"ab\"{100}){100}", l),
            "grammar: rule 'root' (line 1): more than 5000 automaton states after expanding repetitions and "
            "character classes");
  l = Limits{};
  l.max_rules = 3;
  EXPECT_EQ(error_of("root ::= a b c\na ::= \"a\"\nb ::= \"b\"\nc ::= \"c\"", l),
            "grammar: line 1, column 14: more than 3 rules");
  l = Limits{};
  l.max_dfa_work = 100'000;
  EXPECT_EQ(error_of("root ::= ((\"a\"{0,20}){0,20})", l),
            "grammar: rule 'root' (line 1): more than 100000 steps to build the automaton (nested repetitions?)");
  l = Limits{};
  l.max_mask_work = 1000;
  auto g = Grammar::from_gbnf("root ::= [a-z]{0,50}", l);
  ASSERT_TRUE(g);
  auto cg = CompiledGrammar::compile(*g, test::gpt2_vocab());
  ASSERT_FALSE(cg);
  EXPECT_NE(cg.status().message().find("would visit more than 1000 vocabulary trie nodes"), std::string::npos)
      << cg.status().message();
  // A nested repetition that llama.cpp expands into millions of rules stops at the state budget, quickly.
  EXPECT_NE(error_of("root ::= ((\"a\"{0,1000}){0,1000}){0,1000}").find("automaton states"), std::string::npos);
}

TEST(GrammarGbnf, UnreachableRulesAreIgnoredButChecked) {
  auto g = Grammar::from_gbnf("root ::= \"a\"\nunused ::= \"b\" | \"c\"");
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ((*g)->num_rules(), 1u);
  EXPECT_EQ(error_of("root ::= \"a\"\nunused ::= missing"), "grammar: line 2, column 12: undefined rule 'missing'");
}

}  // namespace
}  // namespace kiln::grammar

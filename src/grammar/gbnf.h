// GBNF (llama.cpp's grammar text) -> an abstract syntax tree of rules over Unicode code points.
// The syntax accepted is llama.cpp's: `name ::= alternatives` (one rule per line; newlines continue a rule only
// after `|` or inside parentheses), sequences, `|`, `( )`, `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`, string
// literals and character classes with `\n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH` escapes, `[^...]`, `.`,
// `#` comments. Rule names are [A-Za-z0-9_-]+ ('_' is an addition). A rule named `root` is required. Token
// references (`<...>`, `!<...>`) are refused. Errors name the line and column (1-based, columns in bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/limits.h"
#include "util/status.h"

namespace kiln::grammar {

struct CodeRange {
  uint32_t lo, hi;  // inclusive code points
};

inline constexpr uint32_t kUnbounded = UINT32_MAX;

struct AstNode {
  enum class Kind : uint8_t { kEmpty, kChars, kRef, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  std::vector<CodeRange> ranges;  // kChars: sorted, disjoint, non-adjacent; never empty
  uint32_t rule = 0;              // kRef: index into Ast::rules
  uint32_t min = 0, max = 0;      // kRepeat: max == kUnbounded for `*` / `+` / `{m,}`
  std::vector<AstNode> kids;      // kSeq, kAlt: the items; kRepeat: exactly one
};

struct AstRule {
  std::string name;
  AstNode body;
  int line = 0, column = 0;  // where the definition starts (0: referenced, never defined)
};

struct Ast {
  std::vector<AstRule> rules;
  uint32_t root = 0;
};

Result<Ast> parse_gbnf(std::string_view text, const Limits& limits);

// The code point ranges of a class after negation: the complement over U+0000..U+10FFFF without the surrogates.
std::vector<CodeRange> negate_ranges(std::vector<CodeRange> ranges);
// Sorts and merges overlapping or adjacent ranges.
std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> ranges);

}  // namespace kiln::grammar

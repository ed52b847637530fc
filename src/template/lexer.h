// Template lexer: jinja2's lexer (jinja2/lexer.py) with transformers' settings: trim_blocks=True (one "\n"
// after a block or comment tag is dropped), lstrip_blocks=True (spaces/tabs from the start of a line up to a
// block or comment tag are dropped), keep_trailing_newline=False, newlines normalized to "\n".
// Whitespace control: "{%-" / "-%}" strip all whitespace on that side, "{%+" / "+%}" turn lstrip / trim off
// for that tag. Block and variable ends are only recognized while (), [] and {} are balanced, as in jinja2, so
// `{{ {'a': {'b': 1}} }}` lexes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace kiln::tpl {

enum class Tok : uint8_t {
  kData,        // literal text (whitespace control already applied)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text = the unescaped value
  kInt,         // text = digits (underscores removed)
  kFloat,
  kOp,          // text = the operator ("+", "//", "==", "(", ...)
  kEof,
};

struct Token {
  Tok type;
  std::string text;
  int line = 1, col = 1;
};

// Tokenizes a whole template; the error names the line and column ("line 3, column 7: unexpected char '$'").
Result<std::vector<Token>> lex(const std::string& source);

}  // namespace kiln::tpl

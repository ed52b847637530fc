// Regular expressions as grammar pieces (internal to the grammar layer; the public entry is regex_to_gbnf in
// grammar.h). The JSON-schema compiler uses these for `pattern` and the string formats.
#pragma once

#include <string>
#include <string_view>

#include "grammar/gbnf.h"
#include "grammar/limits.h"
#include "util/status.h"

namespace kiln::grammar {

// What `.` excludes: Python's re (\n) or JavaScript's (\n \r U+2028 U+2029, as ajv's RegExp does).
enum class RegexDialect { kPython, kJavaScript };

struct RegexAst {
  AstNode body;  // kChars / kSeq / kAlt / kRepeat / kEmpty only
  bool anchored_start = false, anchored_end = false;
};

Result<RegexAst> parse_regex(std::string_view pattern, RegexDialect dialect, const Limits& limits);

// A GBNF expression for the regex. json = true: the characters are written as a JSON string holds them ('"',
// '\' and control characters as their escapes), for use between the quotes of a JSON string.
std::string regex_ast_to_gbnf(const AstNode& n, bool json);

}  // namespace kiln::grammar

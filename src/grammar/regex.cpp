// Regular expressions -> GBNF (vLLM's guided_regex, JSON-schema `pattern`), and guided_choice.
//
// The subset: literals, `.`, classes with ranges and negation, `\d \D \w \W \s \S`, escapes (`\n \r \t \f \v \0
// \xHH \uHHHH \u{H..}` and escaped punctuation), groups `(...)` `(?:...)` `(?<name>...)` `(?P<name>...)`,
// alternation, `* + ? {m} {m,} {m,n}` (lazy forms match the same strings), `^` at the very start and `$` at the
// very end. Everything else (lookaround, backreferences, `\b`, `\p{...}`, flags, anchors elsewhere) is an error
// naming the construct and its offset. The classes are chosen so that every string produced matches under both
// JavaScript (ajv) and Python (`re`) semantics: `\s` is ASCII whitespace, `\w` and `\d` are ASCII, `\D` and `\W`
// ASCII non-digits / non-word characters, `\S` any character that is whitespace in neither.
#include "grammar/regex.h"

#include <algorithm>

#include "grammar/utf8.h"

namespace kiln::grammar {

namespace {

using Ranges = std::vector<CodeRange>;

Ranges ascii_space() { return {{'\t', '\r'}, {' ', ' '}}; }
Ranges ascii_word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
Ranges any_space() {
  return normalize_ranges({{'\t', '\r'}, {0x1C, 0x20}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                           {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
}
Ranges ascii_minus(Ranges r) {
  Ranges n = negate_ranges(std::move(r));
  Ranges out;
  for (const CodeRange& c : n)
    if (c.lo <= 0x7F) out.push_back({c.lo, std::min<uint32_t>(c.hi, 0x7F)});
  return out;
}

AstNode chars(Ranges r) {
  AstNode n;
  n.kind = AstNode::Kind::kChars;
  n.ranges = normalize_ranges(std::move(r));
  return n;
}

class RegexParser {
 public:
  RegexParser(std::string_view s, const Limits& limits, RegexDialect dialect)
      : s_(s), limits_(limits), dialect_(dialect) {}

  Result<AstNode> run(bool* anchored_start, bool* anchored_end) {
    if (s_.size() > limits_.max_text_bytes)
      return make_error(ErrorCode::kInvalidArgument, "regex: %zu bytes is more than the limit of %zu", s_.size(),
                        limits_.max_text_bytes);
    *anchored_start = !s_.empty() && s_[0] == '^';
    if (*anchored_start) pos_ = 1;
    end_ = s_.size();
    *anchored_end = end_ > pos_ && s_[end_ - 1] == '$' && !escaped_at(end_ - 1);
    if (*anchored_end) --end_;
    AstNode n = alternation(0);
    if (ok_ && pos_ < end_) fail(s_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    if (!ok_) return status_;
    return n;
  }

 private:
  bool escaped_at(size_t i) const {
    size_t k = 0;
    while (i > k && s_[i - 1 - k] == '\\') ++k;
    return k % 2 == 1;
  }
  bool at_end() const { return pos_ >= end_; }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void fail(const std::string& what) {
    if (!ok_) return;
    ok_ = false;
    status_ = Status(ErrorCode::kInvalidArgument, strprintf("regex: offset %zu: %s", pos_, what.c_str()));
  }

  AstNode alternation(int depth) {
    AstNode alt;
    alt.kind = AstNode::Kind::kAlt;
    alt.kids.push_back(sequence(depth));
    while (ok_ && peek() == '|') {
      ++pos_;
      alt.kids.push_back(sequence(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : std::move(alt);
  }

  AstNode sequence(int depth) {
    AstNode seq;
    seq.kind = AstNode::Kind::kSeq;
    while (ok_ && !at_end() && peek() != '|' && peek() != ')') {
      AstNode a = atom(depth);
      if (!ok_) break;
      quantifiers(&a);
      seq.kids.push_back(std::move(a));
    }
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    if (seq.kids.empty()) return AstNode{};
    return seq;
  }

  bool number(uint32_t* v) {
    if (!(peek() >= '0' && peek() <= '9')) return false;
    uint64_t x = 0;
    while (peek() >= '0' && peek() <= '9') {
      x = x * 10 + static_cast<uint64_t>(peek() - '0');
      if (x > limits_.max_repeat) {
        fail(strprintf("repetition count is more than the limit of %u", limits_.max_repeat));
        return false;
      }
      ++pos_;
    }
    *v = static_cast<uint32_t>(x);
    return true;
  }

  void quantifiers(AstNode* a) {
    for (;;) {
      uint32_t min, max;
      const size_t save = pos_;
      const char c = peek();
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        min = c == '+' ? 1 : 0;
        max = c == '?' ? 1 : kUnbounded;
      } else if (c == '{') {
        ++pos_;
        if (!number(&min)) {
          if (!ok_) return;
          pos_ = save;  // not a quantifier: a literal '{' (as JavaScript reads it)
          return;
        }
        max = min;
        if (peek() == ',') {
          ++pos_;
          max = kUnbounded;
          if (peek() != '}' && !number(&max)) {
            if (ok_) fail("expecting a number or '}' in a repetition");
            return;
          }
        }
        if (peek() != '}') {
          fail("expecting '}' to close the repetition");
          return;
        }
        ++pos_;
        if (max < min) {
          fail(strprintf("repetition {%u,%u}: the maximum is below the minimum", min, max));
          return;
        }
      } else {
        return;
      }
      if (peek() == '?') ++pos_;  // lazy: the same strings
      if (peek() == '+') {
        fail("possessive quantifiers are not supported");
        return;
      }
      AstNode r;
      r.kind = AstNode::Kind::kRepeat;
      r.min = min;
      r.max = max;
      r.kids.push_back(std::move(*a));
      *a = std::move(r);
    }
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      else if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) {
        fail(strprintf("expecting %d hex digits", digits));
        return 0;
      }
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: a class escape (ranges) or one code point. Returns false on error.
  bool escape(Ranges* out, bool in_class) {
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'd': *out = {{'0', '9'}}; return true;
      case 'D': *out = ascii_minus({{'0', '9'}}); return true;
      case 'w': *out = ascii_word(); return true;
      case 'W': *out = ascii_minus(ascii_word()); return true;
      case 's': *out = ascii_space(); return true;
      case 'S': *out = negate_ranges(any_space()); return true;
      case 'n': *out = {{'\n', '\n'}}; return true;
      case 'r': *out = {{'\r', '\r'}}; return true;
      case 't': *out = {{'\t', '\t'}}; return true;
      case 'f': *out = {{'\f', '\f'}}; return true;
      case 'v': *out = {{'\v', '\v'}}; return true;
      case '0': *out = {{0, 0}}; return true;
      case 'x': {
        const uint32_t v = hex(2);
        *out = {{v, v}};
        return ok_;
      }
      case 'u': {
        uint32_t v;
        if (peek() == '{') {
          ++pos_;
          v = 0;
          int n = 0;
          while (ok_ && peek() != '}' && n < 7) v = v * 16 + hex(1), ++n;
          if (peek() != '}' || n == 0) {
            fail("expecting '}' after \\u{ and hex digits");
            return false;
          }
          ++pos_;
        } else {
          v = hex(4);
        }
        if (!ok_) return false;
        if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
          fail(strprintf("\\u escape names U+%X, which is not a Unicode character", v));
          return false;
        }
        *out = {{v, v}};
        return true;
      }
      case 'b':
        if (in_class) {
          *out = {{'\b', '\b'}};
          return true;
        }
        fail("word boundaries (\\b) are not supported");
        return false;
      case 'B': fail("\\B is not supported"); return false;
      case 'p': case 'P': fail("Unicode property classes (\\p{...}) are not supported"); return false;
      case 'k': fail("named backreferences are not supported"); return false;
      case '\0':
        if (pos_ > end_) {
          --pos_;
          fail("pattern ends with a backslash");
          return false;
        }
        *out = {{0, 0}};
        return true;
      default:
        if (c >= '1' && c <= '9') {
          fail("backreferences are not supported");
          return false;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          fail(strprintf("unknown escape '\\%c'", c));
          return false;
        }
        --pos_;
        return literal(out);
    }
  }

  bool literal(Ranges* out) {
    uint32_t cp;
    const size_t n = decode_utf8(s_.substr(pos_, end_ - pos_), &cp);
    if (n == 0) {
      fail("invalid UTF-8");
      return false;
    }
    pos_ += n;
    *out = {{cp, cp}};
    return true;
  }

  AstNode char_class() {
    ++pos_;  // [
    const bool negate = peek() == '^';
    if (negate) ++pos_;
    Ranges all;
    bool first = true;
    while (ok_ && (peek() != ']' || first)) {
      first = false;
      if (at_end()) {
        fail("unterminated character class");
        return {};
      }
      Ranges lo;
      if (peek() == '\\') {
        ++pos_;
        if (!escape(&lo, true)) return {};
      } else if (!literal(&lo)) {
        return {};
      }
      if (peek() == '-' && pos_ + 1 < end_ && s_[pos_ + 1] != ']' && lo.size() == 1 && lo[0].lo == lo[0].hi) {
        ++pos_;
        Ranges hi;
        if (peek() == '\\') {
          ++pos_;
          if (!escape(&hi, true)) return {};
        } else if (!literal(&hi)) {
          return {};
        }
        if (hi.size() != 1 || hi[0].lo != hi[0].hi) {
          fail("a class escape cannot end a range");
          return {};
        }
        if (hi[0].lo < lo[0].lo) {
          fail("character range is reversed");
          return {};
        }
        lo[0].hi = hi[0].lo;
      }
      all.insert(all.end(), lo.begin(), lo.end());
    }
    ++pos_;  // ]
    Ranges r = negate ? negate_ranges(std::move(all)) : normalize_ranges(std::move(all));
    // Surrogates are not characters.
    Ranges clean;
    for (const CodeRange& c : r) {
      if (c.hi < 0xD800 || c.lo > 0xDFFF) {
        clean.push_back(c);
        continue;
      }
      if (c.lo < 0xD800) clean.push_back({c.lo, 0xD7FF});
      if (c.hi > 0xDFFF) clean.push_back({0xE000, c.hi});
    }
    if (clean.empty()) {
      fail("character class matches no character");
      return {};
    }
    return chars(std::move(clean));
  }

  AstNode atom(int depth) {
    const char c = peek();
    if (c == '(') {
      if (depth + 1 > limits_.max_nesting) {
        fail(strprintf("groups nested deeper than %d", limits_.max_nesting));
        return {};
      }
      ++pos_;
      if (peek() == '?') {
        const std::string_view rest = s_.substr(pos_, end_ - pos_);
        if (rest.starts_with("?:")) {
          pos_ += 2;
        } else if (rest.starts_with("?<") && !rest.starts_with("?<=") && !rest.starts_with("?<!")) {
          const size_t close = rest.find('>');
          if (close == std::string_view::npos) {
            fail("unterminated group name");
            return {};
          }
          pos_ += close + 1;
        } else if (rest.starts_with("?P<")) {
          const size_t close = rest.find('>');
          if (close == std::string_view::npos) {
            fail("unterminated group name");
            return {};
          }
          pos_ += close + 1;
        } else {
          fail("lookaround, flags and other (?...) groups are not supported");
          return {};
        }
      }
      AstNode inner = alternation(depth + 1);
      if (!ok_) return {};
      if (peek() != ')') {
        fail("expecting ')'");
        return {};
      }
      ++pos_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      Ranges excluded = {{'\n', '\n'}};
      if (dialect_ == RegexDialect::kJavaScript) excluded = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
      return chars(negate_ranges(excluded));
    }
    if (c == '^' || c == '$') {
      fail(strprintf("the anchor '%c' is supported only at the very start / end of the pattern", c));
      return {};
    }
    if (c == '*' || c == '+' || c == '?') {
      fail(strprintf("'%c' must follow an item", c));
      return {};
    }
    Ranges r;
    if (c == '\\') {
      ++pos_;
      if (at_end()) {
        fail("pattern ends with a backslash");
        return {};
      }
      if (!escape(&r, false)) return {};
    } else if (!literal(&r)) {
      return {};
    }
    return chars(std::move(r));
  }

  std::string_view s_;
  const Limits& limits_;
  RegexDialect dialect_;
  size_t pos_ = 0, end_ = 0;
  bool ok_ = true;
  Status status_;
};

void append_code_point_literal(uint32_t cp, std::string* out) {
  // Inside a GBNF "..." literal or [...] class.
  switch (cp) {
    case '"': *out += "\\\""; return;
    case '\\': *out += "\\\\"; return;
    case '[': *out += "\\["; return;
    case ']': *out += "\\]"; return;
    case '-': *out += "\\-"; return;
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    default: break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    *out += strprintf("\\x%02X", cp);
  } else {
    append_utf8(cp, out);
  }
}

std::string class_text(const Ranges& r) {
  if (r.size() == 1 && r[0].lo == r[0].hi) {
    std::string s = "\"";
    append_code_point_literal(r[0].lo, &s);
    return s + "\"";
  }
  std::string s = "[";
  for (const CodeRange& c : r) {
    if (s.size() == 1 && c.lo == '^') {
      s += "\\x5E";  // a leading '^' would negate the class
    } else {
      append_code_point_literal(c.lo, &s);
    }
    if (c.hi != c.lo) {
      s += "-";
      append_code_point_literal(c.hi, &s);
    }
  }
  return s + "]";
}

// Characters a JSON string holds as themselves: not '"', not '\', no control character, not DEL.
bool json_safe(uint32_t cp) { return cp >= 0x20 && cp != '"' && cp != '\\' && cp != 0x7F; }

std::string json_escape_literal(uint32_t cp) {
  // The GBNF literal for the JSON escape sequence of a character a JSON string cannot hold as itself.
  switch (cp) {
    case '"': return "\"\\\\\\\"\"";
    case '\\': return "\"\\\\\\\\\"";
    case '\n': return "\"\\\\n\"";
    case '\r': return "\"\\\\r\"";
    case '\t': return "\"\\\\t\"";
    case '\b': return "\"\\\\b\"";
    case '\f': return "\"\\\\f\"";
    default: return strprintf("\"\\\\u%04x\"", cp);
  }
}

std::string chars_text(const Ranges& r, bool json) {
  if (!json) return class_text(r);
  Ranges safe;
  std::vector<std::string> escaped;
  for (const CodeRange& c : r) {
    // Split off the unsafe characters (all below 0x80), which are few.
    uint32_t lo = c.lo;
    while (lo <= c.hi && lo < 0x80) {
      if (json_safe(lo)) {
        uint32_t hi = lo;
        while (hi + 1 <= c.hi && hi + 1 < 0x80 && json_safe(hi + 1)) ++hi;
        safe.push_back({lo, hi});
        lo = hi + 1;
      } else {
        escaped.push_back(json_escape_literal(lo));
        ++lo;
      }
    }
    if (lo <= c.hi) safe.push_back({lo, c.hi});
  }
  std::string out;
  if (!safe.empty()) out = class_text(normalize_ranges(std::move(safe)));
  for (const std::string& e : escaped) out += (out.empty() ? "" : " | ") + e;
  return escaped.empty() ? out : "(" + out + ")";
}

}  // namespace

std::string regex_ast_to_gbnf(const AstNode& n, bool json) {
  switch (n.kind) {
    case AstNode::Kind::kEmpty:
      return "\"\"";
    case AstNode::Kind::kChars:
      return chars_text(n.ranges, json);
    case AstNode::Kind::kRef:
      return "\"\"";  // never produced by the regex parser
    case AstNode::Kind::kSeq: {
      std::string s = "(";
      for (size_t i = 0; i < n.kids.size(); ++i) s += (i ? " " : "") + regex_ast_to_gbnf(n.kids[i], json);
      return s + ")";
    }
    case AstNode::Kind::kAlt: {
      std::string s = "(";
      for (size_t i = 0; i < n.kids.size(); ++i) s += (i ? " | " : "") + regex_ast_to_gbnf(n.kids[i], json);
      return s + ")";
    }
    case AstNode::Kind::kRepeat: {
      std::string q;
      if (n.min == 0 && n.max == kUnbounded) q = "*";
      else if (n.min == 1 && n.max == kUnbounded) q = "+";
      else if (n.min == 0 && n.max == 1) q = "?";
      else if (n.max == kUnbounded) q = "{" + std::to_string(n.min) + ",}";
      else if (n.min == n.max) q = "{" + std::to_string(n.min) + "}";
      else q = "{" + std::to_string(n.min) + "," + std::to_string(n.max) + "}";
      return "(" + regex_ast_to_gbnf(n.kids[0], json) + ")" + q;
    }
  }
  return "\"\"";
}

Result<RegexAst> parse_regex(std::string_view pattern, RegexDialect dialect, const Limits& limits) {
  RegexAst r;
  KILN_ASSIGN_OR_RETURN(r.body, RegexParser(pattern, limits, dialect).run(&r.anchored_start, &r.anchored_end));
  return r;
}

Result<std::string> regex_to_gbnf(std::string_view pattern, const Limits& limits) {
  // guided_regex: the whole output matches (Python's re.fullmatch); anchors are allowed and change nothing.
  KILN_ASSIGN_OR_RETURN(RegexAst r, parse_regex(pattern, RegexDialect::kPython, limits));
  return "root ::= " + regex_ast_to_gbnf(r.body, false) + "\n";
}

Result<std::string> choice_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error(ErrorCode::kInvalidArgument, "guided_choice: the list is empty");
  std::string out = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty())
      return make_error(ErrorCode::kInvalidArgument, "guided_choice: choice %zu is an empty string", i);
    std::string lit = "\"";
    for (size_t k = 0; k < choices[i].size();) {
      uint32_t cp;
      const size_t n = decode_utf8(std::string_view(choices[i]).substr(k), &cp);
      if (n == 0)
        return make_error(ErrorCode::kInvalidArgument, "guided_choice: choice %zu is not valid UTF-8", i);
      append_code_point_literal(cp, &lit);
      k += n;
    }
    out += (i ? " | " : "") + lit + "\"";
  }
  return out + "\n";
}

}  // namespace kiln::grammar

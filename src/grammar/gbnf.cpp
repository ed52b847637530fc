// GBNF parser: recursive descent over the text with an explicit position; every error carries line and column.
// Recursion depth is bounded by Limits::max_nesting (parentheses), so hostile text cannot exhaust the stack.
#include "grammar/gbnf.h"

#include <algorithm>
#include <unordered_map>

#include "grammar/utf8.h"

namespace kiln::grammar {

std::vector<CodeRange> normalize_ranges(std::vector<CodeRange> r) {
  std::sort(r.begin(), r.end(), [](const CodeRange& a, const CodeRange& b) { return a.lo < b.lo; });
  std::vector<CodeRange> out;
  for (const CodeRange& c : r) {
    if (!out.empty() && c.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, c.hi);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<CodeRange> negate_ranges(std::vector<CodeRange> ranges) {
  // Surrogates are not characters: they can never be matched (UTF-8 cannot encode them).
  ranges.push_back({0xD800, 0xDFFF});
  ranges = normalize_ranges(std::move(ranges));
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const CodeRange& c : ranges) {
    if (c.lo > next) out.push_back({next, c.lo - 1});
    next = c.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

namespace {

bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class Parser {
 public:
  Parser(std::string_view text, const Limits& limits) : s_(text), limits_(limits) {}

  Result<Ast> run() {
    if (s_.size() > limits_.max_text_bytes)
      return make_error(ErrorCode::kInvalidArgument, "grammar: %zu bytes is more than the limit of %zu", s_.size(),
                        limits_.max_text_bytes);
    skip_space(true);
    while (ok_ && pos_ < s_.size()) parse_rule();
    if (!ok_) return status_;
    for (size_t i = 0; i < ast_.rules.size(); ++i) {
      if (ast_.rules[i].line == 0) {
        const Ref& r = first_ref_[i];
        return make_error(ErrorCode::kInvalidArgument, "grammar: line %d, column %d: undefined rule '%s'", r.line,
                          r.column, ast_.rules[i].name.c_str());
      }
    }
    auto it = ids_.find("root");
    if (it == ids_.end()) return make_error(ErrorCode::kInvalidArgument, "grammar: no rule named 'root'");
    ast_.root = it->second;
    return std::move(ast_);
  }

 private:
  struct Ref {
    int line, column;
  };

  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  bool at_end() const { return pos_ >= s_.size(); }

  void where(int* line, int* col) const {
    // Lines are counted on demand: errors are rare, so the parser does not track them per byte.
    int l = 1, c = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++l;
        c = 1;
      } else {
        ++c;
      }
    }
    *line = l;
    *col = c;
  }

  void fail(const std::string& what) { fail_at(pos_, what); }

  void fail_at(size_t at, const std::string& what) {
    if (!ok_) return;
    const size_t here = pos_;
    pos_ = at;
    int l, c;
    where(&l, &c);
    pos_ = here;
    ok_ = false;
    status_ = Status(ErrorCode::kInvalidArgument, strprintf("grammar: line %d, column %d: %s", l, c, what.c_str()));
  }

  std::string describe_here() const {
    if (at_end()) return "end of text";
    const char c = peek();
    if (c == '\n') return "end of line";
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return strprintf("byte 0x%02X", static_cast<unsigned char>(c));
    return strprintf("'%c'", c);
  }

  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\r' && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  // The rule's index; `at` is where the name starts (for the errors about it).
  uint32_t rule_id(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    if (ast_.rules.size() >= limits_.max_rules) {
      fail_at(at, strprintf("more than %u rules", limits_.max_rules));
      return 0;
    }
    const uint32_t id = static_cast<uint32_t>(ast_.rules.size());
    ast_.rules.push_back(AstRule{name, {}, 0, 0});
    ids_.emplace(name, id);
    const size_t here = pos_;
    pos_ = at;
    int l, c;
    where(&l, &c);
    pos_ = here;
    first_ref_.push_back({l, c});
    return id;
  }

  std::string parse_name() {
    const size_t b = pos_;
    while (!at_end() && is_word(peek())) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }

  void parse_rule() {
    int line, col;
    where(&line, &col);
    const size_t at = pos_;
    const std::string name = parse_name();
    if (name.empty()) return fail("expecting a rule name, found " + describe_here());
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") return fail("expecting '::=' after rule name '" + name + "', found " + describe_here());
    pos_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, at);
    if (!ok_) return;
    if (ast_.rules[id].line != 0)
      return fail_at(at, strprintf("rule '%s' is defined twice (first at line %d)", name.c_str(), ast_.rules[id].line));
    ast_.rules[id].line = line;
    ast_.rules[id].column = col;
    AstNode body = parse_alternates(false, 0);
    if (!ok_) return;
    ast_.rules[id].body = std::move(body);
    if (peek() == '\r') ++pos_;
    if (peek() == '\n') {
      ++pos_;
    } else if (!at_end()) {
      return fail("expecting end of line after the rule, found " + describe_here());
    }
    skip_space(true);
  }

  AstNode parse_alternates(bool nested, int depth) {
    AstNode alt;
    alt.kind = AstNode::Kind::kAlt;
    alt.kids.push_back(parse_sequence(nested, depth));
    while (ok_ && peek() == '|') {
      ++pos_;
      skip_space(true);
      alt.kids.push_back(parse_sequence(nested, depth));
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  // One code point of a literal or class: an escape or one UTF-8 encoded character.
  bool parse_char(uint32_t* cp) {
    if (at_end()) {
      fail("unexpected end of text");
      return false;
    }
    if (peek() == '\\') {
      const char e = peek(1);
      int hex = 0;
      switch (e) {
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        case 't': *cp = '\t'; pos_ += 2; return true;
        case 'r': *cp = '\r'; pos_ += 2; return true;
        case 'n': *cp = '\n'; pos_ += 2; return true;
        case '\\': case '"': case '[': case ']': case '-':
          *cp = static_cast<unsigned char>(e);
          pos_ += 2;
          return true;
        default:
          fail(at_end() || pos_ + 1 >= s_.size() ? "unexpected end of text after '\\'"
                                                 : strprintf("unknown escape '\\%c'", e));
          return false;
      }
      uint32_t v = 0;
      for (int i = 0; i < hex; ++i) {
        const char h = peek(2 + i);
        int d = -1;
        if (h >= '0' && h <= '9') d = h - '0';
        else if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
        if (d < 0) {
          fail(strprintf("expecting %d hex digits after '\\%c'", hex, e));
          return false;
        }
        v = v * 16 + static_cast<uint32_t>(d);
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
        fail(strprintf("escape '\\%c' names U+%X, which is not a Unicode character", e, v));
        return false;
      }
      pos_ += 2 + hex;
      *cp = v;
      return true;
    }
    const size_t n = decode_utf8(s_.substr(pos_), cp);
    if (n == 0) {
      fail("invalid UTF-8");
      return false;
    }
    pos_ += n;
    return true;
  }

  AstNode parse_literal() {
    ++pos_;  // "
    AstNode seq;
    seq.kind = AstNode::Kind::kSeq;
    while (ok_ && peek() != '"') {
      if (at_end()) {
        fail("unterminated string literal");
        break;
      }
      uint32_t cp;
      if (!parse_char(&cp)) break;
      AstNode ch;
      ch.kind = AstNode::Kind::kChars;
      ch.ranges.push_back({cp, cp});
      seq.kids.push_back(std::move(ch));
    }
    ++pos_;  // closing "
    if (seq.kids.empty()) return AstNode{};  // "" is the empty string
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    return seq;
  }

  AstNode parse_class() {
    ++pos_;  // [
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<CodeRange> ranges;
    while (ok_ && peek() != ']') {
      if (at_end()) {
        fail("unterminated character class");
        break;
      }
      uint32_t lo;
      if (!parse_char(&lo)) break;
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        if (!parse_char(&hi)) break;
        if (hi < lo) {
          fail(strprintf("character range U+%X-U+%X is reversed", lo, hi));
          break;
        }
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;  // ]
    AstNode n;
    if (!ok_) return n;
    // Surrogates are never matched: drop them from explicit ranges as negation does.
    std::vector<CodeRange> clean;
    for (const CodeRange& r : normalize_ranges(std::move(ranges))) {
      if (r.hi < 0xD800 || r.lo > 0xDFFF) {
        clean.push_back(r);
        continue;
      }
      if (r.lo < 0xD800) clean.push_back({r.lo, 0xD7FF});
      if (r.hi > 0xDFFF) clean.push_back({0xE000, r.hi});
    }
    n.kind = AstNode::Kind::kChars;
    n.ranges = negate ? negate_ranges(std::move(clean)) : std::move(clean);
    if (n.ranges.empty()) fail("character class matches no character");
    return n;
  }

  bool parse_uint(uint32_t* v) {
    if (!(peek() >= '0' && peek() <= '9')) {
      fail("expecting a number, found " + describe_here());
      return false;
    }
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

  // `{m}`, `{m,}`, `{m,n}`, `{,n}` after the item.
  bool parse_braces(uint32_t* min, uint32_t* max, bool nested) {
    ++pos_;  // {
    skip_space(nested);
    *min = 0;
    if (peek() != ',' && !parse_uint(min)) return false;
    skip_space(nested);
    if (peek() == '}') {
      *max = *min;
    } else if (peek() == ',') {
      ++pos_;
      skip_space(nested);
      *max = kUnbounded;
      if (peek() != '}' && !parse_uint(max)) return false;
      skip_space(nested);
      if (peek() != '}') {
        fail("expecting '}', found " + describe_here());
        return false;
      }
      if (*max < *min) {
        fail(strprintf("repetition {%u,%u}: the maximum is below the minimum", *min, *max));
        return false;
      }
    } else {
      fail("expecting ',' or '}', found " + describe_here());
      return false;
    }
    ++pos_;  // }
    return true;
  }

  AstNode parse_sequence(bool nested, int depth) {
    AstNode seq;
    seq.kind = AstNode::Kind::kSeq;
    while (ok_ && !at_end()) {
      const char c = peek();
      if (c == '"') {
        seq.kids.push_back(parse_literal());
      } else if (c == '[') {
        seq.kids.push_back(parse_class());
      } else if (is_word(c)) {
        const size_t at = pos_;
        const std::string name = parse_name();
        AstNode r;
        r.kind = AstNode::Kind::kRef;
        r.rule = rule_id(name, at);
        seq.kids.push_back(std::move(r));
      } else if (c == '(') {
        if (depth + 1 > limits_.max_nesting) {
          fail(strprintf("parentheses nested deeper than %d", limits_.max_nesting));
          break;
        }
        ++pos_;
        skip_space(true);
        AstNode inner = parse_alternates(true, depth + 1);
        if (!ok_) break;
        if (peek() != ')') {
          fail("expecting ')', found " + describe_here());
          break;
        }
        ++pos_;
        seq.kids.push_back(std::move(inner));
      } else if (c == '.') {
        ++pos_;
        AstNode any;
        any.kind = AstNode::Kind::kChars;
        any.ranges = negate_ranges({});
        seq.kids.push_back(std::move(any));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (seq.kids.empty()) {
          fail(strprintf("'%c' must follow an item", c));
          break;
        }
        uint32_t min = 0, max = kUnbounded;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          if (!parse_braces(&min, &max, nested)) break;
        } else {
          ++pos_;
        }
        AstNode rep;
        rep.kind = AstNode::Kind::kRepeat;
        rep.min = min;
        rep.max = max;
        rep.kids.push_back(std::move(seq.kids.back()));
        seq.kids.back() = std::move(rep);
      } else if (c == '<' || c == '!') {
        fail("token references ('<...>', '!<...>') are not supported");
        break;
      } else {
        break;
      }
      skip_space(nested);
    }
    if (seq.kids.size() == 1) return std::move(seq.kids[0]);
    if (seq.kids.empty()) return AstNode{};
    return seq;
  }

  std::string_view s_;
  const Limits& limits_;
  size_t pos_ = 0;
  bool ok_ = true;
  Status status_;
  Ast ast_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<Ref> first_ref_;
};

}  // namespace

Result<Ast> parse_gbnf(std::string_view text, const Limits& limits) { return Parser(text, limits).run(); }

}  // namespace kiln::grammar

// See lexer.h. The structure follows jinja2/lexer.py's tokeniter so whitespace handling matches it exactly:
// "root" state scans for the earliest "{{", "{%", "{#" (or a raw block), applies the strip sign or lstrip to the
// text before it; tag states produce tokens until the (balanced) end tag.
#include "template/lexer.h"

#include <cstring>

#include "template/value.h"

namespace kiln::tpl {

namespace {

struct Lexer {
  std::string src;  // newline-normalized source
  std::vector<size_t> line_starts;
  std::vector<Token> out;

  void pos_of(size_t off, int* line, int* col) const {
    size_t lo = 0, hi = line_starts.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (line_starts[mid] <= off) lo = mid;
      else hi = mid;
    }
    *line = static_cast<int>(lo) + 1;
    *col = static_cast<int>(off - line_starts[lo]) + 1;
  }
  Status error_at(size_t off, const std::string& msg) const {
    int line, col;
    pos_of(off, &line, &col);
    return make_error(ErrorCode::kInvalidArgument, "line %d, column %d: %s", line, col, msg.c_str());
  }
  void emit(Tok t, std::string text, size_t off) {
    Token tk{t, std::move(text)};
    pos_of(off, &tk.line, &tk.col);
    out.push_back(std::move(tk));
  }

  // Python's `\s*` from `p`.
  size_t skip_space(size_t p) const { return p + py_lstrip_begin(std::string_view(src).substr(p)); }

  // `{%[-+]?\s*NAME\s*(-%}\s*|%})` at p (raw / endraw); returns the end of the match (before trim), 0 if none.
  size_t match_word_tag(size_t p, const char* word, char* sign, bool* strip_after, bool* plus_end) const {
    if (src.compare(p, 2, "{%") != 0) return 0;
    size_t q = p + 2;
    *sign = 0;
    if (q < src.size() && (src[q] == '-' || src[q] == '+')) *sign = src[q++];
    q = skip_space(q);
    const size_t n = std::strlen(word);
    if (src.compare(q, n, word) != 0) return 0;
    q = skip_space(q + n);
    *strip_after = false;
    *plus_end = false;
    if (src.compare(q, 3, "-%}") == 0) {
      *strip_after = true;
      return q + 3;
    }
    if (src.compare(q, 3, "+%}") == 0) {
      *plus_end = true;
      return q + 3;
    }
    if (src.compare(q, 2, "%}") == 0) return q + 2;
    return 0;
  }

  // Whitespace control for the text before a tag; returns the text to emit.
  std::string control_text(std::string text, char sign, bool is_variable, bool line_starting) const {
    if (sign == '-') {
      text.resize(py_rstrip_end(text));
    } else if (sign != '+' && !is_variable) {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          py_lstrip_begin(std::string_view(text).substr(l_pos)) == text.size() - l_pos)
        text.resize(l_pos);
    }
    return text;
  }

  // After "%}" / "#}": trim_blocks drops one "\n"; "-%}" drops all whitespace. Returns the new position and
  // whether the consumed end ends in "\n" (jinja2's line_starting).
  size_t after_end(size_t p, bool strip, bool plus, bool* line_starting) const {
    size_t q = p;
    if (strip) q = skip_space(p);
    else if (!plus && q < src.size() && src[q] == '\n') ++q;
    *line_starting = q > 0 && src[q - 1] == '\n' && q > p;
    return q;
  }

  Status run();
  Status lex_tag(size_t* pos, bool is_block, bool* line_starting);
};

bool is_name_start(unsigned char c) { return std::isalpha(c) || c == '_'; }
bool is_name_char(unsigned char c) { return std::isalnum(c) || c == '_'; }

// Python's unicode-escape of a jinja string literal body (quotes already removed). \N{NAME} (named characters)
// is not supported: *bad is set, as Python raises for a malformed one.
std::string unescape(const std::string& s, bool* bad) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hexval = [&](size_t start, size_t n, uint32_t* v) {
      if (start + n > s.size()) return false;
      *v = 0;
      for (size_t k = 0; k < n; ++k) {
        const char h = s[start + k];
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) return false;
        *v = *v * 16 + static_cast<uint32_t>(d);
      }
      return true;
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // line continuation
      case 'N': *bad = true; return out;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t v;
        if (hexval(i + 1, n, &v) && v <= 0x10FFFF) {
          append_utf8(&out, v);
          i += n;
        } else {
          out += '\\';
          out += c;
        }
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t k = 0;
          while (k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7') v = v * 8 + (s[i + k++] - '0');
          append_utf8(&out, v);
          i += k - 1;
        } else {
          out += '\\';  // unknown escapes are kept, as Python does
          out += c;
        }
    }
  }
  return out;
}

Status Lexer::lex_tag(size_t* pos, bool is_block, bool* line_starting) {
  std::vector<char> balance;
  size_t p = *pos;
  const char* end2 = is_block ? "%}" : "}}";
  while (true) {
    if (p >= src.size())
      return error_at(*pos, is_block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'");
    if (balance.empty()) {
      if (is_block && src.compare(p, 3, "+%}") == 0) {
        emit(Tok::kBlockEnd, "", p);
        *pos = after_end(p + 3, false, true, line_starting);
        return Status::ok();
      }
      if (src[p] == '-' && src.compare(p + 1, 2, end2) == 0) {
        emit(is_block ? Tok::kBlockEnd : Tok::kVarEnd, "", p);
        *pos = after_end(p + 3, true, false, line_starting);
        return Status::ok();
      }
      if (src.compare(p, 2, end2) == 0) {
        emit(is_block ? Tok::kBlockEnd : Tok::kVarEnd, "", p);
        // trim_blocks applies to block tags only, never to "}}".
        *pos = is_block ? after_end(p + 2, false, false, line_starting) : p + 2;
        if (!is_block) *line_starting = false;
        return Status::ok();
      }
    }
    const unsigned char c = static_cast<unsigned char>(src[p]);
    if (py_isspace(c) || (c >= 0x80 && py_lstrip_begin(std::string_view(src).substr(p)) > 0)) {
      p += std::max<size_t>(1, py_lstrip_begin(std::string_view(src).substr(p)));
      continue;
    }
    const size_t start = p;
    if (std::isdigit(c)) {
      // integer: (\d+_)*\d+ ; float: integer then (.digits)?(e[+-]?digits)? with at least one of the two
      auto digits = [&](size_t q) {
        size_t r = q;
        while (r < src.size() && (std::isdigit(static_cast<unsigned char>(src[r])) ||
                                  (src[r] == '_' && r + 1 < src.size() && std::isdigit(static_cast<unsigned char>(src[r + 1])) && r > q)))
          ++r;
        return r;
      };
      size_t q = digits(p);
      bool is_float = false;
      if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
        q = digits(q + 1);
        is_float = true;
      }
      if (q < src.size() && (src[q] == 'e' || src[q] == 'E')) {
        size_t r = q + 1;
        if (r < src.size() && (src[r] == '+' || src[r] == '-')) ++r;
        if (r < src.size() && std::isdigit(static_cast<unsigned char>(src[r]))) {
          q = digits(r);
          is_float = true;
        }
      }
      std::string text;
      for (size_t k = start; k < q; ++k)
        if (src[k] != '_') text += src[k];
      emit(is_float ? Tok::kFloat : Tok::kInt, text, start);
      p = q;
      continue;
    }
    if (is_name_start(c)) {
      size_t q = p;
      while (q < src.size() && is_name_char(static_cast<unsigned char>(src[q]))) ++q;
      emit(Tok::kName, src.substr(p, q - p), start);
      p = q;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < src.size() && src[q] != static_cast<char>(c)) q += (src[q] == '\\' && q + 1 < src.size()) ? 2 : 1;
      if (q >= src.size()) return error_at(start, "unexpected char '" + std::string(1, static_cast<char>(c)) + "' (unterminated string)");
      bool bad = false;
      std::string value = unescape(src.substr(p + 1, q - p - 1), &bad);
      if (bad) return error_at(start, "\\N{...} escapes are not supported (jinja2 raises for a malformed one)");
      emit(Tok::kString, std::move(value), start);
      p = q + 1;
      continue;
    }
    static const char* kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
    bool two = false;
    for (const char* op : kOps2)
      if (src.compare(p, 2, op) == 0) {
        emit(Tok::kOp, op, start);
        p += 2;
        two = true;
        break;
      }
    if (two) continue;
    if (std::strchr("+-/*%~[](){}<>=.:|,;", static_cast<int>(c)) && c != 0) {
      if (c == '(' || c == '[' || c == '{') {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (c == ')' || c == ']' || c == '}') {
        if (balance.empty()) return error_at(start, strprintf("unexpected '%c'", c));
        if (balance.back() != static_cast<char>(c))
          return error_at(start, strprintf("unexpected '%c', expected '%c'", c, balance.back()));
        balance.pop_back();
      }
      emit(Tok::kOp, std::string(1, static_cast<char>(c)), start);
      ++p;
      continue;
    }
    return error_at(start, c < 0x80 && std::isprint(c) ? strprintf("unexpected char '%c'", c) : strprintf("unexpected byte 0x%02x", c));
  }
}

Status Lexer::run() {
  size_t pos = 0;
  bool line_starting = true;
  while (pos < src.size()) {
    // the earliest tag opener
    size_t t = pos;
    while (true) {
      t = src.find('{', t);
      if (t == std::string::npos || t + 1 >= src.size()) {
        t = std::string::npos;
        break;
      }
      const char n = src[t + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++t;
    }
    if (t == std::string::npos) {
      emit(Tok::kData, src.substr(pos), pos);
      break;
    }
    const char kind = src[t + 1];
    const char sign = (t + 2 < src.size() && (src[t + 2] == '-' || src[t + 2] == '+')) ? src[t + 2] : 0;
    // raw block: {% raw %}...{% endraw %}, its body verbatim
    char rsign;
    bool rstrip_after, rplus;
    if (kind == '%') {
      if (const size_t rend = match_word_tag(t, "raw", &rsign, &rstrip_after, &rplus)) {
        std::string text = control_text(src.substr(pos, t - pos), rsign, false, line_starting);
        if (!text.empty()) emit(Tok::kData, text, pos);
        size_t body = rstrip_after ? skip_space(rend) : rend;
        // find {% endraw %}
        size_t e = body;
        size_t eend = 0;
        char esign = 0;
        bool estrip = false, eplus = false;
        for (; e < src.size(); ++e) {
          if (src.compare(e, 2, "{%") == 0 && (eend = match_word_tag(e, "endraw", &esign, &estrip, &eplus))) break;
        }
        if (e >= src.size()) return error_at(t, "Missing end of raw directive");
        std::string raw = src.substr(body, e - body);
        if (esign == '-') raw.resize(py_rstrip_end(raw));
        if (!raw.empty()) emit(Tok::kData, raw, body);
        pos = after_end(eend, estrip, eplus, &line_starting);
        continue;
      }
    }
    std::string text = control_text(src.substr(pos, t - pos), sign, kind == '{', line_starting);
    if (!text.empty()) emit(Tok::kData, text, pos);
    size_t p = t + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      // comment: up to the first "#}" (with its own -/+ sign); trim_blocks applies
      size_t e = src.find("#}", p);
      if (e == std::string::npos) return error_at(t, "Missing end of comment tag");
      const bool strip = e > p && src[e - 1] == '-';
      const bool plus = e > p && src[e - 1] == '+';
      pos = after_end(e + 2, strip, plus, &line_starting);
      continue;
    }
    emit(kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "", t);
    line_starting = false;
    KILN_TRY(lex_tag(&p, kind == '%', &line_starting));
    pos = p;
  }
  emit(Tok::kEof, "", src.size());
  return Status::ok();
}

}  // namespace

Result<std::vector<Token>> lex(const std::string& source) {
  Lexer lx;
  // Newlines normalized to "\n" and one trailing newline dropped (keep_trailing_newline=False), as jinja2 does
  // before lexing: split on \r\n|\r|\n, drop a last empty line, join with \n.
  lx.src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      lx.src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      lx.src += source[i];
    }
  }
  if (!lx.src.empty() && lx.src.back() == '\n') lx.src.pop_back();
  lx.line_starts.push_back(0);
  for (size_t i = 0; i < lx.src.size(); ++i)
    if (lx.src[i] == '\n') lx.line_starts.push_back(i + 1);
  KILN_TRY(lx.run());
  return std::move(lx.out);
}

}  // namespace kiln::tpl

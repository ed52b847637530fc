// See strings.h.
#include "template/strings.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::tpl {

namespace {

uint32_t cp_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    // Latin Extended-A: pairs (upper even, lower odd) except 0x139-0x148 and 0x179-0x17E (upper odd)
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper) return (c % 2 == 1) ? c + 1 : c;
    if (c == 0x178) return 0xFF;
    return (c % 2 == 0) ? c + 1 : c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  return c;
}

uint32_t cp_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 0x20;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F) {
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_upper) return (c % 2 == 0) ? c - 1 : c;
    return (c % 2 == 1) ? c - 1 : c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 0x20;
  if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  return c;
}

bool cp_is_lower(uint32_t c) { return cp_upper(c) != c || c == 0xDF; }
bool cp_is_upper(uint32_t c) { return cp_lower(c) != c; }
bool cp_cased(uint32_t c) { return cp_is_lower(c) || cp_is_upper(c); }
bool cp_alpha(uint32_t c) {
  if (c < 0x80) return std::isalpha(static_cast<int>(c));
  return cp_cased(c) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) || (c >= 0xAC00 && c <= 0xD7AF) ||
         (c >= 0x5D0 && c <= 0x5EA) || (c >= 0x620 && c <= 0x64A) || (c >= 0xE01 && c <= 0xE30);
}
bool cp_digit(uint32_t c) { return c >= '0' && c <= '9'; }

void append_upper(std::string* out, uint32_t c) {
  if (c == 0xDF) {
    *out += "SS";  // Python: 'ß'.upper() == 'SS'
    return;
  }
  append_utf8(out, cp_upper(c));
}

template <class F>
std::string map_cps(const std::string& s, F f) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t c : decode_utf8_all(s)) f(&out, c);
  return out;
}

std::string repeat(const std::string& s, int64_t n) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

std::string py_lower(const std::string& s) {
  if (is_ascii(s)) {
    std::string o = s;
    for (char& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return o;
  }
  return map_cps(s, [](std::string* o, uint32_t c) { append_utf8(o, cp_lower(c)); });
}
std::string py_upper(const std::string& s) {
  if (is_ascii(s)) {
    std::string o = s;
    for (char& c : o) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return o;
  }
  return map_cps(s, [](std::string* o, uint32_t c) { append_upper(o, c); });
}
std::string py_capitalize(const std::string& s) {
  bool first = true;
  return map_cps(s, [&](std::string* o, uint32_t c) {
    if (first) append_upper(o, c);
    else append_utf8(o, cp_lower(c));
    first = false;
  });
}
std::string py_title(const std::string& s) {
  bool prev_cased = false;
  return map_cps(s, [&](std::string* o, uint32_t c) {
    if (prev_cased) append_utf8(o, cp_lower(c));
    else append_upper(o, c);
    prev_cased = cp_cased(c) || (c == 0xDF);
  });
}
std::string jinja_title(const std::string& s) {
  // "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", s) if w)
  std::string out;
  const auto cps = decode_utf8_all(s);
  auto is_sep = [](uint32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool sep = is_sep(cps[i]);
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    for (size_t k = i; k < j; ++k) {
      if (k == i) append_upper(&out, cps[k]);
      else append_utf8(&out, cp_lower(cps[k]));
    }
    i = j;
  }
  return out;
}
bool py_islower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : decode_utf8_all(s)) {
    if (cp_is_upper(c)) return false;
    cased |= cp_is_lower(c);
  }
  return cased;
}
bool py_isupper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : decode_utf8_all(s)) {
    if (cp_is_lower(c)) return false;
    cased |= cp_is_upper(c);
  }
  return cased;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  if (!chars) {
    const size_t b = left ? py_lstrip_begin(s) : 0;
    const size_t e = right ? py_rstrip_end(s) : s.size();
    return b >= e ? std::string() : s.substr(b, e - b);
  }
  const auto cps = decode_utf8_all(s), set = decode_utf8_all(*chars);
  auto in_set = [&](uint32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && in_set(cps[b])) ++b;
  if (right)
    while (e > b && in_set(cps[e - 1])) --e;
  return utf8_encode(cps, b, e);
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t f = s.find(*sep, pos);
      if (f == std::string::npos) break;
      out.push_back(s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  const auto cps = decode_utf8_all(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && py_isspace(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = cps.size();
      while (e > i && py_isspace(cps[e - 1])) --e;
      out.push_back(utf8_encode(cps, i, e));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !py_isspace(cps[j])) ++j;
    out.push_back(utf8_encode(cps, i, j));
    i = j;
  }
  return out;
}

namespace {
std::vector<std::string> py_rsplit(const std::string& s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return py_split(s, sep, -1);
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string::npos) break;
      out.push_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const auto cps = decode_utf8_all(s);
  size_t e = cps.size();
  while (e > 0) {
    while (e > 0 && py_isspace(cps[e - 1])) --e;
    if (e == 0) break;
    if (static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t b = 0;
      while (b < e && py_isspace(cps[b])) ++b;
      out.push_back(utf8_encode(cps, b, e));
      break;
    }
    size_t b = e;
    while (b > 0 && !py_isspace(cps[b - 1])) --b;
    out.push_back(utf8_encode(cps, b, e));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}
}  // namespace

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  const auto cps = decode_utf8_all(s);
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    const uint32_t c = cps[i];
    const bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                    c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!br) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    out.push_back(utf8_encode(cps, start, keepends ? end : i));
    start = i = end;
  }
  if (start < cps.size()) out.push_back(utf8_encode(cps, start, cps.size()));
  return out;
}

Status py_replace(Interp& in, const std::string& s, const std::string& old, const std::string& rep, int64_t count,
                  std::string* out) {
  out->clear();
  if (old.empty()) {  // Python inserts `rep` before every code point and at the end
    const auto cps = decode_utf8_all(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        *out += rep;
        ++n;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
      KILN_TRY(in.check_string(out->size()));
    }
    return Status::ok();
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(old, pos);
    if (f == std::string::npos) break;
    out->append(s, pos, f - pos);
    *out += rep;
    pos = f + old.size();
    ++n;
    KILN_TRY(in.check_string(out->size()));
  }
  out->append(s, pos, std::string::npos);
  return in.check_string(out->size());
}

int64_t py_word_count(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : decode_utf8_all(s)) {
    const bool w = c == '_' || cp_digit(c) || cp_alpha(c) || (c >= 0x80 && !py_isspace(c) && c != 0xA0 && !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F) && !(c >= 0xFF00 && c <= 0xFF0F));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

std::string py_pad(const std::string& s, int64_t width, char fill, char align) {
  const int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return s;
  const int64_t marg = std::min<int64_t>(width, 1 << 24) - len;
  const std::string f(1, fill);
  if (align == 'l') return s + repeat(f, marg);
  if (align == 'r') return repeat(f, marg) + s;
  const int64_t left = marg / 2 + (marg & width & 1);  // CPython's str.center
  return repeat(f, left) + s + repeat(f, marg - left);
}

Result<Value> jinja_indent(Interp& in, const Value& v, CallArgs& a) {
  static const Value k4 = Value::integer(4), kFalse = Value::boolean(false);
  const Value* w = a.get(0, "width");
  const Value& width = w ? *w : k4;
  const Value* fv = a.get(1, "first");
  const Value* bv = a.get(2, "blank");
  const bool first = fv ? fv->truthy() : false, blank = bv ? bv->truthy() : false;
  std::string ind;
  if (width.is_string()) ind = width.str();
  else if (width.is_int() || width.is_bool()) ind = std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1 << 16)), ' ');
  else return in.error("indent: width must be an int or a string");
  if (v.is_undefined()) return Status(ErrorCode::kInvalidArgument, v.str().empty() ? "undefined value used" : v.str());
  if (!v.is_string())  // jinja2 appends "\n" to the value itself
    return in.error("unsupported operand type(s) for +=: '%s' and 'str'", v.type_name().c_str());
  std::string s = (v.is_string() ? v.str() : to_str(v)) + "\n";  // jinja2's quirk for splitlines
  const auto lines = py_splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
      KILN_TRY(in.check_string(rv.size()));
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
      KILN_TRY(in.check_string(rv.size()));
    }
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv), v.is_safe());
}

// ---------------------------------------------------------------- formatting

namespace {

struct Spec {
  char fill = ' ', align = 0, sign = '-';
  bool alt = false, zero = false;
  int64_t width = -1, precision = -1;
  char grouping = 0, type = 0;
};

bool parse_spec(const std::string& s, Spec* sp) {
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp->fill = s[0];
    sp->align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp->align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) sp->sign = s[i++];
  if (i < s.size() && s[i] == '#') { sp->alt = true; ++i; }
  if (i < s.size() && s[i] == '0') { sp->zero = true; ++i; }
  if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    sp->width = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) sp->width = std::min<int64_t>(sp->width * 10 + (s[i++] - '0'), 1 << 20);
  }
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) sp->grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    sp->precision = 0;
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) sp->precision = std::min<int64_t>(sp->precision * 10 + (s[i++] - '0'), 1000);
  }
  if (i < s.size()) sp->type = s[i++];
  return i == s.size();
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out += digits[i];
    if (sep && (n - i - 1) % 3 == 0 && i + 1 < n) out += sep;
  }
  return out;
}

std::string pad_spec(const std::string& body, const std::string& sign_prefix, const Spec& sp, char default_align) {
  const int64_t len = static_cast<int64_t>(utf8_length(body) + sign_prefix.size());
  char align = sp.align ? sp.align : (sp.zero ? '=' : default_align);
  char fill = sp.align ? sp.fill : (sp.zero ? '0' : ' ');
  if (sp.width <= len) return sign_prefix + body;
  const std::string pad = repeat(std::string(1, fill), sp.width - len);
  switch (align) {
    case '<': return sign_prefix + body + pad;
    case '>': return pad + sign_prefix + body;
    case '=': return sign_prefix + pad + body;
    default: {
      const int64_t total = sp.width - len, left = total / 2;
      return repeat(std::string(1, fill), left) + sign_prefix + body + repeat(std::string(1, fill), total - left);
    }
  }
}

Result<std::string> format_number(Interp& in, const Value& v, const Spec& sp) {
  char type = sp.type;
  const bool is_intlike = v.is_int() || v.is_bool();
  if (!type) type = is_intlike ? 'd' : 0;
  std::string body;
  bool neg = false;
  if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b' || type == 'c' || type == 'n') {
    if (!is_intlike) return in.error("Unknown format code '%c' for object of type 'float'", type);
    int64_t x = v.as_int();
    if (type == 'c') return std::string(1, static_cast<char>(x));
    neg = x < 0;
    uint64_t u = neg ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
    const int base = type == 'x' || type == 'X' ? 16 : type == 'o' ? 8 : type == 'b' ? 2 : 10;
    std::string digits;
    do {
      const int d = static_cast<int>(u % base);
      digits += static_cast<char>(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
      u /= base;
    } while (u);
    std::reverse(digits.begin(), digits.end());
    body = group_digits(digits, sp.grouping);
    if (sp.alt && base != 10) body = std::string(type == 'x' ? "0x" : type == 'X' ? "0X" : type == 'o' ? "0o" : "0b") + body;
  } else {
    double x = v.as_float();
    neg = std::signbit(x) && !std::isnan(x);
    x = std::fabs(x);
    if (!type) {
      body = sp.precision < 0 ? py_float_repr(x) : strprintf("%.*g", static_cast<int>(std::max<int64_t>(1, sp.precision)), x);
      if (sp.precision >= 0 && body.find_first_of(".en") == std::string::npos) body += "";
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G' || type == '%') {
      const int p = static_cast<int>(sp.precision < 0 ? 6 : sp.precision);
      if (type == '%') body = strprintf("%.*f", p, x * 100) + "%";
      else body = strprintf((std::string("%") + (sp.alt ? "#" : "") + ".*" + type).c_str(), p, x);
      if (sp.grouping && (type == 'f' || type == 'F')) {
        const size_t dot = body.find('.');
        body = group_digits(body.substr(0, dot), sp.grouping) + (dot == std::string::npos ? "" : body.substr(dot));
      }
    } else {
      return in.error("Unknown format code '%c' for object of type '%s'", type, v.type_name().c_str());
    }
  }
  std::string sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
  return pad_spec(body, sign, sp, '>');
}

// format(value, spec) for str.format fields.
Result<std::string> format_field(Interp& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  Spec sp;
  if (!parse_spec(spec, &sp)) return in.error("Invalid format specifier '%s'", spec.c_str());
  if (v.is_string()) {
    if (sp.type && sp.type != 's') return in.error("Unknown format code '%c' for object of type 'str'", sp.type);
    std::string s = v.str();
    if (sp.precision >= 0) {
      const auto cps = decode_utf8_all(s);
      s = utf8_encode(cps, 0, static_cast<size_t>(sp.precision));
    }
    return pad_spec(s, "", sp, '<');
  }
  if (v.is_number()) return format_number(in, v, sp);
  return in.error("unsupported format string passed to %s.__format__", v.type_name().c_str());
}

// Resolves "0.name[key]" / "name" / "" against the arguments (attribute access through the sandboxed getattr).
Result<Value> format_lookup(Interp& in, const std::string& field, size_t* auto_idx, const CallArgs& a) {
  size_t i = 0;
  while (i < field.size() && field[i] != '.' && field[i] != '[') ++i;
  const std::string head = field.substr(0, i);
  Value cur;
  if (head.empty() || std::all_of(head.begin(), head.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    const size_t idx = head.empty() ? (*auto_idx)++ : static_cast<size_t>(std::strtoull(head.c_str(), nullptr, 10));
    if (idx >= a.pos.size()) return in.error("Replacement index %zu out of range for positional args tuple", idx);
    cur = a.pos[idx];
  } else {
    const Value* v = nullptr;
    for (const auto& [k, x] : a.kw)
      if (k == head) v = &x;
    if (!v) return in.error("KeyError: '%s'", head.c_str());
    cur = *v;
  }
  while (i < field.size()) {
    if (field[i] == '.') {
      size_t j = i + 1;
      while (j < field.size() && field[j] != '.' && field[j] != '[') ++j;
      KILN_ASSIGN_OR_RETURN(cur, in.getattr(cur, field.substr(i + 1, j - i - 1)));
      if (cur.is_undefined() && !cur.str().empty()) return Status(ErrorCode::kInvalidArgument, cur.str());
      i = j;
    } else {
      const size_t j = field.find(']', i);
      if (j == std::string::npos) return in.error("Missing ']' in format string");
      const std::string k = field.substr(i + 1, j - i - 1);
      Value key = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })
                      ? Value::integer(std::strtoll(k.c_str(), nullptr, 10))
                      : Value::string(k);
      KILN_ASSIGN_OR_RETURN(cur, in.getitem(cur, key));
      i = j + 1;
    }
  }
  return cur;
}

Result<Value> str_format(Interp& in, const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      return in.error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // {field!conv:spec}
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth > 0) {
      if (fmt[j] == '{') ++depth;
      else if (fmt[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= fmt.size()) return in.error("expected '}' before end of string");
    const std::string inner = fmt.substr(i + 1, j - i - 1);
    size_t colon = std::string::npos, bang = std::string::npos;
    for (size_t k = 0, br = 0; k < inner.size(); ++k) {
      if (inner[k] == '[') br = 1;
      else if (inner[k] == ']') br = 0;
      else if (!br && inner[k] == '!' && bang == std::string::npos && colon == std::string::npos) bang = k;
      else if (!br && inner[k] == ':' && colon == std::string::npos) colon = k;
    }
    const std::string field = inner.substr(0, std::min(bang, colon));
    std::string spec = colon == std::string::npos ? "" : inner.substr(colon + 1);
    if (spec.find('{') != std::string::npos) return in.error("nested format specifications are not supported by kiln");
    KILN_ASSIGN_OR_RETURN(Value v, format_lookup(in, field, &auto_idx, a));
    if (bang != std::string::npos) {
      const char conv = bang + 1 < inner.size() ? inner[bang + 1] : 0;
      if (conv == 'r' || conv == 'a') v = Value::string(repr(v));
      else if (conv == 's') v = Value::string(to_str(v));
      else return in.error("Unknown conversion specifier");
    }
    KILN_ASSIGN_OR_RETURN(std::string f, format_field(in, v, spec));
    out += f;
    KILN_TRY(in.check_string(out.size()));
    i = j;
  }
  return Value::string(std::move(out));
}

}  // namespace

Result<Value> percent_format(Interp& in, const Value& fmt_v, const Value& args) {
  const std::string& fmt = fmt_v.str();
  List items;
  const Dict* mapping = args.is_dict() ? &args.dict() : nullptr;
  if (args.is_tuple()) items = args.items();
  else if (!mapping) items = {args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) return in.error("incomplete format");
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      const size_t e = fmt.find(')', i);
      if (e == std::string::npos || !mapping) return in.error("format requires a mapping");
      const Value* x = mapping->find(std::string_view(fmt).substr(i + 1, e - i - 1));
      if (!x) return in.error("KeyError: '%s'", fmt.substr(i + 1, e - i - 1).c_str());
      v = *x;
      have = true;
      i = e + 1;
    }
    Spec sp;
    sp.align = 0;
    bool left = false;
    while (i < fmt.size() && std::strchr("-+ #0", fmt[i])) {
      if (fmt[i] == '-') left = true;
      else if (fmt[i] == '+') sp.sign = '+';
      else if (fmt[i] == ' ') sp.sign = sp.sign == '+' ? '+' : ' ';
      else if (fmt[i] == '#') sp.alt = true;
      else sp.zero = true;
      ++i;
    }
    if (i < fmt.size() && fmt[i] == '*') return in.error("'*' width is not supported by kiln");
    if (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      sp.width = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) sp.width = std::min<int64_t>(sp.width * 10 + (fmt[i++] - '0'), 1 << 20);
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) sp.precision = std::min<int64_t>(sp.precision * 10 + (fmt[i++] - '0'), 1000);
    }
    if (i >= fmt.size()) return in.error("incomplete format");
    const char type = fmt[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!have) {
      if (mapping && items.empty()) return in.error("format requires a mapping");
      if (next >= items.size()) return in.error("not enough arguments for format string");
      v = items[next++];
    }
    if (left) {
      sp.align = '<';
      sp.zero = false;
    }
    std::string piece;
    if (type == 's' || type == 'r' || type == 'a') {
      std::string s = type == 's' ? to_str(v) : repr(v);
      if (sp.precision >= 0) s = utf8_encode(decode_utf8_all(s), 0, static_cast<size_t>(sp.precision));
      sp.zero = false;
      piece = pad_spec(s, "", sp, '>');
    } else if (std::strchr("diouxXeEfFgGc", type)) {
      if (!v.is_number()) return in.error("%%%c format: a real number is required, not %s", type, v.type_name().c_str());
      Spec ns = sp;
      ns.type = type == 'i' || type == 'u' ? 'd' : type;
      Value num = v;
      if ((ns.type == 'd' || ns.type == 'x' || ns.type == 'X' || ns.type == 'o') && v.is_float())
        num = Value::integer(static_cast<int64_t>(v.as_float()));
      if (ns.precision >= 0 && (ns.type == 'd' || ns.type == 'x' || ns.type == 'X' || ns.type == 'o')) ns.precision = -1;
      KILN_ASSIGN_OR_RETURN(piece, format_number(in, num, ns));
    } else {
      return in.error("unsupported format character '%c'", type);
    }
    out += piece;
    KILN_TRY(in.check_string(out.size()));
  }
  if (!mapping && next < items.size()) return in.error("not all arguments converted during string formatting");
  return Value::string(std::move(out), fmt_v.is_safe());
}

// ---------------------------------------------------------------- str methods

bool is_str_method(const std::string& n) {
  static const char* names[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
                                "replace", "upper", "lower", "title", "capitalize", "swapcase", "casefold", "format",
                                "join", "find", "rfind", "index", "rindex", "count", "isdigit", "isalpha", "isalnum",
                                "isspace", "isupper", "islower", "isnumeric", "isdecimal", "zfill", "center", "ljust",
                                "rjust", "partition", "rpartition", "removeprefix", "removesuffix", "istitle"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

Result<Value> call_str_method(Interp& in, const Value& self, const std::string& n, CallArgs& a) {
  const std::string& s = self.str();
  const bool safe = self.is_safe();
  auto str_arg = [&](size_t i, const char* name, std::string* out) -> Result<bool> {
    const Value* v = a.get(i, name);
    if (!v || v->is_none()) return false;
    if (!v->is_string()) return in.error("%s arg must be None or str, not %s", n.c_str(), v->type_name().c_str());
    *out = v->str();
    return true;
  };
  auto int_arg = [&](size_t i, const char* name, int64_t def) -> Result<int64_t> {
    const Value* v = a.get(i, name);
    if (!v) return def;
    if (!v->is_int() && !v->is_bool()) return in.error("'%s' object cannot be interpreted as an integer", v->type_name().c_str());
    return v->as_int();
  };
  auto str_list = [&](const std::vector<std::string>& parts) {
    List l;
    for (const auto& p : parts) l.push_back(Value::string(p, safe));
    return Value::list(std::move(l));
  };
  if (n == "strip" || n == "lstrip" || n == "rstrip") {
    std::string chars;
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(0, "chars", &chars));
    return Value::string(py_strip(s, have ? &chars : nullptr, n != "rstrip", n != "lstrip"), safe);
  }
  if (n == "split" || n == "rsplit") {
    std::string sep;
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(0, "sep", &sep));
    if (have && sep.empty()) return in.error("empty separator");
    KILN_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(1, "maxsplit", -1));
    return str_list(n == "split" ? py_split(s, have ? &sep : nullptr, maxsplit) : py_rsplit(s, have ? &sep : nullptr, maxsplit));
  }
  if (n == "splitlines") {
    const Value* k = a.get(0, "keepends");
    return str_list(py_splitlines(s, k && k->truthy()));
  }
  if (n == "startswith" || n == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) return in.error("%s() takes at least 1 argument (0 given)", n.c_str());
    std::vector<std::string> cands;
    if (p->is_string()) {
      cands.push_back(p->str());
    } else if (p->is_tuple()) {
      for (const Value& x : p->items()) {
        if (!x.is_string()) return in.error("tuple for %s must only contain str, not %s", n.c_str(), x.type_name().c_str());
        cands.push_back(x.str());
      }
    } else {
      return in.error("%s first arg must be str or a tuple of str, not %s", n.c_str(), p->type_name().c_str());
    }
    std::string sub = s;
    if (a.pos.size() > 1) {
      const auto cps = decode_utf8_all(s);
      const int64_t len = static_cast<int64_t>(cps.size());
      KILN_ASSIGN_OR_RETURN(int64_t b, int_arg(1, "start", 0));
      KILN_ASSIGN_OR_RETURN(int64_t e, int_arg(2, "end", len));
      if (b < 0) b = std::max<int64_t>(0, b + len);
      if (e < 0) e = std::max<int64_t>(0, e + len);
      e = std::min(e, len);
      if (b > len) return Value::boolean(false);
      sub = b < e ? utf8_encode(cps, static_cast<size_t>(b), static_cast<size_t>(e)) : "";
    }
    for (const auto& c : cands) {
      if (c.size() > sub.size()) continue;
      if (n == "startswith" ? sub.compare(0, c.size(), c) == 0 : sub.compare(sub.size() - c.size(), c.size(), c) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (n == "replace") {
    std::string old, rep;
    KILN_ASSIGN_OR_RETURN(bool h1, str_arg(0, "old", &old));
    KILN_ASSIGN_OR_RETURN(bool h2, str_arg(1, "new", &rep));
    if (!h1 || !h2) return in.error("replace expected at least 2 arguments");
    KILN_ASSIGN_OR_RETURN(int64_t count, int_arg(2, "count", -1));
    if (safe) {  // Markup.replace escapes its arguments
      old = html_escape(old);
      rep = html_escape(rep);
    }
    std::string out;
    KILN_TRY(py_replace(in, s, old, rep, count, &out));
    return Value::string(std::move(out), safe);
  }
  if (n == "upper") return Value::string(py_upper(s), safe);
  if (n == "lower" || n == "casefold") return Value::string(py_lower(s), safe);
  if (n == "title") return Value::string(py_title(s), safe);
  if (n == "capitalize") return Value::string(py_capitalize(s), safe);
  if (n == "swapcase")
    return Value::string(map_cps(s, [](std::string* o, uint32_t c) {
      if (cp_is_upper(c)) append_utf8(o, cp_lower(c));
      else if (cp_is_lower(c)) append_upper(o, c);
      else append_utf8(o, c);
    }), safe);
  if (n == "format") {
    if (safe) {  // Markup.format escapes its arguments
      CallArgs esc = a;
      for (auto& v : esc.pos)
        if (v.is_string() && !v.is_safe()) v = Value::string(html_escape(v.str()), true);
      for (auto& [k, v] : esc.kw)
        if (v.is_string() && !v.is_safe()) v = Value::string(html_escape(v.str()), true);
      KILN_ASSIGN_OR_RETURN(Value r, str_format(in, s, esc));
      return Value::string(r.str(), true);
    }
    return str_format(in, s, a);
  }
  if (n == "join") {
    if (a.pos.size() != 1) return in.error("join() takes exactly one argument");
    KILN_ASSIGN_OR_RETURN(List l, in.iterate(a.pos[0]));
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!l[i].is_string()) return in.error("sequence item %zu: expected str instance, %s found", i, l[i].type_name().c_str());
      if (i) out += s;
      out += safe && !l[i].is_safe() ? html_escape(l[i].str()) : l[i].str();
      KILN_TRY(in.check_string(out.size()));
    }
    return Value::string(std::move(out), safe);
  }
  if (n == "find" || n == "rfind" || n == "index" || n == "rindex" || n == "count") {
    std::string sub;
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(0, "sub", &sub));
    if (!have) return in.error("%s() takes at least 1 argument", n.c_str());
    if (n == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t c = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++c;
      return Value::integer(c);
    }
    const size_t p = (n == "find" || n == "index") ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) {
      if (n == "index" || n == "rindex") return in.error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, p))));
  }
  if (n == "isdigit" || n == "isnumeric" || n == "isdecimal" || n == "isalpha" || n == "isalnum" || n == "isspace") {
    const auto cps = decode_utf8_all(s);
    if (cps.empty()) return Value::boolean(false);
    for (uint32_t c : cps) {
      bool ok;
      if (n == "isalpha") ok = cp_alpha(c);
      else if (n == "isalnum") ok = cp_alpha(c) || cp_digit(c);
      else if (n == "isspace") ok = py_isspace(c);
      else ok = cp_digit(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (n == "isupper") return Value::boolean(py_isupper(s));
  if (n == "islower") return Value::boolean(py_islower(s));
  if (n == "istitle") return Value::boolean(!s.empty() && py_title(s) == s && py_lower(s) != s);
  if (n == "zfill") {
    KILN_ASSIGN_OR_RETURN(int64_t w, int_arg(0, "width", 0));
    const int64_t len = static_cast<int64_t>(utf8_length(s));
    if (w <= len) return Value::string(s, safe);
    KILN_TRY(in.check_string(static_cast<size_t>(w)));
    const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    return Value::string((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(w - len), '0') + (sign ? s.substr(1) : s), safe);
  }
  if (n == "center" || n == "ljust" || n == "rjust") {
    KILN_ASSIGN_OR_RETURN(int64_t w, int_arg(0, "width", 0));
    KILN_TRY(in.check_string(static_cast<size_t>(std::max<int64_t>(0, w))));
    std::string fill = " ";
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(1, "fillchar", &fill));
    if (have && utf8_length(fill) != 1) return in.error("The fill character must be exactly one character long");
    if (fill.size() != 1) return in.error("kiln supports only single-byte fill characters");
    return Value::string(py_pad(s, w, fill[0], n == "center" ? 'c' : n == "ljust" ? 'l' : 'r'), safe);
  }
  if (n == "partition" || n == "rpartition") {
    std::string sep;
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(0, "sep", &sep));
    if (!have || sep.empty()) return in.error("empty separator");
    const size_t p = n == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos)
      return n == "partition" ? Value::list({Value::string(s, safe), Value::string("", safe), Value::string("", safe)}, true)
                              : Value::list({Value::string("", safe), Value::string("", safe), Value::string(s, safe)}, true);
    return Value::list({Value::string(s.substr(0, p), safe), Value::string(sep, safe), Value::string(s.substr(p + sep.size()), safe)}, true);
  }
  if (n == "removeprefix" || n == "removesuffix") {
    std::string x;
    KILN_ASSIGN_OR_RETURN(bool have, str_arg(0, "prefix", &x));
    if (!have) return in.error("%s() takes exactly one argument", n.c_str());
    if (n == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()), safe);
    if (n == "removesuffix" && x.size() <= s.size() && !x.empty() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::string(s.substr(0, s.size() - x.size()), safe);
    return Value::string(s, safe);
  }
  return in.error("'str' object has no attribute '%s'", n.c_str());
}

}  // namespace kiln::tpl

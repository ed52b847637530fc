// Python-compatible conversions of template values: str/repr, float repr, ==/<, json.dumps.
#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace kiln::tpl {

namespace {
const std::string kEmpty;
const List kEmptyList;
const Dict kEmptyDict;
constexpr int kMaxDepth = 200;  // nesting of containers (json, repr, ==): bounded so hostile data cannot overflow
}  // namespace

// ---------------------------------------------------------------- construction

Value Value::undefined(std::string hint) {
  Value v;
  v.obj_ = std::make_shared<StringObj>(std::move(hint));
  return v;
}
Value Value::string(std::string s, bool safe) {
  Value v;
  v.kind_ = Kind::kString;
  v.safe_ = safe;
  v.obj_ = std::make_shared<StringObj>(std::move(s));
  return v;
}
Value Value::list(List items, bool tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = tuple;
  v.obj_ = std::make_shared<ListObj>(std::move(items));
  return v;
}
Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.obj_ = std::make_shared<DictObj>(std::move(d));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? number(static_cast<double>(u)) : integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e));
      return list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.entries.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.entries.emplace_back(string(it.key()), from_json(it.value()));
      return dict(std::move(d));
    }
    default: return none();
  }
}

const std::string& Value::str() const {
  if ((kind_ == Kind::kString || kind_ == Kind::kUndefined) && obj_) return static_cast<StringObj*>(obj_.get())->s;
  return kEmpty;
}
const List& Value::items() const {
  return kind_ == Kind::kList ? static_cast<ListObj*>(obj_.get())->items : kEmptyList;
}
const Dict& Value::dict() const {
  return kind_ == Kind::kDict ? static_cast<DictObj*>(obj_.get())->d : kEmptyDict;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0;
    case Kind::kString: return !str().empty();
    case Kind::kList: return !items().empty();
    case Kind::kDict: return !dict().entries.empty();
    default: return true;  // objects, callables, iterators (Python generators are always true)
  }
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return safe_ ? "Markup" : "str";
    case Kind::kList: return tuple_ ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
    case Kind::kIterator: return static_cast<IteratorObj*>(obj_.get())->type_name;
    case Kind::kObject: return static_cast<AttrObject*>(obj_.get())->type_name();
  }
  return "object";
}

// ---------------------------------------------------------------- dict

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}
const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}
void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries)
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

// ---------------------------------------------------------------- UTF-8

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) append_utf8(&out, cps[i]);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

namespace {
// Decodes the code point starting at s[i] (for whitespace tests only; invalid bytes read as U+FFFD), its length.
uint32_t cp_at(std::string_view s, size_t i, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  *len = n;
  if (n == 1) return c < 0x80 ? c : 0xFFFD;
  auto v = decode_utf8_all(s.substr(i, n));
  return v.size() == 1 ? v[0] : 0xFFFD;
}
}  // namespace

size_t py_lstrip_begin(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n;
    if (!py_isspace(cp_at(s, i, &n))) break;
    i += n;
  }
  return i;
}

size_t py_rstrip_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const unsigned char last = static_cast<unsigned char>(s[end - 1]);
    if (last < 0x80) {
      if (!py_isspace(last)) break;
      --end;
      continue;
    }
    size_t start = end - 1;  // back to the lead byte of this code point (at most 3 continuation bytes)
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    size_t n;
    const uint32_t cp = cp_at(s, start, &n);
    if (start + n != end || !py_isspace(cp)) break;
    end = start;
  }
  return end;
}

size_t utf8_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode_utf8_all(s).size();
}

// ---------------------------------------------------------------- str / repr

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits (what Python's repr uses), then Python's layout: scientific when the decimal
  // exponent is < -4 or >= 16, else positional with at least one digit after the point.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = false;
  size_t p = 0;
  if (sci[0] == '-') {
    neg = true;
    p = 1;
  }
  const size_t epos = sci.find('e');
  std::string digits;
  for (size_t i = p; i < epos; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp = std::atoi(sci.c_str() + epos + 1);
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += exp < 0 ? "e-" : "e+";
    const int ae = std::abs(exp);
    if (ae < 10) out += "0";
    out += std::to_string(ae);
    return out;
  }
  if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
  }
  return out;
}

namespace {
// Python's str.isprintable() for the code points repr escapes (approximation of the Unicode tables: controls,
// separators other than ' ', format characters, private use and unassigned surrogates).
bool py_printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;
  if (cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) ||
      (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB))
    return false;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  if (cp >= 0xE000 && cp <= 0xF8FF) return false;
  if (cp == 0xFFFE || cp == 0xFFFF || cp > 0x10FFFF) return false;
  if (cp >= 0xF0000) return false;
  return true;
}
}  // namespace

std::string py_repr_string(std::string_view s) {
  const bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  const char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : decode_utf8_all(s)) {
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!py_printable(cp)) {
      out += cp < 0x100 ? strprintf("\\x%02x", cp) : cp < 0x10000 ? strprintf("\\u%04x", cp) : strprintf("\\U%08x", cp);
    } else {
      append_utf8(&out, cp);
    }
  }
  out += q;
  return out;
}

namespace {
void repr_into(const Value& v, std::string* out, int depth);

void str_into(const Value& v, std::string* out, int depth) {
  switch (v.kind()) {
    case Kind::kUndefined: return;
    case Kind::kString: *out += v.str(); return;
    default: repr_into(v, out, depth);
  }
}

void repr_into(const Value& v, std::string* out, int depth) {
  if (depth > kMaxDepth) {
    *out += "...";
    return;
  }
  switch (v.kind()) {
    case Kind::kUndefined: *out += "Undefined"; return;
    case Kind::kNone: *out += "None"; return;
    case Kind::kBool: *out += v.as_bool() ? "True" : "False"; return;
    case Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Kind::kFloat: *out += py_float_repr(v.as_float()); return;
    case Kind::kString:
      if (v.is_safe()) *out += "Markup(" + py_repr_string(v.str()) + ")";
      else *out += py_repr_string(v.str());
      return;
    case Kind::kList: {
      const List& l = v.items();
      *out += v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) *out += ", ";
        repr_into(l[i], out, depth + 1);
      }
      if (v.is_tuple() && l.size() == 1) *out += ",";
      *out += v.is_tuple() ? ")" : "]";
      return;
    }
    case Kind::kDict: {
      *out += "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().entries) {
        if (!first) *out += ", ";
        first = false;
        repr_into(k, out, depth + 1);
        *out += ": ";
        repr_into(val, out, depth + 1);
      }
      *out += "}";
      return;
    }
    case Kind::kNamespace: {
      *out += "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.as<NamespaceObj>()->attrs.entries) {
        if (!first) *out += ", ";
        first = false;
        repr_into(k, out, depth + 1);
        *out += ": ";
        repr_into(val, out, depth + 1);
      }
      *out += "}>";
      return;
    }
    // Python prints these with a memory address, which no two runs share; kiln prints a fixed stand-in.
    case Kind::kCallable: *out += "<function>"; return;
    case Kind::kIterator: *out += "<" + v.type_name() + " object>"; return;
    case Kind::kObject: *out += "<" + v.type_name() + " object>"; return;
  }
}
}  // namespace

std::string to_str(const Value& v) {
  std::string out;
  str_into(v, &out, 0);
  return out;
}
std::string repr(const Value& v) {
  std::string out;
  repr_into(v, &out, 0);
  return out;
}

// ---------------------------------------------------------------- == and <

namespace {
bool equals_depth(const Value& a, const Value& b, int depth) {
  if (depth > kMaxDepth) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.str() == b.str();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals_depth(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case Kind::kDict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* o = y.find(k);
        if (!o || !equals_depth(v, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.obj() == b.obj();  // identity
  }
}
}  // namespace

bool equals(const Value& a, const Value& b) { return equals_depth(a, b, 0); }

Result<int> compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;  // NaN compares as "equal" here; Python's < and > are both false too
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined() || b.is_undefined())
    return Status(ErrorCode::kInvalidArgument, a.is_undefined() ? a.str() : b.str());
  return make_error(ErrorCode::kInvalidArgument, "'<' not supported between instances of '%s' and '%s'",
                    a.type_name().c_str(), b.type_name().c_str());
}

// ---------------------------------------------------------------- json

namespace {
void json_string(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          *out += strprintf("\\u%04x", c);
        } else if (c >= 0x80 && ensure_ascii) {
          // Decode this code point and write \uXXXX (a surrogate pair above the BMP), as Python does.
          size_t j = i + 1;
          while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80 && j - i < 4) ++j;
          for (uint32_t cp : decode_utf8_all(s.substr(i, j - i))) {
            if (cp >= 0x10000) {
              cp -= 0x10000;
              *out += strprintf("\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
              *out += strprintf("\\u%04x", cp);
            }
          }
          i = j - 1;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  *out += '"';
}

Status json_key(const Value& k, const JsonOptions& opt, std::string* out) {
  switch (k.kind()) {
    case Kind::kString: json_string(k.str(), opt.ensure_ascii, out); return Status::ok();
    case Kind::kInt: *out += "\"" + std::to_string(k.as_int()) + "\""; return Status::ok();
    case Kind::kFloat: *out += "\"" + py_float_repr(k.as_float()) + "\""; return Status::ok();
    case Kind::kBool: *out += k.as_bool() ? "\"true\"" : "\"false\""; return Status::ok();
    case Kind::kNone: *out += "\"null\""; return Status::ok();
    default:
      return make_error(ErrorCode::kInvalidArgument, "keys must be str, int, float, bool or None, not %s",
                        k.type_name().c_str());
  }
}

void json_newline(const JsonOptions& opt, int level, std::string* out) {
  *out += '\n';
  for (int i = 0; i < level; ++i) *out += opt.indent;
}
}  // namespace

Status to_json(const Value& v, const JsonOptions& opt, std::string* out, int depth) {
  if (depth > kMaxDepth) return make_error(ErrorCode::kOutOfRange, "maximum recursion depth exceeded in tojson");
  switch (v.kind()) {
    case Kind::kNone: *out += "null"; return Status::ok();
    case Kind::kBool: *out += v.as_bool() ? "true" : "false"; return Status::ok();
    case Kind::kInt: *out += std::to_string(v.as_int()); return Status::ok();
    case Kind::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) *out += "NaN";
      else if (std::isinf(d)) *out += d < 0 ? "-Infinity" : "Infinity";
      else *out += py_float_repr(d);
      return Status::ok();
    }
    case Kind::kString: json_string(v.str(), opt.ensure_ascii, out); return Status::ok();
    case Kind::kList: {
      const List& l = v.items();
      if (l.empty()) {
        *out += "[]";
        return Status::ok();
      }
      *out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) *out += opt.item_sep;
        if (opt.has_indent) json_newline(opt, depth + 1, out);
        KILN_TRY(to_json(l[i], opt, out, depth + 1));
      }
      if (opt.has_indent) json_newline(opt, depth, out);
      *out += ']';
      return Status::ok();
    }
    case Kind::kDict: {
      const Dict& d = v.dict();
      if (d.entries.empty()) {
        *out += "{}";
        return Status::ok();
      }
      std::vector<const std::pair<Value, Value>*> order;
      for (const auto& e : d.entries) order.push_back(&e);
      if (opt.sort_keys) {
        Status err;
        std::stable_sort(order.begin(), order.end(), [&](auto* a, auto* b) {
          auto c = compare(a->first, b->first);
          if (!c) {
            if (err.is_ok()) err = c.status();
            return false;
          }
          return *c < 0;
        });
        KILN_TRY(err);
      }
      *out += '{';
      bool first = true;
      for (const auto* e : order) {
        if (!first) *out += opt.item_sep;
        first = false;
        if (opt.has_indent) json_newline(opt, depth + 1, out);
        KILN_TRY(json_key(e->first, opt, out));
        *out += opt.key_sep;
        KILN_TRY(to_json(e->second, opt, out, depth + 1));
      }
      if (opt.has_indent) json_newline(opt, depth, out);
      *out += '}';
      return Status::ok();
    }
    default:
      return make_error(ErrorCode::kInvalidArgument, "Object of type %s is not JSON serializable",
                        v.type_name().c_str());
  }
}

Result<nlohmann::ordered_json> to_nlohmann(const Value& v, int depth) {
  if (depth > kMaxDepth) return make_error(ErrorCode::kOutOfRange, "value nested too deeply");
  switch (v.kind()) {
    case Kind::kNone: return nlohmann::ordered_json(nullptr);
    case Kind::kBool: return nlohmann::ordered_json(v.as_bool());
    case Kind::kInt: return nlohmann::ordered_json(v.as_int());
    case Kind::kFloat: return nlohmann::ordered_json(v.as_float());
    case Kind::kString: return nlohmann::ordered_json(v.str());
    case Kind::kList: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const Value& e : v.items()) {
        KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json j, to_nlohmann(e, depth + 1));
        a.push_back(std::move(j));
      }
      return a;
    }
    case Kind::kDict: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.dict().entries) {
        KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json j, to_nlohmann(e, depth + 1));
        o[to_str(k)] = std::move(j);
      }
      return o;
    }
    default:
      return make_error(ErrorCode::kInvalidArgument, "Object of type %s is not JSON serializable",
                        v.type_name().c_str());
  }
}

}  // namespace kiln::tpl

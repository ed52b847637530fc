// Operators, filters and tests, each with jinja2 3.1's / CPython's semantics (jinja2/filters.py, jinja2/tests.py),
// and transformers' overrides (tojson with ensure_ascii=False/indent/separators/sort_keys). Python methods of builtin
// values and the globals: builtins_globals.cpp.
// Filters that return generators in jinja2 (map, select, reject, selectattr, rejectattr, unique, items, batch)
// return one-shot iterators here, so `|tojson` of them fails and `|length` of them fails, as in Python.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "template/interp.h"
#include "template/strings.h"

namespace kiln::tpl {

namespace {

Status undefined_error(const Value& v) {
  return Status(ErrorCode::kInvalidArgument, v.str().empty() ? "undefined value used" : v.str());
}

Value gen(List items, const char* type = "generator") {
  auto it = std::make_shared<IteratorObj>();
  it->items = std::move(items);
  it->type_name = type;
  return Value::from_object(Kind::kIterator, std::move(it));
}

// Python ints: 64-bit here, overflow is an error.
Result<Value> int_result(Interp& in, bool overflow, int64_t v) {
  if (overflow) return in.error("integer overflow (kiln's template integers are 64-bit)");
  return Value::integer(v);
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m == 0) return std::copysign(0.0, b);  // CPython: a zero remainder takes the divisor's sign
  if ((m < 0) != (b < 0)) m += b;
  return m;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---------------------------------------------------------------- operators

Result<Value> binary_op(Interp& in, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  auto unsupported = [&]() {
    if (op == "+" && a.is_string())
      return in.error("can only concatenate str (not \"%s\") to str", b.type_name().c_str());
    if (op == "+" && a.is_list())
      return in.error("can only concatenate %s (not \"%s\") to %s", a.type_name().c_str(), b.type_name().c_str(),
                      a.type_name().c_str());
    return in.error("unsupported operand type(s) for %s: '%s' and '%s'", op.c_str(), a.type_name().c_str(),
                    b.type_name().c_str());
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      const bool of = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
      return int_result(in, of, r);
    }
    if (nums) return Value::number(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      KILN_TRY(in.check_string(a.str().size() + b.str().size()));
      // Markup + str escapes the plain side (markupsafe's __add__/__radd__); kiln templates have no autoescape,
      // so this only happens after |safe.
      if (a.is_safe() && !b.is_safe()) return Value::string(a.str() + html_escape(b.str()), true);
      if (b.is_safe() && !a.is_safe()) return Value::string(html_escape(a.str()) + b.str(), true);
      return Value::string(a.str() + b.str(), a.is_safe());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      KILN_TRY(in.check_list(a.items().size() + b.items().size()));
      List l = a.items();
      l.insert(l.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(l), a.is_tuple());
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      const bool of = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
      return int_result(in, of, r);
    }
    if (nums) return Value::number(a.as_float() - b.as_float());
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      const bool of = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      return int_result(in, of, r);
    }
    if (nums) return Value::number(a.as_float() * b.as_float());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
    const Value* cnt = seq == &a ? &b : &a;
    if (seq && (cnt->is_int() || cnt->is_bool())) {
      const int64_t n = std::max<int64_t>(0, cnt->as_int());
      if (seq->is_string()) {
        const double total = static_cast<double>(seq->str().size()) * static_cast<double>(n);
        KILN_TRY(in.check_string(total > 1e18 ? SIZE_MAX : static_cast<size_t>(total)));
        std::string s;
        s.reserve(static_cast<size_t>(total));
        for (int64_t i = 0; i < n; ++i) s += seq->str();
        return Value::string(std::move(s), seq->is_safe());
      }
      const double total = static_cast<double>(seq->items().size()) * static_cast<double>(n);
      KILN_TRY(in.check_list(total > 1e18 ? SIZE_MAX : static_cast<size_t>(total)));
      List l;
      for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(l), seq->is_tuple());
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_float() == 0) return in.error("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (!nums) return unsupported();
    if (b.as_float() == 0) return in.error(ints ? "integer division or modulo by zero" : "float floor division by zero");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) return in.error("integer overflow");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    return Value::number(std::floor(a.as_float() / b.as_float()));
  }
  if (op == "%") {
    if (a.is_string()) return percent_format(in, a, b);
    if (!nums) return unsupported();
    if (b.as_float() == 0) return in.error(ints ? "integer division or modulo by zero" : "float modulo");
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == -1) return Value::integer(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::integer(m);
    }
    return Value::number(py_fmod(a.as_float(), b.as_float()));
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && b.as_int() >= 0) {
      int64_t r = 1, base = a.as_int(), e = b.as_int();
      bool of = false;
      while (e > 0 && !of) {
        if (e & 1) of |= __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e > 0) of |= __builtin_mul_overflow(base, base, &base);
      }
      return int_result(in, of, r);
    }
    if (a.as_float() == 0 && b.as_float() < 0) return in.error("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(a.as_float(), b.as_float()));
  }
  return in.error("unknown operator '%s'", op.c_str());
}

Result<bool> contains(Interp& in, const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (item.is_undefined()) return undefined_error(item);
      if (!item.is_string())
        return in.error("'in <string>' requires string as left operand, not %s", item.type_name().c_str());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
      for (const Value& v : container.items())
        if (equals(v, item)) return true;
      return false;
    case Kind::kDict: return container.dict().find(item) != nullptr;
    case Kind::kUndefined: return false;  // Undefined iterates as empty
    case Kind::kIterator: {
      auto* it = container.as<IteratorObj>();
      while (it->pos < it->items.size())
        if (equals(it->items[it->pos++], item)) return true;
      return false;
    }
    default: return in.error("argument of type '%s' is not iterable", container.type_name().c_str());
  }
}

// ---------------------------------------------------------------- helpers shared by filters

namespace {

// jinja2's make_attrgetter: "a.b.0" -> getitem per part (integer parts as ints).
Result<Value> attr_path(Interp& in, const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Value key = Value::string(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      key = Value::integer(std::strtoll(part.c_str(), nullptr, 10));
    KILN_ASSIGN_OR_RETURN(cur, in.getitem(cur, key));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value lower_if_str(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.str()));
  return v;
}

Status sort_values(Interp& in, std::vector<std::pair<Value, Value>>* keyed, bool reverse) {
  Status err;
  std::stable_sort(keyed->begin(), keyed->end(), [&](const auto& x, const auto& y) {
    if (!err.is_ok()) return false;
    auto c = reverse ? compare(y.first, x.first) : compare(x.first, y.first);
    if (!c) {
      err = c.status();
      return false;
    }
    return *c < 0;
  });
  (void)in;
  return err;
}

Result<int64_t> len_of(Interp& in, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(utf8_length(v.str()));
    case Kind::kList: return static_cast<int64_t>(v.items().size());
    case Kind::kDict: return static_cast<int64_t>(v.dict().entries.size());
    default: return in.error("object of type '%s' has no len()", v.type_name().c_str());
  }
}

const Value& arg_or(const CallArgs& a, size_t i, const char* name, const Value& def) {
  const Value* v = a.get(i, name);
  return v ? *v : def;
}

Status check_args(Interp& in, const CallArgs& a, const char* fn, size_t max_pos, std::initializer_list<const char*> names) {
  if (a.pos.size() > max_pos) return in.error("%s() takes at most %zu positional arguments (%zu given)", fn, max_pos, a.pos.size());
  for (const auto& [k, v] : a.kw) {
    bool ok = false;
    for (const char* n : names) ok |= k == n;
    if (!ok) return in.error("%s() got an unexpected keyword argument '%s'", fn, k.c_str());
  }
  return Status::ok();
}

// Python int(str): optional whitespace, sign, digits with single underscores between them.
bool parse_py_int(const std::string& s, int base, int64_t* out) {
  size_t b = py_lstrip_begin(s), e = py_rstrip_end(s);
  if (b >= e) return false;
  std::string t = s.substr(b, e - b);
  bool neg = false;
  size_t i = 0;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    i = 1;
  }
  if (i >= t.size()) return false;
  // Python accepts a 0x/0o/0b prefix matching the base, and base 0 infers it (then no leading zeros).
  if (t.size() >= i + 2 && t[i] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(t[i + 1])));
    const int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == pb || base == 0)) {
      base = pb;
      i += 2;
      if (i < t.size() && t[i] == '_') ++i;
    }
  }
  if (base == 0) {
    base = 10;
    if (t.size() > i + 1 && t[i] == '0' && t.find_first_not_of("0_", i) != std::string::npos) return false;
  }
  if (base < 2 || base > 36 || i >= t.size()) return false;
  __int128 v = 0;
  bool last_us = true;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (last_us) return false;
      last_us = true;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) return false;
    last_us = false;
  }
  if (last_us) return false;
  if (neg) v = -v;
  if (v > INT64_MAX || v < INT64_MIN) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

bool parse_py_float(const std::string& s, double* out) {
  size_t b = py_lstrip_begin(s), e = py_rstrip_end(s);
  if (b >= e) return false;
  std::string t = s.substr(b, e - b);
  std::string lower = py_lower(t);
  if (lower == "inf" || lower == "+inf" || lower == "infinity" || lower == "+infinity") { *out = INFINITY; return true; }
  if (lower == "-inf" || lower == "-infinity") { *out = -INFINITY; return true; }
  if (lower == "nan" || lower == "+nan" || lower == "-nan") { *out = NAN; return true; }
  for (char c : t)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || c == '_')) return false;
  std::string clean;
  for (char c : t)
    if (c != '_') clean += c;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end && *end == 0 && end != clean.c_str();
}

Result<Value> do_tojson(Interp& in, const Value& v, CallArgs& a) {
  KILN_TRY(check_args(in, a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonOptions o;
  static const Value kFalse = Value::boolean(false), kNone = Value::none();
  o.ensure_ascii = arg_or(a, 0, "ensure_ascii", kFalse).truthy();
  const Value& indent = arg_or(a, 1, "indent", kNone);
  if (indent.is_int() || indent.is_bool()) {
    o.has_indent = true;
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1000))), ' ');
  } else if (indent.is_string()) {
    o.has_indent = true;
    o.indent = indent.str();
  } else if (!indent.is_none()) {
    return in.error("tojson: indent must be an int or a string");
  }
  if (o.has_indent) o.item_sep = ",";
  const Value& seps = arg_or(a, 2, "separators", kNone);
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.items().size() != 2 || !seps.items()[0].is_string() || !seps.items()[1].is_string())
      return in.error("tojson: separators must be a pair of strings");
    o.item_sep = seps.items()[0].str();
    o.key_sep = seps.items()[1].str();
  }
  o.sort_keys = arg_or(a, 3, "sort_keys", kFalse).truthy();
  std::string out;
  KILN_TRY(to_json(v, o, &out));
  KILN_TRY(in.check_string(out.size()));
  return Value::string(std::move(out));
}

// select/reject/selectattr/rejectattr: jinja2's select_or_reject.
Result<Value> select_or_reject(Interp& in, const Value& seq, CallArgs& a, bool use_attr, bool want) {
  if (!seq.truthy()) return gen({});  // jinja2: `if value:` guards the loop, so none|select is empty
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(seq));
  size_t off = 0;
  std::string attr;
  if (use_attr) {
    if (a.pos.empty()) return in.error("Missing parameter for attribute name");
    attr = to_str(a.pos[0]);
    off = 1;
  }
  std::string test;
  CallArgs targs;
  if (a.pos.size() > off) {
    test = to_str(a.pos[off]);
    targs.pos.assign(a.pos.begin() + static_cast<long>(off) + 1, a.pos.end());
    targs.kw = a.kw;
    if (!have_test(test)) return in.error("No test named '%s'.", test.c_str());
  }
  List out;
  for (const Value& item : items) {
    KILN_TRY(in.step());
    Value subject = item;
    if (use_attr) {
      KILN_ASSIGN_OR_RETURN(subject, attr_path(in, item, attr));
    }
    bool r;
    if (test.empty()) {
      r = subject.truthy();
    } else {
      CallArgs copy = targs;
      KILN_ASSIGN_OR_RETURN(r, in.apply_test(test, subject, copy));
    }
    if (r == want) out.push_back(item);
  }
  return gen(std::move(out));
}

Result<Value> do_map(Interp& in, const Value& seq, CallArgs& a) {
  if (!seq.truthy()) return gen({});  // jinja2: `if value:` guards the loop
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(seq));
  List out;
  if (const Value* attr = a.get(SIZE_MAX, "attribute")) {
    if (!a.pos.empty()) return in.error("map: positional arguments cannot be combined with attribute=");
    const Value* def = a.get(SIZE_MAX, "default");
    for (const Value& item : items) {
      KILN_TRY(in.step());
      KILN_ASSIGN_OR_RETURN(Value v, attr_path(in, item, to_str(*attr)));
      if (v.is_undefined() && def) v = *def;
      out.push_back(std::move(v));
    }
    return gen(std::move(out));
  }
  if (a.pos.empty()) return in.error("map requires a filter argument");
  const std::string f = to_str(a.pos[0]);
  if (!have_filter(f)) return in.error("No filter named '%s'.", f.c_str());
  CallArgs fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const Value& item : items) {
    KILN_TRY(in.step());
    CallArgs copy = fargs;
    KILN_ASSIGN_OR_RETURN(Value v, in.apply_filter(f, item, copy));
    out.push_back(std::move(v));
  }
  return gen(std::move(out));
}

Result<Value> min_max(Interp& in, const Value& seq, CallArgs& a, bool want_max) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(seq));
  static const Value kFalse = Value::boolean(false), kNone = Value::none();
  const bool cs = arg_or(a, 0, "case_sensitive", kFalse).truthy();
  const Value& attr = arg_or(a, 1, "attribute", kNone);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  Value best, best_key;
  bool first = true;
  for (const Value& it : items) {
    Value k = it;
    if (!attr.is_none()) {
      KILN_ASSIGN_OR_RETURN(k, attr_path(in, it, to_str(attr)));
    }
    k = lower_if_str(k, cs);
    if (first) {
      best = it;
      best_key = k;
      first = false;
      continue;
    }
    KILN_ASSIGN_OR_RETURN(int c, compare(k, best_key));
    if (want_max ? c > 0 : c < 0) {
      best = it;
      best_key = k;
    }
  }
  return best;
}

Result<Value> do_round(Interp& in, const Value& v, CallArgs& a) {
  static const Value kZero = Value::integer(0), kCommon = Value::string("common");
  const Value& prec = arg_or(a, 0, "precision", kZero);
  const std::string method = to_str(arg_or(a, 1, "method", kCommon));
  if (!v.is_number()) return in.error("type %s doesn't define __round__ method", v.type_name().c_str());
  if (!prec.is_int() && !prec.is_bool()) return in.error("round: precision must be an integer");
  const int64_t p = std::clamp<int64_t>(prec.as_int(), -300, 300);
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());  // round(int, n) stays an int
    const double x = v.as_float();
    if (!std::isfinite(x)) return Value::number(x);
    if (p >= 0) {
      // Python rounds the exact binary value, half to even: printf's correctly rounded %.*f does the same.
      return Value::number(std::strtod(strprintf("%.*f", static_cast<int>(p), x).c_str(), nullptr));
    }
    const double m = std::pow(10.0, static_cast<double>(-p));
    return Value::number(std::nearbyint(x / m) * m);
  }
  if (method != "ceil" && method != "floor") return in.error("method must be 'common', 'ceil' or 'floor'");
  const double m = std::pow(10.0, static_cast<double>(p));
  const double x = v.as_float() * m;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / m);
}

std::string do_striptags(const std::string& s) {
  std::string t;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i + 4);
      if (e == std::string::npos) { t += s.substr(i); break; }
      i = e + 3;
    } else if (s[i] == '<') {
      const size_t e = s.find('>', i + 1);
      if (e == std::string::npos) { t += s.substr(i); break; }
      i = e + 1;
    } else {
      t += s[i++];
    }
  }
  // collapse whitespace, then unescape the common entities (markupsafe's striptags + unescape)
  std::string c;
  for (const auto& w : py_split(t, nullptr, -1)) {
    if (!c.empty()) c += ' ';
    c += w;
  }
  static const std::pair<const char*, const char*> ents[] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&#34;", "\""}, {"&#39;", "'"}, {"&#x27;", "'"}, {"&nbsp;", "\xc2\xa0"}};
  std::string out;
  for (size_t i = 0; i < c.size();) {
    bool hit = false;
    if (c[i] == '&')
      for (const auto& [e, r] : ents)
        if (c.compare(i, std::strlen(e), e) == 0) {
          out += r;
          i += std::strlen(e);
          hit = true;
          break;
        }
    if (!hit) out += c[i++];
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- filters

namespace {
const std::unordered_set<std::string>& filter_names() {
  // jinja2 3.1's builtin filters (all of them count as "known" at compile time, as in jinja2); the few kiln does
  // not implement fail when called, with a message saying so.
  static const std::unordered_set<std::string> names = {
      "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
      "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "items", "join",
      "last", "length", "list", "lower", "map", "max", "min", "pprint", "random", "reject", "rejectattr",
      "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort", "string", "striptags", "sum",
      "title", "tojson", "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap",
      "xmlattr"};
  return names;
}
const std::unordered_set<std::string>& test_names() {
  static const std::unordered_set<std::string> names = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
      "float", "ge", "gt", "greaterthan", "in", "integer", "iterable", "le", "lessthan", "lower", "lt", "mapping",
      "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper"};
  return names;
}
}  // namespace

bool have_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool have_test(const std::string& name) { return test_names().count(name) > 0; }

Result<Value> Interp::apply_filter(const std::string& f, const Value& v, CallArgs& a) {
  KILN_TRY(step());
  static const std::string kComma = ",";
  static const Value kNone = Value::none(), kFalse = Value::boolean(false), kEmpty = Value::string("");
  // soft_str: strings (Markup too) as they are, everything else str()'d; Undefined -> "".
  auto sstr = [&]() { return v.is_string() ? v.str() : to_str(v); };
  if (f == "default" || f == "d") {
    const Value& def = arg_or(a, 0, "default_value", kEmpty);
    const bool boolean = arg_or(a, 1, "boolean", kFalse).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return def;
    return v;
  }
  if (f == "length" || f == "count") {
    KILN_ASSIGN_OR_RETURN(int64_t n, len_of(*this, v));
    return Value::integer(n);
  }
  if (f == "tojson") return do_tojson(*this, v, a);
  if (f == "trim") {
    const Value& chars = arg_or(a, 0, "chars", kNone);
    return Value::string(py_strip(sstr(), chars.is_none() ? nullptr : &chars.str(), true, true), v.is_safe());
  }
  if (f == "upper") return Value::string(py_upper(sstr()), v.is_safe());
  if (f == "lower") return Value::string(py_lower(sstr()), v.is_safe());
  if (f == "capitalize") return Value::string(py_capitalize(sstr()), v.is_safe());
  if (f == "title") return Value::string(jinja_title(sstr()), v.is_safe());
  if (f == "string") return v.is_string() ? v : Value::string(to_str(v));
  if (f == "safe") return Value::string(sstr(), true);
  if (f == "escape" || f == "e" || f == "forceescape") {
    if (v.is_safe() && f != "forceescape") return v;
    return Value::string(html_escape(sstr()), true);
  }
  if (f == "list") {
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    return Value::list(std::move(l));
  }
  if (f == "first") {
    if (v.kind() == Kind::kIterator) {
      auto* it = v.as<IteratorObj>();
      if (it->pos < it->items.size()) return it->items[it->pos++];
      return Value::undefined("No first item, sequence was empty.");
    }
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    if (l.empty()) return Value::undefined("No first item, sequence was empty.");
    return l.front();
  }
  if (f == "last") {
    if (v.kind() == Kind::kIterator || !(v.is_list() || v.is_string() || v.is_dict() || v.is_undefined()))
      return error("'%s' object is not reversible", v.type_name().c_str());
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    if (l.empty()) return Value::undefined("No last item, sequence was empty.");
    return l.back();
  }
  if (f == "join") {
    const Value& d = arg_or(a, 0, "d", kEmpty);
    const Value& attr = arg_or(a, 1, "attribute", kNone);
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    std::string out;
    const std::string sep = to_str(d);
    for (size_t i = 0; i < l.size(); ++i) {
      if (i) out += sep;
      if (!attr.is_none()) {
        KILN_ASSIGN_OR_RETURN(Value x, attr_path(*this, l[i], to_str(attr)));
        out += to_str(x);
      } else {
        out += to_str(l[i]);
      }
      KILN_TRY(check_string(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (f == "replace") {
    if (a.pos.size() < 2 && !(a.get(0, "old") && a.get(1, "new"))) return error("replace() needs old and new");
    const Value& count = arg_or(a, 2, "count", kNone);
    int64_t n = -1;
    if (count.is_int()) n = count.as_int();
    std::string out;
    KILN_TRY(py_replace(*this, sstr(), to_str(*a.get(0, "old")), to_str(*a.get(1, "new")), n, &out));
    return Value::string(std::move(out));
  }
  if (f == "int") {
    static const Value kZero = Value::integer(0), kTen = Value::integer(10);
    const Value& def = arg_or(a, 0, "default", kZero);
    const Value& base = arg_or(a, 1, "base", kTen);
    if (v.is_string()) {
      int64_t r;
      if (parse_py_int(v.str(), static_cast<int>(base.as_int()), &r)) return Value::integer(r);
      double d;
      if (parse_py_float(v.str(), &d)) {
        if (std::isnan(d)) return def;
        if (std::isinf(d) || std::fabs(d) >= 9.2e18) return error("cannot convert float infinity to integer");
        return Value::integer(static_cast<int64_t>(d));
      }
      return def;
    }
    if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
    if (v.is_float()) {
      const double d = v.as_float();
      if (std::isnan(d)) return def;
      if (std::isinf(d) || std::fabs(d) >= 9.2e18) return error("cannot convert float infinity to integer");
      return Value::integer(static_cast<int64_t>(d));
    }
    return def;
  }
  if (f == "float") {
    static const Value kZero = Value::number(0.0);
    const Value& def = arg_or(a, 0, "default", kZero);
    if (v.is_number()) return Value::number(v.as_float());
    if (v.is_string()) {
      double d;
      if (parse_py_float(v.str(), &d)) return Value::number(d);
    }
    return def;
  }
  if (f == "abs") {
    if (v.is_float()) return Value::number(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == INT64_MIN) return error("integer overflow");
      return Value::integer(std::llabs(v.as_int()));
    }
    return error("bad operand type for abs(): '%s'", v.type_name().c_str());
  }
  if (f == "round") return do_round(*this, v, a);
  if (f == "items") {
    if (v.is_undefined()) return gen({});
    if (!v.is_dict()) return error("Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, x] : v.dict().entries) out.push_back(Value::list({k, x}, true));
    return gen(std::move(out));
  }
  if (f == "dictsort") {
    const bool cs = arg_or(a, 0, "case_sensitive", kFalse).truthy();
    static const Value kKey = Value::string("key");
    const std::string by = to_str(arg_or(a, 1, "by", kKey));
    const bool rev = arg_or(a, 2, "reverse", kFalse).truthy();
    if (!v.is_dict()) return error("dictsort: expected a mapping, got %s", v.type_name().c_str());
    if (by != "key" && by != "value") return error("You can only sort by either \"key\" or \"value\"");
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& [k, x] : v.dict().entries)
      keyed.emplace_back(lower_if_str(by == "key" ? k : x, cs), Value::list({k, x}, true));
    KILN_TRY(sort_values(*this, &keyed, rev));
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value::list(std::move(out));
  }
  if (f == "sort") {
    const bool rev = arg_or(a, 0, "reverse", kFalse).truthy();
    const bool cs = arg_or(a, 1, "case_sensitive", kFalse).truthy();
    const Value& attr = arg_or(a, 2, "attribute", kNone);
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& x : l) {
      if (attr.is_none()) {
        keyed.emplace_back(lower_if_str(x, cs), x);
        continue;
      }
      // jinja2's make_multi_attrgetter: "a,b" sorts by a list of attributes (lists compare element-wise, ==
      // first, so missing attributes (Undefined == Undefined) keep the input order instead of failing).
      List parts;
      for (const auto& one : py_split(to_str(attr), &kComma, -1)) {
        KILN_ASSIGN_OR_RETURN(Value k, attr_path(*this, x, one));
        parts.push_back(lower_if_str(k, cs));
      }
      keyed.emplace_back(Value::list(std::move(parts)), x);
    }
    KILN_TRY(sort_values(*this, &keyed, rev));
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value::list(std::move(out));
  }
  if (f == "unique") {
    const bool cs = arg_or(a, 0, "case_sensitive", kFalse).truthy();
    const Value& attr = arg_or(a, 1, "attribute", kNone);
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    List seen, out;
    for (const Value& x : l) {
      KILN_TRY(step());
      Value k = x;
      if (!attr.is_none()) {
        KILN_ASSIGN_OR_RETURN(k, attr_path(*this, x, to_str(attr)));
      }
      k = lower_if_str(k, cs);
      if (k.is_list() && !k.is_tuple()) return error("unhashable type: 'list'");
      if (k.is_dict()) return error("unhashable type: 'dict'");
      bool dup = false;
      for (const Value& s : seen) dup |= equals(s, k);
      if (!dup) {
        seen.push_back(k);
        out.push_back(x);
      }
    }
    return gen(std::move(out));
  }
  if (f == "reverse") {
    if (v.is_string()) {
      auto cps = decode_utf8_all(v.str());
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8_encode(cps, 0, cps.size()), v.is_safe());
    }
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    std::reverse(l.begin(), l.end());
    if (v.is_list()) return gen(std::move(l), "list_reverseiterator");
    if (v.is_dict()) return gen(std::move(l), "dict_reversekeyiterator");
    return Value::list(std::move(l));  // not reversible: jinja2 falls back to a reversed list
  }
  if (f == "map") return do_map(*this, v, a);
  if (f == "select") return select_or_reject(*this, v, a, false, true);
  if (f == "reject") return select_or_reject(*this, v, a, false, false);
  if (f == "selectattr") return select_or_reject(*this, v, a, true, true);
  if (f == "rejectattr") return select_or_reject(*this, v, a, true, false);
  if (f == "min") return min_max(*this, v, a, false);
  if (f == "max") return min_max(*this, v, a, true);
  if (f == "sum") {
    const Value& attr = arg_or(a, 0, "attribute", kNone);
    static const Value kZero = Value::integer(0);
    Value acc = arg_or(a, 1, "start", kZero);
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    for (const Value& x : l) {
      Value item = x;
      if (!attr.is_none()) {
        KILN_ASSIGN_OR_RETURN(item, attr_path(*this, x, to_str(attr)));
      }
      KILN_ASSIGN_OR_RETURN(acc, binary_op(*this, "+", acc, item));
    }
    return acc;
  }
  if (f == "striptags") return Value::string(do_striptags(sstr()));
  if (f == "wordcount") return Value::integer(py_word_count(sstr()));
  if (f == "indent") return jinja_indent(*this, v, a);
  if (f == "center") {
    static const Value k80 = Value::integer(80);
    const Value& w = arg_or(a, 0, "width", k80);
    if (!w.is_int()) return error("center: width must be an integer");
    return Value::string(py_pad(sstr(), w.as_int(), ' ', 'c'));
  }
  if (f == "attr") {  // a Python attribute only: no fallback to dict keys (jinja2's do_attr)
    if (a.pos.empty()) return error("attr() needs a name");
    const std::string name = to_str(a.pos[0]);
    if (v.kind() == Kind::kNamespace || v.kind() == Kind::kObject || v.is_undefined()) return getattr(v, name);
    KILN_ASSIGN_OR_RETURN(Value m, builtin_attr(*this, v, name));
    if (!m.is_undefined() || !m.str().empty()) return m;
    return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
  }
  if (f == "format") {
    if (!a.kw.empty()) {
      Dict d;
      for (auto& [k, x] : a.kw) d.set(Value::string(k), x);
      return percent_format(*this, Value::string(sstr()), Value::dict(std::move(d)));
    }
    return percent_format(*this, Value::string(sstr()), Value::list(a.pos, true));
  }
  if (f == "batch") {
    if (a.pos.empty() || !a.pos[0].is_int() || a.pos[0].as_int() <= 0) return error("batch: linecount must be a positive integer");
    const size_t n = static_cast<size_t>(a.pos[0].as_int());
    const Value* fill = a.get(1, "fill_with");
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    List out, cur;
    for (const Value& x : l) {
      cur.push_back(x);
      if (cur.size() == n) {
        out.push_back(Value::list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (fill && !fill->is_none())
        while (cur.size() < n) cur.push_back(*fill);
      out.push_back(Value::list(std::move(cur)));
    }
    return gen(std::move(out));
  }
  if (f == "groupby") {  // sorted by the key, then grouped: a list of (grouper, list) tuples
    if (a.pos.empty() && !a.get(0, "attribute")) return error("groupby() needs an attribute");
    const std::string attr = to_str(*a.get(0, "attribute"));
    const Value* def = a.get(1, "default");
    const bool cs = arg_or(a, 2, "case_sensitive", kFalse).truthy();
    KILN_ASSIGN_OR_RETURN(List l, iterate(v));
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& x : l) {
      KILN_ASSIGN_OR_RETURN(Value k, attr_path(*this, x, attr));
      if (k.is_undefined() && def) k = *def;
      keyed.emplace_back(lower_if_str(k, cs), x);
    }
    KILN_TRY(sort_values(*this, &keyed, false));
    List out;
    for (size_t i = 0; i < keyed.size();) {
      size_t j = i;
      List group;
      while (j < keyed.size() && equals(keyed[j].first, keyed[i].first)) group.push_back(keyed[j++].second);
      Value grouper = keyed[i].first;
      if (!cs) {  // jinja2 reports the first item's own (not lowercased) key
        KILN_ASSIGN_OR_RETURN(grouper, attr_path(*this, group[0], attr));
        if (grouper.is_undefined() && def) grouper = *def;
      }
      out.push_back(Value::list({grouper, Value::list(std::move(group))}, true));
      i = j;
    }
    return Value::list(std::move(out));
  }
  if (f == "urlencode") {  // urllib.parse.quote(safe="/") per string; dicts/pairs as k=v&...
    auto quote = [](const std::string& x, bool for_pairs) {
      std::string o;
      for (unsigned char c : x) {
        if (std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (c == '/' && !for_pairs)) o += static_cast<char>(c);
        else o += strprintf("%%%02X", c);
      }
      return o;
    };
    if (v.is_string()) return Value::string(quote(v.str(), false));
    if (v.is_dict() || v.is_list()) {
      std::string o;
      List pairs;
      if (v.is_dict()) {
        for (const auto& [k, x] : v.dict().entries) pairs.push_back(Value::list({k, x}, true));
      } else {
        pairs = v.items();
      }
      for (const Value& pr : pairs) {
        if (!pr.is_list() || pr.items().size() != 2) return error("urlencode: expected (key, value) pairs");
        if (!o.empty()) o += "&";
        o += quote(to_str(pr.items()[0]), true) + "=" + quote(to_str(pr.items()[1]), true);
      }
      return Value::string(std::move(o));
    }
    return Value::string(quote(to_str(v), false));
  }
  return error("filter '%s' is not supported by kiln's template engine", f.c_str());
}

// ---------------------------------------------------------------- tests

Result<bool> Interp::apply_test(const std::string& t, const Value& v, CallArgs& a) {
  KILN_TRY(step());
  auto arg = [&](const char* name) -> Result<Value> {
    const Value* x = a.get(0, name);
    if (!x) return error("test '%s' needs an argument", t.c_str());
    return *x;
  };
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "boolean") return v.is_bool();
  if (t == "true") return v.is_bool() && v.as_bool();
  if (t == "false") return v.is_bool() && !v.as_bool();
  if (t == "integer") return v.is_int();
  if (t == "float") return v.is_float();
  if (t == "number") return v.is_number();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.is_dict();
  if (t == "callable") return v.kind() == Kind::kCallable;
  if (t == "escaped") return v.is_safe();
  // iter() works on: str, list, tuple, dict, generators, Undefined (empty)
  if (t == "iterable")
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.kind() == Kind::kIterator;
  // len() and __getitem__: str, list, tuple, dict, Undefined (its __len__ is 0 and __getitem__ exists)
  if (t == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (t == "lower" || t == "upper") {
    if (!v.is_string()) return false;
    return t == "lower" ? py_islower(v.str()) : py_isupper(v.str());
  }
  if (t == "odd" || t == "even" || t == "divisibleby") {
    Value d = Value::integer(2);
    if (t == "divisibleby") {
      KILN_ASSIGN_OR_RETURN(d, arg("num"));
    }
    KILN_ASSIGN_OR_RETURN(Value m, binary_op(*this, "%", v, d));
    const bool zero = m.is_float() ? m.as_float() == 0 : m.as_int() == 0;
    return t == "odd" ? !zero : zero;
  }
  if (t == "eq" || t == "equalto") {
    KILN_ASSIGN_OR_RETURN(Value o, arg("other"));
    return equals(v, o);
  }
  if (t == "ne") {
    KILN_ASSIGN_OR_RETURN(Value o, arg("other"));
    return !equals(v, o);
  }
  if (t == "lt" || t == "lessthan" || t == "le" || t == "gt" || t == "greaterthan" || t == "ge") {
    KILN_ASSIGN_OR_RETURN(Value o, arg("other"));
    KILN_ASSIGN_OR_RETURN(int c, compare(v, o));
    if (t == "lt" || t == "lessthan") return c < 0;
    if (t == "le") return c <= 0;
    if (t == "gt" || t == "greaterthan") return c > 0;
    return c >= 0;
  }
  if (t == "in") {
    KILN_ASSIGN_OR_RETURN(Value seq, arg("seq"));
    return contains(*this, seq, v);
  }
  if (t == "sameas") {
    KILN_ASSIGN_OR_RETURN(Value o, arg("other"));
    if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
    if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
    // CPython caches small ints, so `1 is 1`; beyond that identity is an implementation detail.
    if (v.is_int() && o.is_int()) return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    return v.obj() && v.obj() == o.obj();
  }
  if (t == "filter") return v.is_string() && have_filter(v.str());
  if (t == "test") return v.is_string() && have_test(v.str());
  return error("No test named '%s'.", t.c_str());
}

}  // namespace kiln::tpl

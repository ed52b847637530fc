#include "runtime/tool_grammar.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "grammar/grammar.h"

namespace kiln {

namespace {

using ojson = nlohmann::ordered_json;
using tpl::Pattern;
using tpl::Piece;
using tpl::Slot;
using tpl::ToolFormat;
using tpl::ValueSyntax;

constexpr int kMaxDepth = 16;  // nesting of Python / Gemma argument values

// A GBNF string literal for s (UTF-8 kept; quotes, backslashes and control characters escaped).
std::string lit(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// A format's literal with its whitespace optional: the template's whitespace is canonical, and templates of one
// family differ in it (GLM's newlines, Reka's calls without one between), so each run of whitespace may be written
// as the template writes it or left out. "" for an empty literal.
std::string flex(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    const bool ws = is_ws(s[i]);
    while (j < s.size() && is_ws(s[j]) == ws) ++j;
    out += (out.empty() ? "" : " ") + (ws ? "(" + lit(s.substr(i, j - i)) + ")?" : lit(s.substr(i, j - i)));
    i = j;
  }
  return out;
}

// The first run of non-whitespace of a literal: the text a raw value ends before.
std::string first_run(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n\t\r");
  if (b == std::string::npos) return {};
  const size_t e = s.find_first_of(" \n\t\r", b);
  return s.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i + static_cast<size_t>(k) < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

std::string cp_escape(uint32_t cp) {
  char b[16];
  std::snprintf(b, sizeof b, cp <= 0xFFFF ? "\\u%04X" : "\\U%08X", cp);
  return b;
}

// Python's repr of a string (single quotes, as Python writes them when the text has no quote of that kind).
std::string py_repr(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out + "'";
}

bool is_annotation(const std::string& k) {
  static const char* kWords[] = {"description", "title", "default", "examples", "$comment", "deprecated",
                                 "readOnly",    "writeOnly", "$schema", "$id"};
  for (const char* w : kWords)
    if (k == w) return true;
  return false;
}

class Builder {
 public:
  Builder(const ToolFormat& f, const ojson& tools, const ToolGrammarRequest& rq) : f_(f), tools_(tools), rq_(rq) {}

  Result<std::string> run() {
    if (rq_.names.empty()) return make_error(ErrorCode::kInvalidArgument, "tool_choice: no function to call");
    std::vector<std::string> calls, firsts;
    for (const std::string& name : rq_.names) {
      size_t k = 0;
      const ojson* fn = find(name, &k);
      if (!fn)
        return make_error(ErrorCode::kInvalidArgument, "tool_choice: 'tools' defines no function '%s'", name.c_str());
      KILN_ASSIGN_OR_RETURN(std::string c, call_rule(k, *fn, false));
      calls.push_back(c);
      if (rq_.opened_tool_call && f_.section.empty()) {
        KILN_ASSIGN_OR_RETURN(std::string c1, call_rule(k, *fn, true));
        firsts.push_back(c1);
      }
    }
    const std::string call = add("call", join(calls, " | "));
    const std::string first = firsts.empty() ? call : add("call-first", join(firsts, " | "));
    std::string calls_expr = first;
    if (rq_.parallel && f_.parallel)
      calls_expr += " (" + (f_.call_sep.empty() ? std::string() : flex(f_.call_sep) + " ") + call + ")*";
    std::string body = calls_expr;
    if (!f_.section.empty()) {
      std::vector<std::string> parts;
      for (size_t i = 0; i < f_.section.size(); ++i) {
        const Piece& x = f_.section[i];
        if (x.slot == Slot::kCalls) parts.push_back("(" + calls_expr + ")");
        else if (x.slot == Slot::kText && !(i == 0 && rq_.opened_tool_call)) parts.push_back(flex(x.text));
        else if (x.slot == Slot::kText && !rq_.opener_tail.empty()) parts.push_back(flex(rq_.opener_tail));
      }
      body = join(parts, " ");
    }
    std::string root = body;
    if (!rq_.think_end.empty()) {
      const std::string after = rq_.think_after.empty() ? "[ \\t\\r\\n]{0,8}" : lit(rq_.think_after);
      const std::string think = add("think", not_containing(rq_.think_end) + " " + lit(rq_.think_end) + " " + after);
      if (rq_.opened_reasoning) root = think + " " + body;
      else if (!rq_.think_begin.empty()) root = "(" + lit(rq_.think_begin) + " " + think + ")? " + body;
    }
    std::string out = "root ::= " + root + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    out += schema_rules_;
    return out;
  }

 private:
  static std::string join(const std::vector<std::string>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
    return s;
  }

  std::string add(const std::string& hint, const std::string& body) {
    const std::string name = "tc-" + hint + "-" + std::to_string(rules_.size());
    rules_.emplace_back(name, body);
    return name;
  }

  const ojson* find(const std::string& name, size_t* k) const {
    if (!tools_.is_array()) return nullptr;
    for (size_t i = 0; i < tools_.size(); ++i) {
      const ojson& t = tools_[i];
      if (t.is_object() && t.contains("function") && t["function"].is_object() && t["function"].contains("name") &&
          t["function"]["name"] == name) {
        *k = i;
        return &t["function"];
      }
    }
    return nullptr;
  }

  static std::string params_field(size_t k) { return "tools[" + std::to_string(k) + "].function.parameters"; }

  Status unsupported(size_t k, const std::string& ptr, const std::string& what) const {
    return make_error(ErrorCode::kInvalidArgument, "%s: %s: %s (the %s tool-call format)", params_field(k).c_str(),
                      ptr.empty() ? "/" : ptr.c_str(), what.c_str(), f_.name.c_str());
  }

  // The parameters schema of a function (none: no arguments).
  static ojson parameters(const ojson& fn) {
    if (fn.contains("parameters") && fn["parameters"].is_object()) return fn["parameters"];
    return ojson{{"type", "object"}, {"properties", ojson::object()}, {"additionalProperties", false}};
  }

  // A JSON value of `schema` (the JSON-schema compiler's rules, renamed apart); returns its root rule.
  Result<std::string> json_rule(size_t k, const ojson& schema, const std::string& ptr) {
    grammar::SchemaOptions o;
    o.rule_prefix = "s" + std::to_string(schema_count_++) + "-";
    auto g = grammar::json_schema_to_gbnf(schema, o);
    if (!g) {
      std::string m = g.status().message();
      if (!ptr.empty() && m.rfind("json schema: ", 0) == 0) m = "json schema: " + ptr + m.substr(12);
      return make_error(ErrorCode::kInvalidArgument, "%s: %s", params_field(k).c_str(), m.c_str());
    }
    schema_rules_ += *g;
    return o.rule_prefix + "root";
  }

  // Any text that does not contain c (it may end anywhere): a KMP automaton over code points, one rule per
  // state (the code points of c matched so far), so that c can never be spelled across several characters.
  std::string not_containing(const std::string& c) {
    auto it = not_containing_.find(c);
    if (it != not_containing_.end()) return it->second;
    const std::vector<uint32_t> cs = code_points(c);
    const size_t n = cs.size();
    // fail[i]: the longest proper border of cs[0, i)
    std::vector<size_t> fail(n + 1, 0);
    for (size_t i = 2; i <= n; ++i) {
      size_t j = fail[i - 1];
      while (j > 0 && cs[j] != cs[i - 1]) j = fail[j];
      if (cs[j] == cs[i - 1]) ++j;
      fail[i] = j;
    }
    const std::string base = "tc-nc" + std::to_string(not_containing_.size()) + "-";
    for (size_t i = 0; i < n; ++i) {
      // The code points with a transition from state i other than back to 0, and their targets.
      std::map<uint32_t, size_t> next;
      for (size_t j = i;; j = fail[j]) {  // the border chain of cs[0, i): the longest match wins
        if (!next.count(cs[j])) next[cs[j]] = j + 1;
        if (j == 0) break;
      }
      std::string body = "\"\"";
      std::string excluded;
      for (const auto& [cp, to] : next) {
        excluded += cp_escape(cp);
        if (to < n) body += " | " + lit_cp(cp) + " " + base + std::to_string(to);
      }
      body += " | [^" + excluded + "] " + base + "0";
      rules_.emplace_back(base + std::to_string(i), body);
    }
    const std::string name = base + "0";
    not_containing_[c] = name;
    return name;
  }

  static std::string lit_cp(uint32_t cp) { return "[" + cp_escape(cp) + "]"; }

  // One call of function k (index k of tools); skip_opener: the prompt wrote the call's first literal (but for
  // rq_.opener_tail, which the call may still write).
  Result<std::string> call_rule(size_t k, const ojson& fn, bool skip_opener) {
    const std::string name = fn["name"].get<std::string>();
    const ojson schema = parameters(fn);
    std::vector<std::string> parts;
    for (size_t i = 0; i < f_.call.size(); ++i) {
      const Piece& x = f_.call[i];
      switch (x.slot) {
        case Slot::kText:
          if (!(i == 0 && skip_opener)) parts.push_back(flex(x.text));
          else if (!rq_.opener_tail.empty()) parts.push_back(flex(rq_.opener_tail));
          break;
        case Slot::kName: parts.push_back(lit(name)); break;
        case Slot::kId: parts.push_back(id_rule()); break;
        case Slot::kIndex: parts.push_back("(\"0\" | [1-9] [0-9]{0,3})"); break;
        case Slot::kIndex1: parts.push_back("[1-9] [0-9]{0,3}"); break;
        case Slot::kArgs: {
          KILN_ASSIGN_OR_RETURN(std::string r, json_rule(k, schema, ""));
          parts.push_back(r);
          break;
        }
        case Slot::kJson: {
          KILN_ASSIGN_OR_RETURN(std::string r, json_rule(k, schema, ""));
          parts.push_back(json_call(name, r));
          break;
        }
        case Slot::kParams: {
          KILN_ASSIGN_OR_RETURN(std::string r, params_rule(k, schema));
          parts.push_back(r);
          break;
        }
        default:
          return make_error(ErrorCode::kInternal, "tool format %s: slot not allowed in a call", f_.name.c_str());
      }
    }
    return add("call", join(parts, " "));
  }

  std::string id_rule() const {
    switch (f_.ids) {
      case tpl::CallIds::kSolar: return "[a-z0-9]{10}";
      case tpl::CallIds::kMistral: return "[a-zA-Z0-9]{9}";
      case tpl::CallIds::kOpenAI: break;
    }
    return "\"call_\" [a-zA-Z0-9]{24}";
  }

  // {"name": "NAME", "arguments": ARGS} in the format's keys, as its template writes them (its spaces optional;
  // the two keys in either order, as JSON does not order them).
  std::string json_call(const std::string& name, const std::string& args) const {
    const tpl::JsonShape& sh = f_.json;
    const std::string qname = ojson(name).dump();
    if (sh.name_is_key) return lit("{" + qname) + " " + flex(": ") + " " + args + " " + lit("}");
    std::string s = lit("{");
    if (!sh.counter_key.empty()) s += " " + flex(ojson(sh.counter_key).dump() + ": \"") + " [0-9]{1,3} " + flex("\", ");
    const std::string n = flex(ojson(sh.name_key).dump() + ": ") + " " + lit(qname);
    const std::string a = flex(ojson(sh.args_key).dump() + ": ") + " " + args;
    s += " (" + n + " " + flex(", ") + " " + a + " | " + a + " " + flex(", ") + " " + n + ")";
    if (!sh.id_key.empty())  // the model's own call id, after the arguments (as Apriel's and Mistral's templates)
      s += " (" + flex(", " + ojson(sh.id_key).dump() + ": \"") + " " + id_rule() + " " + lit("\"") + ")?";
    return s + " " + lit("}");
  }

  // The parameters of function k: the declared properties (schema order, or key order), required ones always,
  // optional ones optionally, param_sep between.
  Result<std::string> params_rule(size_t k, const ojson& schema) {
    std::vector<std::pair<std::string, const ojson*>> props;
    if (schema.contains("properties") && schema["properties"].is_object())
      for (const auto& [key, s] : schema["properties"].items()) props.push_back({key, &s});
    if (f_.sorted_keys)
      std::sort(props.begin(), props.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<bool> required(props.size(), false);
    if (schema.contains("required") && schema["required"].is_array())
      for (const ojson& r : schema["required"])
        for (size_t j = 0; j < props.size(); ++j)
          if (r == props[j].first) required[j] = true;
    std::vector<std::string> p(props.size());
    for (size_t j = 0; j < props.size(); ++j) {
      KILN_ASSIGN_OR_RETURN(p[j], param_rule(k, props[j].first, *props[j].second));
    }
    // more[j]: the parameters from j on after at least one was written (each after a separator).
    const std::string sep = f_.param_sep.empty() ? "" : flex(f_.param_sep) + " ";
    std::vector<std::string> more(props.size() + 1);
    for (size_t j = props.size(); j-- > 0;) {
      const std::string one = sep + p[j];
      const std::string rest = more[j + 1];
      more[j] = required[j] ? one + (rest.empty() ? "" : " " + rest)
                            : "(" + one + ")?" + (rest.empty() ? "" : " " + rest);
      if (!more[j].empty()) more[j] = add("params-more", more[j]);
    }
    // first(j): none written yet.
    std::string first;
    for (size_t j = props.size(); j-- > 0;) {
      const std::string with = p[j] + (more[j + 1].empty() ? "" : " " + more[j + 1]);
      first = required[j] ? with : "(" + with + (first.empty() ? ")?" : " | " + first + ")");
      if (j > 0 && !first.empty()) first = add("params", first);
    }
    return first.empty() ? std::string("\"\"") : add("params", first);
  }

  // One parameter: the param pattern with its key, its value and what the format writes about the value.
  Result<std::string> param_rule(size_t k, const std::string& key, const ojson& s) {
    const std::string ptr = "/properties/" + key;
    const bool raw_string =
        f_.values == ValueSyntax::kRaw && s.is_object() && s.contains("type") && s["type"] == "string";
    std::vector<std::string> parts;
    for (size_t i = 0; i < f_.param.size(); ++i) {
      const Piece& x = f_.param[i];
      switch (x.slot) {
        case Slot::kText: parts.push_back(flex(x.text)); break;
        case Slot::kKey: parts.push_back(lit(key)); break;
        case Slot::kIsString: parts.push_back(lit(raw_string ? "true" : "false")); break;
        case Slot::kType: {
          KILN_ASSIGN_OR_RETURN(std::string t, type_name(k, s, ptr));
          parts.push_back(lit(t));
          break;
        }
        case Slot::kValue: {
          std::string v;
          if (f_.values != ValueSyntax::kRaw) {
            KILN_ASSIGN_OR_RETURN(v, dialect_value(k, s, ptr, 0));
          } else if (raw_string) {
            const std::string next = i + 1 < f_.param.size() && f_.param[i + 1].slot == Slot::kText
                                         ? first_run(f_.param[i + 1].text) : std::string();
            if (next.empty())
              return make_error(ErrorCode::kInternal, "tool format %s: a raw value needs a literal after it",
                                f_.name.c_str());
            KILN_ASSIGN_OR_RETURN(v, raw_string_rule(k, s, ptr, next));
          } else {
            KILN_ASSIGN_OR_RETURN(v, json_rule(k, s, ptr));
          }
          parts.push_back(v);
          break;
        }
        default:
          return make_error(ErrorCode::kInternal, "tool format %s: slot not allowed in a parameter", f_.name.c_str());
      }
    }
    return add("param", join(parts, " "));
  }

  // The JSON type name a format writes beside a value (Kimi K3's type="..."): the schema's one type.
  Result<std::string> type_name(size_t k, const ojson& s, const std::string& ptr) const {
    if (!s.is_object() || !s.contains("type") || !s["type"].is_string())
      return unsupported(k, ptr, "the format writes each value's type: the schema must give one 'type'");
    const std::string t = s["type"].get<std::string>();
    return t == "integer" ? std::string("number") : t;
  }

  // A string parameter written as raw text up to the literal `next`: its enum / const, or any text without next.
  Result<std::string> raw_string_rule(size_t k, const ojson& s, const std::string& ptr, const std::string& next) {
    for (const auto& [kw, v] : s.items()) {
      (void)v;
      if (kw == "type" || kw == "enum" || kw == "const" || is_annotation(kw)) continue;
      return unsupported(k, ptr + "/" + kw, "keyword '" + kw + "' cannot be enforced on a raw-text string parameter");
    }
    std::vector<std::string> alts;
    if (s.contains("const")) {
      if (!s["const"].is_string()) return unsupported(k, ptr + "/const", "a string parameter's const must be a string");
      alts.push_back(lit(s["const"].get<std::string>()));
    } else if (s.contains("enum")) {
      if (!s["enum"].is_array()) return unsupported(k, ptr + "/enum", "enum must be an array");
      for (const ojson& e : s["enum"])
        if (e.is_string()) alts.push_back(lit(e.get<std::string>()));
      if (alts.empty()) return unsupported(k, ptr + "/enum", "a string parameter's enum holds no string");
    }
    if (!alts.empty()) return "(" + join(alts, " | ") + ")";
    return not_containing(next);
  }

  // ---- Python / Gemma values

  bool python() const { return f_.values == ValueSyntax::kPython; }

  std::string str_literal(const std::string& v) const {
    return python() ? lit(py_repr(v)) : lit("<|\"|>" + v + "<|\"|>");
  }

  std::string scalar_literal(const ojson& v) const {
    if (v.is_string()) return str_literal(v.get<std::string>());
    if (v.is_boolean()) return lit(v.get<bool>() ? (python() ? "True" : "true") : (python() ? "False" : "false"));
    if (v.is_null()) return lit("None");
    return lit(v.dump());
  }

  std::string prim(const std::string& what) {
    auto it = prims_.find(what);
    if (it != prims_.end()) return it->second;
    std::string body;
    if (what == "string") {
      body = python() ? R"("'" ([^'\\\x00-\x1F] | "\\" ["'\\nrt])* "'")"
                      : lit("<|\"|>") + " " + not_containing("<|\"|>") + " " + lit("<|\"|>");
    } else if (what == "integer") {
      body = R"("-"? ("0" | [1-9] [0-9]{0,15}))";
    } else if (what == "number") {
      body = R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)";
    } else if (what == "boolean") {
      body = python() ? R"("True" | "False")" : R"("true" | "false")";
    } else if (what == "null") {
      body = R"("None")";
    } else if (what == "value") {  // any value: defined before its body refers back to it
      const std::string name = "tc-any-" + std::to_string(rules_.size());
      prims_[what] = name;
      rules_.emplace_back(name, "");
      const size_t at = rules_.size() - 1;
      const std::string sep = python() ? "\", \"" : "\",\"";
      const std::string key = python() ? prim("string") : "[A-Za-z_] [A-Za-z0-9_]{0,63}";
      const std::string colon = python() ? "\": \"" : "\":\"";
      const std::string str = prim("string"), num = prim("number"), b = prim("boolean"), nul = prim("null");
      rules_[at].second = str + " | " + num + " | " + b + " | " + nul + " | \"[\" (" + name + " (" + sep + " " +
                          name + ")*)? \"]\" | \"{\" (" + key + " " + colon + " " + name + " (" + sep + " " + key +
                          " " + colon + " " + name + ")*)? \"}\"";
      return name;
    }
    const std::string name = add(what, body);
    prims_[what] = name;
    return name;
  }

  // A value of schema s in the Python / Gemma syntax.
  Result<std::string> dialect_value(size_t k, const ojson& s, const std::string& ptr, int depth) {
    if (depth > kMaxDepth) return unsupported(k, ptr, "the schema nests too deep");
    if (s.is_boolean()) {
      if (s.get<bool>()) return prim("value");
      return unsupported(k, ptr, "schema false allows no value");
    }
    if (!s.is_object()) return unsupported(k, ptr, "a schema must be an object or a boolean");
    // Numbers are written as JSON writes them: the JSON-schema compiler enforces every numeric keyword.
    if (s.contains("type") && (s["type"] == "integer" || s["type"] == "number") && !s.contains("enum") &&
        !s.contains("const"))
      return json_rule(k, s, ptr);
    static const char* kOk[] = {"type", "enum", "const", "anyOf", "oneOf", "properties", "required", "items",
                                "additionalProperties"};
    for (const auto& [kw, v] : s.items()) {
      (void)v;
      bool ok = is_annotation(kw);
      for (const char* w : kOk) ok = ok || kw == w;
      if (!ok) return unsupported(k, ptr + "/" + kw, "keyword '" + kw + "' is not supported in this call syntax");
    }
    if (s.contains("const")) return scalar_or_error(k, s["const"], ptr + "/const");
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty())
        return unsupported(k, ptr + "/enum", "enum must be a non-empty array");
      std::vector<std::string> alts;
      for (const ojson& e : s["enum"]) {
        KILN_ASSIGN_OR_RETURN(std::string a, scalar_or_error(k, e, ptr + "/enum"));
        alts.push_back(a);
      }
      return "(" + join(alts, " | ") + ")";
    }
    for (const char* w : {"anyOf", "oneOf"}) {
      if (!s.contains(w)) continue;
      if (!s[w].is_array() || s[w].empty())
        return unsupported(k, ptr + "/" + w, std::string(w) + " must be a non-empty array");
      std::vector<std::string> alts;
      for (size_t i = 0; i < s[w].size(); ++i) {
        const std::string pi = ptr + "/" + w + "/" + std::to_string(i);
        KILN_ASSIGN_OR_RETURN(std::string a, dialect_value(k, s[w][i], pi, depth + 1));
        alts.push_back(a);
      }
      return "(" + join(alts, " | ") + ")";
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
      else if (s["type"].is_array())
        for (const ojson& t : s["type"])
          if (t.is_string()) types.push_back(t.get<std::string>());
    } else if (s.contains("properties")) {
      types.push_back("object");
    } else if (s.contains("items")) {
      types.push_back("array");
    } else {
      return prim("value");
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      if (t == "string" || t == "integer" || t == "number" || t == "boolean" || t == "null") {
        alts.push_back(prim(t));
      } else if (t == "array") {
        std::string item = prim("value");
        if (s.contains("items")) {
          KILN_ASSIGN_OR_RETURN(item, dialect_value(k, s["items"], ptr + "/items", depth + 1));
        }
        const std::string sep = python() ? lit(", ") : lit(",");
        alts.push_back(add("list", "\"[\" (" + item + " (" + sep + " " + item + ")*)? \"]\""));
      } else if (t == "object") {
        KILN_ASSIGN_OR_RETURN(std::string o, dialect_object(k, s, ptr, depth));
        alts.push_back(o);
      } else {
        return unsupported(k, ptr + "/type", "unknown type '" + t + "'");
      }
    }
    if (alts.empty()) return unsupported(k, ptr + "/type", "no type");
    return alts.size() == 1 ? alts[0] : "(" + join(alts, " | ") + ")";
  }

  Result<std::string> scalar_or_error(size_t k, const ojson& v, const std::string& ptr) const {
    if (v.is_object() || v.is_array()) return unsupported(k, ptr, "only scalar enum / const values are supported");
    return scalar_literal(v);
  }

  // A dict of the declared properties (required ones always, optional ones optionally, in order).
  Result<std::string> dialect_object(size_t k, const ojson& s, const std::string& ptr, int depth) {
    std::vector<std::pair<std::string, const ojson*>> props;
    if (s.contains("properties") && s["properties"].is_object())
      for (const auto& [key, v] : s["properties"].items()) props.push_back({key, &v});
    if (!python())  // Gemma writes a mapping's keys sorted
      std::sort(props.begin(), props.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> members;
    std::vector<bool> req;
    for (const auto& [key, v] : props) {
      KILN_ASSIGN_OR_RETURN(std::string val, dialect_value(k, *v, ptr + "/properties/" + key, depth + 1));
      const std::string kl = python() ? lit(py_repr(key) + ": ") : lit(key + ":");
      members.push_back(kl + " " + val);
      bool r = false;
      if (s.contains("required") && s["required"].is_array())
        for (const ojson& x : s["required"]) r = r || x == key;
      req.push_back(r);
    }
    const std::string sep = python() ? lit(", ") : lit(",");
    std::vector<std::string> more(members.size() + 1);
    for (size_t j = members.size(); j-- > 0;) {
      const std::string one = sep + " " + members[j];
      more[j] = (req[j] ? one : "(" + one + ")?") + (more[j + 1].empty() ? "" : " " + more[j + 1]);
      more[j] = add("dict-more", more[j]);
    }
    std::string first;
    for (size_t j = members.size(); j-- > 0;) {
      const std::string with = members[j] + (more[j + 1].empty() ? "" : " " + more[j + 1]);
      first = req[j] ? with : "(" + with + (first.empty() ? ")?" : " | " + first + ")");
      first = add("dict", first);
    }
    return add("dict", "\"{\" " + (first.empty() ? std::string() : first + " ") + "\"}\"");
  }

  const ToolFormat& f_;
  const ojson& tools_;
  const ToolGrammarRequest& rq_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::string schema_rules_;
  size_t schema_count_ = 0;
  std::map<std::string, std::string> not_containing_, prims_;
};

}  // namespace

Result<std::string> tool_call_gbnf(const tpl::ToolFormat& f, const nlohmann::ordered_json& tools,
                                   const ToolGrammarRequest& rq) {
  return Builder(f, tools, rq).run();
}

}  // namespace kiln

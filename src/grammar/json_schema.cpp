// JSON schema -> GBNF. Each schema node becomes a rule (small ones are inlined again by the automaton); $ref
// targets are rules named before their bodies are written, so recursive schemas work. Every keyword is either
// enforced or refused with an error naming it and its JSON pointer: nothing is silently ignored except the
// annotations listed in kAnnotations. docs/GRAMMAR.md lists what is supported.
//
// Layout of the generated text: primitive rules (ws, string, number, ...) are written once on first use; objects
// are "{" ws members "}" where every member ends with ws and members are separated by "," ws, so whitespace
// never appears twice in a row (two adjacent optional ws would make every space ambiguous).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_numbers.h"
#include "grammar/regex.h"
#include "grammar/utf8.h"

namespace kiln::grammar {

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string> kAnnotations = {"$schema", "$id", "$comment", "$anchor", "title", "description",
                                            "default", "examples", "deprecated", "readOnly", "writeOnly",
                                            "$defs", "definitions", "contentMediaType", "contentEncoding"};
const std::set<std::string> kKeywords = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "uniqueItems", "minProperties",
    "maxProperties"};
const std::set<std::string> kObjectWords = {"properties", "required", "additionalProperties", "minProperties",
                                            "maxProperties"};
const std::set<std::string> kArrayWords = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                           "uniqueItems"};
const std::set<std::string> kStringWords = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberWords = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::vector<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};

const char* kHex4 = "([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2})";

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A GBNF literal holding the bytes of `s` (valid UTF-8 from the JSON parser).
std::string literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += strprintf("\\x%02X", c);
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string rule_hint(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    out += word ? c : '-';
  }
  if (out.size() > 40) out.resize(40);
  return out.empty() ? "x" : out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const ojson& root, const SchemaOptions& options, const Limits& limits)
      : root_(root), options_(options), limits_(limits) {
    for (const char* p : {"root", "ws", "value", "object", "array", "string", "char", "number", "integer",
                          "boolean", "null", "kchar"})
      names_.insert(p);
  }

  Result<std::string> run() {
    const std::string top = visit(root_, "", 0, "root-v");
    if (!ok_) return status_;
    std::string out = "root ::= " + top + " " + prim("ws") + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    if (out.size() > limits_.max_text_bytes)
      return make_error(ErrorCode::kInvalidArgument, "json schema: the grammar would be %zu bytes (limit %zu)",
                        out.size(), limits_.max_text_bytes);
    return out;
  }

  std::string prim(const std::string& name) {
    if (defined_.count(name)) return name;
    defined_.insert(name);
    if (name == "ws") {
      rules_.push_back({name, options_.allow_whitespace ? R"(| " " | "\n"{1,2} [ \t]{0,20})" : "\"\""});
    } else if (name == "char") {
      rules_.push_back({name, std::string(R"([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" )") + kHex4 + ")"});
    } else if (name == "kchar") {
      rules_.push_back({name, R"([^"\\\x7F\x00-\x1F])"});
    } else if (name == "string") {
      rules_.push_back({name, "\"\\\"\" " + prim("char") + "* \"\\\"\""});
    } else if (name == "number") {
      rules_.push_back({name, R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)"});
    } else if (name == "integer") {
      rules_.push_back({name, R"("-"? ("0" | [1-9] [0-9]{0,15}))"});
    } else if (name == "boolean") {
      rules_.push_back({name, R"("true" | "false")"});
    } else if (name == "null") {
      rules_.push_back({name, R"("null")"});
    } else if (name == "value") {
      rules_.push_back({name, ""});
      const size_t at = rules_.size() - 1;
      rules_[at].second = prim("object") + " | " + prim("array") + " | " + prim("string") + " | " + prim("number") +
                          " | " + prim("boolean") + " | " + prim("null");
    } else if (name == "object") {
      rules_.push_back({name, ""});
      const size_t at = rules_.size() - 1;
      const std::string ws = prim("ws"), kv = prim("string") + " " + ws + " \":\" " + ws + " value " + ws;
      prim("value");
      rules_[at].second = "\"{\" " + ws + " (" + kv + " (\",\" " + ws + " " + kv + ")*)? \"}\"";
    } else if (name == "array") {
      rules_.push_back({name, ""});
      const size_t at = rules_.size() - 1;
      const std::string ws = prim("ws");
      prim("value");
      rules_[at].second = "\"[\" " + ws + " (value " + ws + " (\",\" " + ws + " value " + ws + ")*)? \"]\"";
    }
    return name;
  }

 private:
  void fail(const std::string& ptr, const std::string& what) {
    if (!ok_) return;
    ok_ = false;
    status_ = Status(ErrorCode::kInvalidArgument,
                     strprintf("json schema: %s: %s", ptr.empty() ? "/" : ptr.c_str(), what.c_str()));
  }

  std::string new_name(const std::string& hint) {
    std::string base = rule_hint(hint), name = base;
    for (int i = 2; names_.count(name); ++i) name = base + "-" + std::to_string(i);
    names_.insert(name);
    return name;
  }

  std::string add_rule(const std::string& hint, const std::string& body) {
    if (rules_.size() >= limits_.max_rules) {
      fail("", strprintf("more than %u rules", limits_.max_rules));
      return "null";
    }
    const std::string name = new_name(hint);
    rules_.push_back({name, body});
    return name;
  }

  const ojson* resolve(const std::string& ref, const std::string& ptr) {
    if (ref.empty() || ref[0] != '#') {
      fail(ptr + "/$ref", "only local references (\"#...\") are supported, not '" + ref + "'");
      return nullptr;
    }
    const ojson* cur = &root_;
    size_t i = 1;
    if (i < ref.size() && ref[i] != '/') {
      fail(ptr + "/$ref", "reference '" + ref + "' is not a JSON pointer");
      return nullptr;
    }
    while (i < ref.size()) {
      size_t j = ref.find('/', i + 1);
      if (j == std::string::npos) j = ref.size();
      std::string tok;
      for (size_t k = i + 1; k < j; ++k) {
        if (ref[k] == '~' && k + 1 < j && (ref[k + 1] == '0' || ref[k + 1] == '1')) {
          tok += ref[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          tok += ref[k];
        }
      }
      if (cur->is_object() && cur->contains(tok)) {
        cur = &(*cur)[tok];
      } else if (cur->is_array() && !tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos &&
                 tok.size() < 9 && std::stoul(tok) < cur->size()) {
        cur = &(*cur)[std::stoul(tok)];
      } else {
        fail(ptr + "/$ref", "reference '" + ref + "' does not resolve");
        return nullptr;
      }
      i = j;
    }
    return cur;
  }

  std::string ref_rule(const std::string& ref, const std::string& ptr, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    const ojson* target = resolve(ref, ptr);
    if (!target) return "null";
    const std::string name = new_name("ref-" + ref.substr(ref.find_last_of('/') + 1));
    ref_rules_[ref] = name;
    // The body comes after the name exists, so a reference back to it inside is a plain rule reference.
    rules_.push_back({name, ""});
    const size_t at = rules_.size() - 1;
    rules_[at].second = visit(*target, ref.substr(1), depth + 1, name + "-v");
    return name;
  }

  static bool has_any(const ojson& s, const std::set<std::string>& words) {
    for (const auto& [k, v] : s.items())
      if (words.count(k)) return true;
    return false;
  }

  // The only keywords beside `word` are annotations: `word` decides alone.
  bool alone(const ojson& s, const std::string& word, const std::string& ptr) {
    for (const auto& [k, v] : s.items()) {
      if (k == word || kAnnotations.count(k)) continue;
      fail(ptr + "/" + pointer_token(k), "keyword '" + k + "' beside '" + word + "' is not supported");
      return false;
    }
    return true;
  }

  std::string visit(const ojson& s, const std::string& ptr, int depth, const std::string& hint);
  std::string visit_typed(const ojson& s, const std::string& type, const std::string& ptr, int depth,
                          const std::string& hint);
  std::string visit_object(const ojson& s, const std::string& ptr, int depth, const std::string& hint);
  std::string visit_array(const ojson& s, const std::string& ptr, int depth, const std::string& hint);
  std::string visit_string(const ojson& s, const std::string& ptr);
  std::string visit_number(const ojson& s, bool integer, const std::string& ptr);
  std::string not_names(const std::vector<std::string>& names, const std::string& hint);
  bool count_keyword(const ojson& s, const char* key, const std::string& ptr, uint32_t* out);
  ojson merge_all_of(const ojson& s, const std::string& ptr, int depth);
  bool merge_into(ojson& into, const ojson& from, const std::string& ptr, int depth);

  const ojson& root_;
  SchemaOptions options_;
  Limits limits_;
  bool ok_ = true;
  Status status_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> names_, defined_;
  std::map<std::string, std::string> ref_rules_;
};

std::string SchemaCompiler::visit(const ojson& s, const std::string& ptr, int depth, const std::string& hint) {
  if (!ok_) return "null";
  if (depth > limits_.max_nesting) {
    fail(ptr, strprintf("schemas nested deeper than %d", limits_.max_nesting));
    return "null";
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return prim("value");
    fail(ptr, "the schema 'false' matches nothing");
    return "null";
  }
  if (!s.is_object()) {
    fail(ptr, "a schema must be an object or a boolean");
    return "null";
  }
  for (const auto& [k, v] : s.items()) {
    if (kKeywords.count(k) || kAnnotations.count(k)) continue;
    fail(ptr + "/" + pointer_token(k), "keyword '" + k + "' is not supported");
    return "null";
  }
  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) {
      fail(ptr + "/$ref", "must be a string");
      return "null";
    }
    if (!alone(s, "$ref", ptr)) return "null";
    return ref_rule(s["$ref"].get<std::string>(), ptr, depth);
  }
  if (s.contains("allOf")) {
    const ojson merged = merge_all_of(s, ptr, depth);
    if (!ok_) return "null";
    return visit(merged, ptr, depth + 1, hint);
  }
  for (const char* word : {"anyOf", "oneOf"}) {
    if (!s.contains(word)) continue;
    const ojson& alts = s[word];
    if (!alone(s, word, ptr)) return "null";
    if (!alts.is_array() || alts.empty()) {
      fail(ptr + "/" + word, "must be a non-empty array of schemas");
      return "null";
    }
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i) {
      const std::string r = visit(alts[i], ptr + "/" + word + "/" + std::to_string(i), depth + 1,
                                  hint + "-" + std::to_string(i));
      body += (i ? " | " : "") + r;
    }
    return add_rule(hint, body);
  }
  // The types this schema allows: "type", else the types whose keywords appear, else any value.
  std::vector<std::string> types;
  if (s.contains("type")) {
    const ojson& t = s["type"];
    const auto add = [&](const ojson& v, const std::string& p) {
      if (!v.is_string() || std::find(kTypes.begin(), kTypes.end(), v.get<std::string>()) == kTypes.end()) {
        fail(p, "unknown type " + v.dump());
        return;
      }
      types.push_back(v.get<std::string>());
    };
    if (t.is_array()) {
      for (size_t i = 0; i < t.size(); ++i) add(t[i], ptr + "/type/" + std::to_string(i));
      if (t.empty()) fail(ptr + "/type", "an empty list of types matches nothing");
    } else {
      add(t, ptr + "/type");
    }
    if (!ok_) return "null";
    // "integer" is inside "number": listing both adds nothing.
    if (std::count(types.begin(), types.end(), "number"))
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
  }
  if (s.contains("const") || s.contains("enum")) {
    // The listed values decide; other keywords could rule some of them out, which is not checked here.
    for (const auto& [k, v] : s.items()) {
      if (k == "const" || k == "enum" || k == "type" || kAnnotations.count(k)) continue;
      fail(ptr + "/" + pointer_token(k), "keyword '" + k + "' beside enum / const is not supported");
      return "null";
    }
    std::vector<const ojson*> values;
    if (s.contains("const")) {
      values.push_back(&s["const"]);
    } else if (!s["enum"].is_array() || s["enum"].empty()) {
      fail(ptr + "/enum", "must be a non-empty array");
      return "null";
    } else {
      for (const ojson& v : s["enum"]) values.push_back(&v);
    }
    std::string body;
    for (const ojson* v : values) {
      // With "type" beside, only the values of those types can validate.
      if (!types.empty()) {
        std::string vt = v->is_object() ? "object" : v->is_array() ? "array" : v->is_string() ? "string"
                       : v->is_boolean() ? "boolean" : v->is_null() ? "null" : "number";
        const bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                              (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
        const bool ok = std::count(types.begin(), types.end(), vt) ||
                        (vt == "number" && integral && std::count(types.begin(), types.end(), "integer"));
        if (!ok) continue;
      }
      body += (body.empty() ? "" : " | ") + literal(v->dump());
    }
    if (body.empty()) {
      fail(ptr + (s.contains("const") ? "/const" : "/enum"), "no value has the schema's type");
      return "null";
    }
    return add_rule(hint, body);
  }
  if (types.empty()) {
    if (has_any(s, kObjectWords)) types.push_back("object");
    if (has_any(s, kArrayWords)) types.push_back("array");
    if (has_any(s, kStringWords)) types.push_back("string");
    if (has_any(s, kNumberWords)) types.push_back("number");
    if (types.empty()) return prim("value");
  }
  std::string body;
  for (const std::string& t : types) {
    const std::string r = visit_typed(s, t, ptr, depth, hint + "-" + t);
    if (!ok_) return "null";
    body += (body.empty() ? "" : " | ") + r;
  }
  return types.size() == 1 ? body : add_rule(hint, body);
}

std::string SchemaCompiler::visit_typed(const ojson& s, const std::string& type, const std::string& ptr, int depth,
                                        const std::string& hint) {
  if (type == "object") return visit_object(s, ptr, depth, hint);
  if (type == "array") return visit_array(s, ptr, depth, hint);
  if (type == "string") return visit_string(s, ptr);
  if (type == "number" || type == "integer") return visit_number(s, type == "integer", ptr);
  return prim(type);  // boolean, null
}

bool SchemaCompiler::count_keyword(const ojson& s, const char* key, const std::string& ptr, uint32_t* out) {
  if (!s.contains(key)) return false;
  const ojson& v = s[key];
  const bool integral = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0) ||
                        (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>());
  if (!integral) {
    fail(ptr + "/" + key, "must be a non-negative integer");
    return false;
  }
  const double d = v.get<double>();
  if (d > limits_.max_repeat) {
    fail(ptr + "/" + key, strprintf("%s above %u is not supported", key, limits_.max_repeat));
    return false;
  }
  *out = static_cast<uint32_t>(d);
  return true;
}

// Keys that are none of `names`, written without escapes (so that no spelling of a declared name slips through).
// One rule per node of the names' trie: at each node the key may end (unless a name ends there), continue with a
// character no name continues with (then anything), or follow a name's next character.
std::string SchemaCompiler::not_names(const std::vector<std::string>& names, const std::string& hint) {
  struct Node {
    std::map<uint32_t, int> kids;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& n : names) {
    int cur = 0;
    for (size_t i = 0; i < n.size();) {
      uint32_t cp;
      const size_t len = decode_utf8(std::string_view(n).substr(i), &cp);
      if (len == 0) break;
      i += len;
      auto it = trie[cur].kids.find(cp);
      if (it == trie[cur].kids.end()) {
        trie.push_back({});
        it = trie[cur].kids.emplace(cp, static_cast<int>(trie.size() - 1)).first;
      }
      cur = it->second;
    }
    trie[cur].terminal = true;
  }
  const std::string kchar = prim("kchar");
  std::vector<std::string> rule(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rule[i] = new_name(hint + "-k" + std::to_string(i));
  for (size_t i = 0; i < trie.size(); ++i) {
    std::string body;
    if (!trie[i].terminal) body = "\"\\\"\"";
    std::vector<CodeRange> other = {{'"', '"'}, {'\\', '\\'}, {0, 0x1F}, {0x7F, 0x7F}};
    for (const auto& [cp, k] : trie[i].kids) {
      std::string lit;
      append_utf8(cp, &lit);
      body += (body.empty() ? "" : " | ") + literal(lit) + " " + rule[k];
      other.push_back({cp, cp});
    }
    std::string cls = "[^";
    for (const CodeRange& r : normalize_ranges(other)) {
      const auto put = [&](uint32_t c) {
        if (c == '"' || c == '\\' || c == ']' || c == '[' || c == '-') cls += "\\" + std::string(1, static_cast<char>(c));
        else if (c < 0x20 || c == 0x7F) cls += strprintf("\\x%02X", c);
        else append_utf8(c, &cls);
      };
      put(r.lo);
      if (r.hi != r.lo) {
        cls += "-";
        put(r.hi);
      }
    }
    cls += "]";
    body += (body.empty() ? "" : " | ") + cls + " " + kchar + "* \"\\\"\"";
    rules_.push_back({rule[i], body});
  }
  return "\"\\\"\" " + rule[0];
}

std::string SchemaCompiler::visit_object(const ojson& s, const std::string& ptr, int depth, const std::string& hint) {
  struct Prop {
    std::string name, rule;
    bool required;
  };
  std::vector<Prop> props;
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) {
      fail(ptr + "/required", "must be an array of strings");
      return "null";
    }
    for (const ojson& r : s["required"]) {
      if (!r.is_string()) {
        fail(ptr + "/required", "must be an array of strings");
        return "null";
      }
      required.insert(r.get<std::string>());
    }
  }
  // additionalProperties: absent or true = any value, false = none, a schema = values of that schema.
  std::string extra = prim("value");
  if (s.contains("additionalProperties")) {
    const ojson& a = s["additionalProperties"];
    if (a.is_boolean() && !a.get<bool>()) {
      extra.clear();
    } else {
      extra = visit(a, ptr + "/additionalProperties", depth + 1, hint + "-additional");
    }
  }
  if (s.contains("properties")) {
    if (!s["properties"].is_object()) {
      fail(ptr + "/properties", "must be an object");
      return "null";
    }
    for (const auto& [name, sub] : s["properties"].items()) {
      const std::string r =
          visit(sub, ptr + "/properties/" + pointer_token(name), depth + 1, hint + "-" + name);
      if (!ok_) return "null";
      props.push_back({name, r, required.count(name) > 0});
    }
  }
  // Required names without a "properties" entry take additionalProperties' schema.
  for (const std::string& r : required) {
    if (std::any_of(props.begin(), props.end(), [&](const Prop& p) { return p.name == r; })) continue;
    if (extra.empty()) {
      fail(ptr + "/required", "'" + r + "' is required but additionalProperties is false and it is not a property");
      return "null";
    }
    props.push_back({r, extra, true});
  }
  uint32_t min_props = 0, max_props = UINT32_MAX;
  const size_t n_required = static_cast<size_t>(std::count_if(props.begin(), props.end(), [](const Prop& p) { return p.required; }));
  if (count_keyword(s, "minProperties", ptr, &min_props) && min_props > n_required) {
    fail(ptr + "/minProperties", "only a minimum the required properties already meet is supported");
    return "null";
  }
  if (count_keyword(s, "maxProperties", ptr, &max_props) && (!extra.empty() || max_props < props.size())) {
    fail(ptr + "/maxProperties", "only a maximum that no object of the schema can exceed is supported");
    return "null";
  }
  if (!ok_) return "null";
  const std::string ws = prim("ws");
  // tail(i, first): the members from property i on; `first`: no member written yet (no comma before the next).
  const std::string base = new_name(hint);
  std::string extra_member;
  if (!extra.empty()) {
    std::vector<std::string> names;
    for (const Prop& p : props) names.push_back(p.name);
    const std::string key = props.empty() ? prim("string") : not_names(names, base);
    extra_member = key + " " + ws + " \":\" " + ws + " " + extra + " " + ws;
  }
  std::vector<std::string> tail_first(props.size() + 1), tail_more(props.size() + 1);
  for (size_t i = props.size() + 1; i-- > 0;) {
    for (int first = 0; first < 2; ++first) {
      const std::string sep = first ? "" : "\",\" " + ws + " ";
      std::string body;
      if (i == props.size()) {
        body = extra_member.empty()
                   ? "\"\""
                   : "(" + sep + extra_member + " (\",\" " + ws + " " + extra_member + ")*)?";
      } else {
        const Prop& p = props[i];
        const std::string member = sep + literal(nlohmann::json(p.name).dump()) + " " + ws + " \":\" " + ws + " " +
                                   p.rule + " " + ws + " " + tail_more[i + 1];
        body = p.required ? member : "(" + member + ") | " + (first ? tail_first[i + 1] : tail_more[i + 1]);
      }
      (first ? tail_first : tail_more)[i] = add_rule(base + "-t" + std::to_string(i) + (first ? "f" : ""), body);
    }
  }
  rules_.push_back({base, "\"{\" " + ws + " " + tail_first[0] + " \"}\""});
  return base;
}

std::string SchemaCompiler::visit_array(const ojson& s, const std::string& ptr, int depth, const std::string& hint) {
  std::vector<std::string> prefix;
  const ojson* rest = nullptr;
  std::string rest_ptr;
  bool rest_allowed = true;
  const auto tuple = [&](const ojson& arr, const std::string& p) {
    for (size_t i = 0; i < arr.size(); ++i)
      prefix.push_back(visit(arr[i], p + "/" + std::to_string(i), depth + 1, hint + "-" + std::to_string(i)));
  };
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) {
      fail(ptr + "/prefixItems", "must be an array of schemas");
      return "null";
    }
    tuple(s["prefixItems"], ptr + "/prefixItems");
    if (s.contains("items")) rest = &s["items"], rest_ptr = ptr + "/items";
  } else if (s.contains("items") && s["items"].is_array()) {
    tuple(s["items"], ptr + "/items");  // draft 4-7 tuples
    if (s.contains("additionalItems")) rest = &s["additionalItems"], rest_ptr = ptr + "/additionalItems";
  } else if (s.contains("items")) {
    rest = &s["items"], rest_ptr = ptr + "/items";
  }
  if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
    fail(ptr + "/uniqueItems", "uniqueItems: true is not supported");
    return "null";
  }
  std::string item = prim("value");
  if (rest) {
    if (rest->is_boolean() && !rest->get<bool>()) rest_allowed = false;
    else item = visit(*rest, rest_ptr, depth + 1, hint + "-item");
  }
  uint32_t min = 0, max = UINT32_MAX;
  count_keyword(s, "minItems", ptr, &min);
  count_keyword(s, "maxItems", ptr, &max);
  if (!ok_) return "null";
  const uint32_t k = static_cast<uint32_t>(prefix.size());
  if (!rest_allowed) max = std::min(max, k);
  if (min > max) {
    fail(ptr + "/minItems", "no array satisfies minItems, maxItems and the item schemas together");
    return "null";
  }
  const std::string ws = prim("ws");
  const std::string sep = "\",\" " + ws + " ";
  // Items after the tuple: r of them with max(0, min - k) <= r <= max - k.
  std::string tail;
  if (max > k) {
    const uint32_t rmin = min > k ? min - k : 0;
    const std::string one = item + " " + ws;
    const std::string more = max == UINT32_MAX ? "*" : (max - k - 1 == 0 ? "{0}" : "{0," + std::to_string(max - k - 1) + "}");
    if (k == 0) {
      const std::string first_rest = "(" + sep + one + ")";
      std::string reps;
      if (rmin <= 1) {
        reps = one + " " + first_rest + more;
      } else {
        const std::string upper = max == UINT32_MAX ? "" : std::to_string(max - 1);
        reps = one + " " + first_rest + "{" + std::to_string(rmin - 1) + "," + upper + "}";
      }
      tail = rmin == 0 ? "(" + reps + ")?" : reps;
    } else {
      const std::string upper = max == UINT32_MAX ? "" : std::to_string(max - k);
      tail = "(" + sep + one + "){" + std::to_string(rmin) + "," + upper + "}";
    }
  }
  // The tuple, innermost last: item j is optional once min is met.
  std::string body = tail;
  for (uint32_t j = k; j-- > 0;) {
    const std::string elem = (j == 0 ? "" : sep) + prefix[j] + " " + ws + " " + body;
    body = j >= min ? "(" + elem + ")?" : elem;
  }
  if (body.empty()) body = "\"\"";
  return add_rule(hint, "\"[\" " + ws + " " + body + " \"]\"");
}

std::string SchemaCompiler::visit_string(const ojson& s, const std::string& ptr) {
  const std::string q = "\"\\\"\"";
  uint32_t min = 0, max = UINT32_MAX;
  const bool has_min = count_keyword(s, "minLength", ptr, &min);
  const bool has_max = count_keyword(s, "maxLength", ptr, &max);
  if (!ok_) return "null";
  const bool lengths = has_min || has_max;
  if (s.contains("format")) {
    const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
    if (lengths || s.contains("pattern")) {
      fail(ptr + "/format", "format together with minLength, maxLength or pattern is not supported");
      return "null";
    }
    const std::string date =
        R"([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))";
    const std::string time =
        R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
    std::string body;
    if (f == "date") body = date;
    else if (f == "time") body = time;
    else if (f == "date-time") body = "(" + date + ") \"T\" (" + time + ")";
    else if (f == "uuid") body = R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})";
    else if (f == "email")
      body = R"([A-Za-z0-9_%+\-]+ ("." [A-Za-z0-9_%+\-]+)* "@" ([A-Za-z0-9] ([A-Za-z0-9\-]{0,61} [A-Za-z0-9])? ".")+ [A-Za-z] ([A-Za-z0-9\-]{0,61} [A-Za-z0-9])?)";
    else {
      fail(ptr + "/format", "format '" + f + "' is not supported (date, time, date-time, uuid, email are)");
      return "null";
    }
    return add_rule("fmt-" + f, q + " (" + body + ") " + q);
  }
  if (s.contains("pattern")) {
    if (lengths) {
      fail(ptr + "/pattern", "pattern together with minLength or maxLength is not supported");
      return "null";
    }
    if (!s["pattern"].is_string()) {
      fail(ptr + "/pattern", "must be a string");
      return "null";
    }
    auto re = parse_regex(s["pattern"].get<std::string>(), RegexDialect::kJavaScript, limits_);
    if (!re) {
      fail(ptr + "/pattern", re.status().message());
      return "null";
    }
    // JSON schema patterns search anywhere in the string: an unanchored side allows any text there.
    const std::string any = prim("char") + "*";
    return add_rule("pattern", q + " " + (re->anchored_start ? "" : any + " ") + regex_ast_to_gbnf(re->body, true) +
                                   " " + (re->anchored_end ? "" : any + " ") + q);
  }
  if (!lengths) return prim("string");
  if (min > max) {
    fail(ptr + "/minLength", "minLength is above maxLength");
    return "null";
  }
  const std::string reps = max == UINT32_MAX ? "{" + std::to_string(min) + ",}"
                                             : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
  return add_rule("string-len", q + " " + prim("char") + reps + " " + q);
}

std::string SchemaCompiler::visit_number(const ojson& s, bool integer, const std::string& ptr) {
  std::optional<int64_t> lo, hi;
  bool lo_excl = false, hi_excl = false;
  // OpenAPI's numeric formats, which ajv-formats checks: int32 is an integer in range (whatever the type says);
  // int64, float and double hold every number the grammar writes.
  bool int32 = false;
  if (s.contains("format")) {
    const std::string f = s["format"].is_string() ? s["format"].get<std::string>() : "";
    if (f == "int32") {
      int32 = integer = true;
    } else if (f != "int64" && f != "float" && f != "double") {
      fail(ptr + "/format", "format '" + f + "' is not supported for numbers (int32, int64, float, double are)");
      return "null";
    }
  }
  // minimum / exclusiveMinimum (a number, or draft 4's boolean beside minimum) and the maximum side alike.
  const auto bound = [&](const char* key, const char* excl_key, bool lower, std::optional<int64_t>* out, bool* excl) {
    for (const char* k : {key, excl_key}) {
      if (!s.contains(k)) continue;
      const ojson& v = s[k];
      const bool is_excl = k == excl_key;
      if (is_excl && v.is_boolean()) {
        if (v.get<bool>()) *excl = true;
        continue;
      }
      if (!v.is_number()) {
        fail(ptr + "/" + k, "must be a number");
        return;
      }
      double d = v.get<double>();
      if (std::fabs(d) > static_cast<double>(kMaxBoundMagnitude)) {
        // Beyond every number the grammar writes: the bound holds already on one side, on the other nothing does.
        if ((lower && d > 0) || (!lower && d < 0)) fail(ptr + "/" + k, "bound beyond the numbers the grammar writes");
        continue;
      }
      if (integer) {
        // An integer above a real bound: round it onto the integers (exclusive becomes inclusive).
        double r = lower ? (is_excl ? std::floor(d) + 1 : std::ceil(d)) : (is_excl ? std::ceil(d) - 1 : std::floor(d));
        const auto x = static_cast<int64_t>(r);
        if (!*out || (lower ? x > **out : x < **out)) *out = x;
        continue;
      }
      if (std::floor(d) != d) {
        fail(ptr + "/" + k, "a bound on a non-integer number must be an integer to be enforced");
        return;
      }
      const auto x = static_cast<int64_t>(d);
      if (!*out || (lower ? x > **out : x < **out)) {
        *out = x;
        *excl = is_excl;
      } else if (x == **out) {
        *excl = *excl || is_excl;
      }
    }
  };
  bound("minimum", "exclusiveMinimum", true, &lo, &lo_excl);
  bound("maximum", "exclusiveMaximum", false, &hi, &hi_excl);
  if (!ok_) return "null";
  if (int32) {
    if (!lo || *lo < INT32_MIN) lo = INT32_MIN;
    if (!hi || *hi > INT32_MAX) hi = INT32_MAX;
  }
  // Draft 4's boolean exclusive flags apply to the integer bounds too.
  if (integer) {
    if (lo && lo_excl && s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_boolean()) ++*lo;
    if (hi && hi_excl && s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_boolean()) --*hi;
    if (!lo && !hi) return prim("integer");
    if (lo && hi && *lo > *hi) {
      fail(ptr, "no integer lies within minimum / maximum");
      return "null";
    }
    return add_rule("int-range", integer_range_gbnf(lo, hi));
  }
  if (!lo && !hi) return prim("number");
  const std::string body = number_range_gbnf(lo, lo_excl, hi, hi_excl);
  if (body.empty() || (lo && hi && *lo > *hi)) {
    fail(ptr, "no number lies within minimum / maximum");
    return "null";
  }
  return add_rule("num-range", body);
}

bool SchemaCompiler::merge_into(ojson& into, const ojson& from, const std::string& ptr, int depth) {
  for (const auto& [k, v] : from.items()) {
    if (kAnnotations.count(k)) continue;
    if (!into.contains(k)) {
      into[k] = v;
      continue;
    }
    ojson& cur = into[k];
    if (cur == v) continue;
    if (k == "required") {
      for (const ojson& r : v)
        if (std::find(cur.begin(), cur.end(), r) == cur.end()) cur.push_back(r);
    } else if (k == "properties" && cur.is_object() && v.is_object()) {
      for (const auto& [name, sub] : v.items()) {
        if (!cur.contains(name)) {
          cur[name] = sub;
        } else if (cur[name] != sub) {
          cur[name] = ojson{{"allOf", ojson::array({cur[name], sub})}};
        }
      }
    } else if ((k == "minimum" || k == "minLength" || k == "minItems") && cur.is_number() && v.is_number()) {
      if (v > cur) cur = v;
    } else if ((k == "maximum" || k == "maxLength" || k == "maxItems") && cur.is_number() && v.is_number()) {
      if (v < cur) cur = v;
    } else if (k == "type") {
      const auto as_set = [](const ojson& t) {
        std::set<std::string> out;
        if (t.is_string()) out.insert(t.get<std::string>());
        if (t.is_array())
          for (const ojson& x : t)
            if (x.is_string()) out.insert(x.get<std::string>());
        return out;
      };
      std::set<std::string> a = as_set(cur), b = as_set(v), both;
      for (const std::string& t : a)
        if (b.count(t) || (t == "integer" && b.count("number"))) both.insert(t);
      for (const std::string& t : b)
        if (t == "integer" && a.count("number")) both.insert(t);
      if (both.empty()) {
        fail(ptr + "/allOf", "the members' types have nothing in common");
        return false;
      }
      cur = ojson::array();
      for (const std::string& t : both) cur.push_back(t);
    } else if (k == "additionalProperties" && cur.is_boolean() && v.is_boolean()) {
      cur = cur.get<bool>() && v.get<bool>();
    } else {
      fail(ptr + "/allOf", "cannot merge the members' '" + k + "' keywords");
      return false;
    }
  }
  (void)depth;
  return true;
}

// allOf as one schema: members (references resolved) merged keyword by keyword where the result is exact.
// additionalProperties: false in one member while another adds properties is refused (it would forbid them).
ojson SchemaCompiler::merge_all_of(const ojson& s, const std::string& ptr, int depth) {
  ojson merged = ojson::object();
  const ojson& all = s["allOf"];
  if (!all.is_array() || all.empty()) {
    fail(ptr + "/allOf", "must be a non-empty array of schemas");
    return merged;
  }
  std::vector<ojson> members;
  for (size_t i = 0; i < all.size(); ++i) {
    const ojson* m = &all[i];
    for (int hops = 0; m->is_object() && m->contains("$ref") && hops < 16; ++hops) {
      m = resolve((*m)["$ref"].is_string() ? (*m)["$ref"].get<std::string>() : "", ptr + "/allOf/" + std::to_string(i));
      if (!m) return merged;
    }
    if (m->is_boolean()) {
      if (!m->get<bool>()) fail(ptr + "/allOf/" + std::to_string(i), "the schema 'false' matches nothing");
      continue;
    }
    members.push_back(*m);
  }
  ojson rest = s;
  rest.erase("allOf");
  members.push_back(rest);
  std::set<std::string> all_props;
  for (const ojson& m : members)
    if (m.is_object() && m.contains("properties") && m["properties"].is_object())
      for (const auto& [name, sub] : m["properties"].items()) all_props.insert(name);
  for (const ojson& m : members) {
    if (!m.is_object()) continue;
    if (m.contains("allOf")) {
      fail(ptr + "/allOf", "nested allOf is not supported");
      return merged;
    }
    if (m.contains("additionalProperties") && m["additionalProperties"] == false) {
      for (const std::string& p : all_props)
        if (!m.contains("properties") || !m["properties"].contains(p)) {
          fail(ptr + "/allOf", "additionalProperties: false in one member forbids property '" + p + "' of another");
          return merged;
        }
    }
    if (!merge_into(merged, m, ptr, depth)) return merged;
  }
  return merged;
}

}  // namespace

namespace {

// Every rule name of `gbnf` (one "name ::= body" per line, as SchemaCompiler writes it) prefixed, where it is
// defined and wherever a body refers to it (string literals, classes and repetition counts left alone).
std::string prefix_rules(const std::string& gbnf, const std::string& prefix) {
  std::set<std::string> names;
  for (size_t line = 0; line < gbnf.size();) {
    const size_t end = std::min(gbnf.find('\n', line), gbnf.size());
    const size_t def = gbnf.find(" ::= ", line);
    if (def != std::string::npos && def < end) names.insert(gbnf.substr(line, def - line));
    line = end + 1;
  }
  const auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  };
  std::string out;
  out.reserve(gbnf.size() + names.size() * prefix.size() * 4);
  for (size_t i = 0; i < gbnf.size();) {
    const char c = gbnf[i];
    if (c == '"' || c == '[' || c == '{') {  // copied as is, escapes included
      const char close = c == '"' ? '"' : c == '[' ? ']' : '}';
      size_t j = i + 1;
      while (j < gbnf.size() && gbnf[j] != close) j += gbnf[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, gbnf.size());
      out.append(gbnf, i, j - i);
      i = j;
    } else if (is_name_char(c)) {
      size_t j = i;
      while (j < gbnf.size() && is_name_char(gbnf[j])) ++j;
      const std::string word = gbnf.substr(i, j - i);
      out += names.count(word) ? prefix + word : word;
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

Result<std::string> json_schema_to_gbnf(const nlohmann::ordered_json& schema, const SchemaOptions& options,
                                        const Limits& limits) {
  KILN_ASSIGN_OR_RETURN(std::string g, SchemaCompiler(schema, options, limits).run());
  if (options.rule_prefix.empty()) return g;
  return prefix_rules(g, options.rule_prefix);
}

Result<std::string> json_schema_to_gbnf(std::string_view schema_text, const SchemaOptions& options,
                                        const Limits& limits) {
  if (schema_text.size() > limits.max_text_bytes)
    return make_error(ErrorCode::kInvalidArgument, "json schema: %zu bytes is more than the limit of %zu",
                      schema_text.size(), limits.max_text_bytes);
  const ojson schema = ojson::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return make_error(ErrorCode::kInvalidArgument, "json schema: not valid JSON");
  return json_schema_to_gbnf(schema, options, limits);
}

std::string json_object_gbnf(const SchemaOptions& options) {
  auto r = SchemaCompiler(ojson{{"type", "object"}}, options, Limits{}).run();
  return r ? *r : std::string();
}

}  // namespace kiln::grammar

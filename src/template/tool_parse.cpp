// parse_tool_calls (tool_formats.h): a reply's tool calls read by the format's patterns.
//
// Reading a pattern at a position: a literal matches exactly, or (whitespace being the template's canonical form,
// not the model's promise) as its runs of non-whitespace, any whitespace before each. A name, key, id or counter
// slot is a token: it ends at the first whitespace or where the next literal may start. A raw value ends where the
// next literal starts (its first run of non-whitespace). JSON (${ARGS}, ${JSON}) and Python / Gemma values are
// read as values. A call that does not
// read to its end is no call: its text stays in the content.
#include <algorithm>
#include <cctype>

#include "template/template.h"
#include "template/tool_formats.h"

namespace kiln::tpl {

namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kMaxToken = 256;  // names, keys, ids
constexpr int kMaxDepth = 64;      // nesting of Python / Gemma values

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t skip_ws(const std::string& s, size_t p) {
  while (p < s.size() && is_ws(s[p])) ++p;
  return p;
}

// The first run of non-whitespace of a literal ("" for whitespace only): where a search for it looks.
std::string first_run(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n\t\r");
  if (b == std::string::npos) return {};
  const size_t e = s.find_first_of(" \n\t\r", b);
  return s.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// Length of the JSON object or array at s[pos] (balanced brackets, strings respected); 0 if unbalanced.
size_t json_extent(const std::string& s, size_t pos) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1 - pos;
      if (depth < 0) return 0;
    }
  }
  return 0;
}

// Length of the JSON string literal at s[pos] ('"' there); 0 if unterminated.
size_t string_extent(const std::string& s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    else if (s[i] == '"') return i + 1 - pos;
  }
  return 0;
}

bool parse_json(std::string_view s, ojson* out) {
  *out = ojson::parse(s, nullptr, false);
  return !out->is_discarded();
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A number at s[pos] (JSON's syntax, a leading '+' allowed as Python writes none but models may).
bool read_number(const std::string& s, size_t& pos, ojson* out) {
  size_t e = pos;
  while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '-' || s[e] == '+' ||
                          s[e] == '.' || s[e] == 'e' || s[e] == 'E'))
    ++e;
  std::string_view t(s.data() + pos, e - pos);
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);
  if (t.empty() || !parse_json(t, out) || !out->is_number()) return false;
  pos = e;
  return true;
}

bool read_word(const std::string& s, size_t& pos, const char* w) {
  const size_t n = std::char_traits<char>::length(w);
  if (s.compare(pos, n, w) != 0) return false;
  pos += n;
  return true;
}

// A Python literal: 'x' / "x" (escapes), numbers, True / False / None, [..], (..), {'k': v}.
bool py_value(const std::string& s, size_t& pos, ojson* out, int depth) {
  if (depth > kMaxDepth) return false;
  pos = skip_ws(s, pos);
  if (pos >= s.size()) return false;
  const char c = s[pos];
  if (c == '\'' || c == '"') {
    std::string v;
    for (size_t i = pos + 1; i < s.size(); ++i) {
      if (s[i] == c) {
        *out = v;
        pos = i + 1;
        return true;
      }
      if (s[i] != '\\') {
        v += s[i];
        continue;
      }
      if (++i >= s.size()) return false;
      const char e = s[i];
      const int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
      if (hex) {
        if (i + hex >= s.size()) return false;
        uint32_t cp = 0;
        for (int k = 1; k <= hex; ++k) {
          const char h = s[i + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
          const int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10;
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        append_utf8(&v, cp);
        i += static_cast<size_t>(hex);
        continue;
      }
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '0': v += '\0'; break;
        default: v += e; break;  // \\ \' \" and any other character as itself
      }
    }
    return false;
  }
  if (c == '[' || c == '(' || c == '{') {
    const char close = c == '[' ? ']' : c == '(' ? ')' : '}';
    *out = c == '{' ? ojson::object() : ojson::array();
    ++pos;
    for (bool first = true;; first = false) {
      pos = skip_ws(s, pos);
      if (pos < s.size() && s[pos] == close) {
        ++pos;
        return true;
      }
      if (!first) {
        if (pos >= s.size() || s[pos] != ',') return false;
        pos = skip_ws(s, pos + 1);
        if (pos < s.size() && s[pos] == close) continue;  // a trailing comma
      }
      ojson v;
      if (c == '{') {
        ojson k;
        if (!py_value(s, pos, &k, depth + 1) || !k.is_string()) return false;
        pos = skip_ws(s, pos);
        if (pos >= s.size() || s[pos] != ':') return false;
        ++pos;
        if (!py_value(s, pos, &v, depth + 1)) return false;
        (*out)[k.get<std::string>()] = std::move(v);
      } else {
        if (!py_value(s, pos, &v, depth + 1)) return false;
        out->push_back(std::move(v));
      }
    }
  }
  if (read_word(s, pos, "True")) return *out = true, true;
  if (read_word(s, pos, "False")) return *out = false, true;
  if (read_word(s, pos, "None")) return *out = nullptr, true;
  return read_number(s, pos, out);
}

// A Gemma 4 value: <|"|>text<|"|>, numbers, true / false / None / null, [..], {key:v} (bare or quoted keys).
bool gemma_value(const std::string& s, size_t& pos, ojson* out, int depth) {
  static const std::string q = "<|\"|>";
  if (depth > kMaxDepth) return false;
  pos = skip_ws(s, pos);
  if (pos >= s.size()) return false;
  if (s.compare(pos, q.size(), q) == 0) {
    const size_t e = s.find(q, pos + q.size());
    if (e == std::string::npos) return false;
    *out = s.substr(pos + q.size(), e - pos - q.size());
    pos = e + q.size();
    return true;
  }
  const char c = s[pos];
  if (c == '[' || c == '{') {
    const char close = c == '[' ? ']' : '}';
    *out = c == '{' ? ojson::object() : ojson::array();
    ++pos;
    for (bool first = true;; first = false) {
      pos = skip_ws(s, pos);
      if (pos < s.size() && s[pos] == close) {
        ++pos;
        return true;
      }
      if (!first) {
        if (pos >= s.size() || s[pos] != ',') return false;
        ++pos;
      }
      ojson v;
      if (c == '{') {
        pos = skip_ws(s, pos);
        std::string key;
        if (s.compare(pos, q.size(), q) == 0) {
          ojson k;
          if (!gemma_value(s, pos, &k, depth + 1)) return false;
          key = k.get<std::string>();
        } else {
          const size_t colon = s.find(':', pos);
          if (colon == std::string::npos || colon - pos > kMaxToken) return false;
          key = trim(std::string_view(s).substr(pos, colon - pos));
          pos = colon;
        }
        pos = skip_ws(s, pos);
        if (key.empty() || pos >= s.size() || s[pos] != ':') return false;
        ++pos;
        if (!gemma_value(s, pos, &v, depth + 1)) return false;
        (*out)[key] = std::move(v);
      } else {
        if (!gemma_value(s, pos, &v, depth + 1)) return false;
        out->push_back(std::move(v));
      }
    }
  }
  if (read_word(s, pos, "true")) return *out = true, true;
  if (read_word(s, pos, "false")) return *out = false, true;
  if (read_word(s, pos, "None") || read_word(s, pos, "null")) return *out = nullptr, true;
  return read_number(s, pos, out);
}

// One call as it is read.
struct Building {
  std::string name, id;
  ojson args = ojson::object();
  // the parameter being read
  std::string key, type, isstr, raw;
  ojson value;
  bool has_raw = false, has_value = false;
};

class Reader {
 public:
  Reader(const ToolFormat& f, const std::string& s, const ojson& tools) : f_(f), s_(s), tools_(tools) {}

  // The calls at pos: the section, or consecutive calls (call_sep between) when the format has none.
  bool calls_at(size_t& pos, std::vector<ToolCall>* out) {
    std::vector<ToolCall> found;
    size_t p = pos;
    Building unused;
    if (f_.section.empty() ? !calls(p, &found) : !seq(f_.section, p, unused, &found)) return false;
    for (auto& c : found) out->push_back(std::move(c));
    pos = p;
    return true;
  }

 private:
  // A literal: exactly, or its runs of non-whitespace in order with any whitespace before each (the template's
  // whitespace is canonical, not the model's promise).
  bool lit(const std::string& l, size_t& pos) const {
    if (s_.compare(pos, l.size(), l) == 0) {
      pos += l.size();
      return true;
    }
    size_t p = pos;
    for (size_t i = 0; i < l.size();) {
      if (is_ws(l[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < l.size() && !is_ws(l[j])) ++j;
      p = skip_ws(s_, p);
      if (s_.compare(p, j - i, l, i, j - i) != 0) return false;
      p += j - i;
      i = j;
    }
    pos = p;
    return true;
  }

  // The texts that may follow slot i of p (the first runs of literals): the next non-blank literal, looking through
  // a ${PARAMS} (which may hold no parameter) at the first literal of a parameter and what follows the list.
  std::vector<std::string> stops(const Pattern& p, size_t i) const {
    std::vector<std::string> out;
    for (size_t j = i + 1; j < p.size(); ++j) {
      if (p[j].slot == Slot::kText) {
        std::string run = first_run(p[j].text);
        if (run.empty()) continue;
        out.push_back(std::move(run));
        break;
      }
      if (p[j].slot == Slot::kParams) {
        if (!f_.param.empty() && f_.param[0].slot == Slot::kText) out.push_back(first_run(f_.param[0].text));
        continue;
      }
      if (p[j].slot == Slot::kArgs || p[j].slot == Slot::kJson) out.push_back("{");
      break;
    }
    return out;
  }

  // Where the slot at p[i] that starts at pos ends (npos: nowhere). Tokens also end at whitespace.
  size_t slot_end(const Pattern& p, size_t i, size_t pos, bool token) const {
    size_t end = std::string::npos;
    for (const std::string& c : stops(p, i)) end = std::min(end, s_.find(c, pos));
    if (!token) return end;
    const size_t lim = std::min(end, s_.size());
    size_t w = pos;
    while (w < lim && !is_ws(s_[w])) ++w;
    if (w < lim) end = w;
    return end != std::string::npos && end - pos > kMaxToken ? std::string::npos : end;
  }

  bool token(const Pattern& p, size_t i, size_t& pos, std::string* out) const {
    const size_t start = skip_ws(s_, pos);
    const size_t end = slot_end(p, i, start, true);
    if (end == std::string::npos || end <= start) return false;
    *out = s_.substr(start, end - start);
    pos = end;
    return true;
  }

  // Fills a token slot; a slot that repeats (a name written twice) must repeat the same text.
  static bool set_once(std::string* field, const std::string& v) {
    if (field->empty()) {
      *field = v;
      return true;
    }
    return *field == v;
  }

  bool seq(const Pattern& p, size_t& pos, Building& b, std::vector<ToolCall>* out) {
    for (size_t i = 0; i < p.size(); ++i) {
      const Piece& x = p[i];
      std::string t;
      switch (x.slot) {
        case Slot::kText:
          if (!lit(x.text, pos)) return false;
          break;
        case Slot::kName:
          if (!token(p, i, pos, &t) || !set_once(&b.name, t)) return false;
          break;
        case Slot::kId:
          if (!token(p, i, pos, &t)) return false;
          b.id = t;
          break;
        case Slot::kIndex:
        case Slot::kIndex1:
          if (!token(p, i, pos, &t) || t.find_first_not_of("0123456789") != std::string::npos) return false;
          break;
        case Slot::kKey:
          if (!token(p, i, pos, &t) || !set_once(&b.key, t)) return false;
          break;
        case Slot::kType:
          if (!token(p, i, pos, &t)) return false;
          b.type = t;
          break;
        case Slot::kIsString:
          if (!token(p, i, pos, &t) || (t != "true" && t != "false")) return false;
          b.isstr = t;
          break;
        case Slot::kValue:
          if (!value(p, i, pos, b)) return false;
          break;
        case Slot::kArgs:
          if (!json_args(pos, &b.args)) return false;
          break;
        case Slot::kJson:
          if (!json_call(pos, b)) return false;
          break;
        case Slot::kCalls:
          if (!out || !calls(pos, out)) return false;
          break;
        case Slot::kParams:
          params(pos, b);
          break;
      }
    }
    return true;
  }

  bool calls(size_t& pos, std::vector<ToolCall>* out) {
    const size_t n0 = out->size();
    for (;;) {
      size_t p = pos;
      if (out->size() > n0 && !lit(f_.call_sep, p)) break;
      Building b;
      if (!seq(f_.call, p, b, nullptr) || trim(b.name).empty()) break;
      ToolCall c;
      c.name = trim(b.name);
      c.arguments = b.args.dump();
      c.id = b.id.empty() ? new_call_id(f_.ids) : b.id;
      out->push_back(std::move(c));
      pos = p;
    }
    return out->size() > n0;
  }

  void params(size_t& pos, Building& b) {
    for (bool first = true;; first = false) {
      size_t p = pos;
      if (!first && !lit(f_.param_sep, p)) break;
      b.key.clear(), b.type.clear(), b.isstr.clear(), b.raw.clear();
      b.has_raw = b.has_value = false;
      if (!seq(f_.param, p, b, nullptr) || (!b.has_raw && !b.has_value)) break;
      b.args[b.key] = b.has_value ? b.value : raw_value(b);
      pos = p;
    }
  }

  bool value(const Pattern& p, size_t i, size_t& pos, Building& b) {
    if (f_.values == ValueSyntax::kPython) return b.has_value = py_value(s_, pos, &b.value, 0);
    if (f_.values == ValueSyntax::kGemma) return b.has_value = gemma_value(s_, pos, &b.value, 0);
    const size_t end = slot_end(p, i, pos, false);
    if (end == std::string::npos) return false;
    b.raw = s_.substr(pos, end - pos);
    b.has_raw = true;
    pos = end;
    return true;
  }

  // Whether the request's schema types parameter `key` of `name` as a string (false: unknown or not a string).
  bool string_param(const std::string& name, const std::string& key) const {
    if (!tools_.is_array()) return false;
    for (const ojson& t : tools_) {
      const ojson* f = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
      if (!f || !f->is_object() || !f->contains("name") || (*f)["name"] != name) continue;
      if (!f->contains("parameters") || !(*f)["parameters"].is_object()) return false;
      const ojson& ps = (*f)["parameters"];
      if (!ps.contains("properties") || !ps["properties"].is_object() || !ps["properties"].contains(key)) return false;
      const ojson& prop = ps["properties"][key];
      return prop.is_object() && prop.contains("type") && prop["type"] == "string";
    }
    return false;
  }

  // A raw value as JSON: a string where the format (string="true", type="string") or the schema says so, else
  // the JSON it spells (a string when it spells none). One newline either side is the format's, not the value's.
  ojson raw_value(const Building& b) const {
    std::string v = b.raw;
    if (!v.empty() && v[0] == '\n') v.erase(0, 1);
    if (!v.empty() && v.back() == '\n') v.pop_back();
    static const std::string cdata = "<![CDATA[", cdata_end = "]]>";
    if (v.size() >= cdata.size() + cdata_end.size() && v.compare(0, cdata.size(), cdata) == 0 &&
        v.compare(v.size() - cdata_end.size(), cdata_end.size(), cdata_end) == 0)
      v = v.substr(cdata.size(), v.size() - cdata.size() - cdata_end.size());
    const bool is_string = !b.isstr.empty() ? b.isstr == "true"
                           : !b.type.empty() ? b.type == "string"
                                             : string_param(b.name, b.key);
    ojson j;
    if (!is_string && parse_json(trim(v), &j)) return j;
    return v;
  }

  // ${ARGS}: a JSON object, or a JSON string holding one (as some templates write string arguments back).
  bool json_args(size_t& pos, ojson* out) const {
    const size_t p = skip_ws(s_, pos);
    if (p >= s_.size()) return false;
    size_t n = 0;
    ojson j;
    if (s_[p] == '{') n = json_extent(s_, p);
    else if (s_[p] == '"') n = string_extent(s_, p);
    if (!n || !parse_json(std::string_view(s_).substr(p, n), &j)) return false;
    if (j.is_string() && !parse_json(j.get<std::string>(), &j)) return false;
    if (!j.is_object()) return false;
    *out = std::move(j);
    pos = p + n;
    return true;
  }

  // ${JSON}: the whole call as one object.
  bool json_call(size_t& pos, Building& b) const {
    const size_t p = skip_ws(s_, pos);
    if (p >= s_.size() || s_[p] != '{') return false;
    const size_t n = json_extent(s_, p);
    ojson j;
    if (!n || !parse_json(std::string_view(s_).substr(p, n), &j) || !j.is_object()) return false;
    const JsonShape& sh = f_.json;
    const ojson* args = nullptr;
    if (sh.name_is_key) {
      if (j.size() != 1) return false;
      b.name = j.begin().key();
      args = &j.begin().value();
    } else {
      if (!j.contains(sh.name_key) || !j[sh.name_key].is_string()) return false;
      b.name = j[sh.name_key].get<std::string>();
      for (const std::string& k : {sh.args_key, std::string("arguments"), std::string("parameters")})
        if (j.contains(k)) {
          args = &j[k];
          break;
        }
      if (!sh.id_key.empty() && j.contains(sh.id_key) && j[sh.id_key].is_string() &&
          !j[sh.id_key].get<std::string>().empty())
        b.id = j[sh.id_key].get<std::string>();
    }
    if (args) {
      ojson a = *args;
      if (a.is_string() && !parse_json(a.get<std::string>(), &a)) return false;
      if (!a.is_object()) return false;
      b.args = std::move(a);
    }
    pos = p + n;
    return true;
  }

  const ToolFormat& f_;
  const std::string& s_;
  const ojson& tools_;
};

void drop_marker(std::string* s, const std::string& m) {
  if (m.empty()) return;
  for (size_t at = s->find(m); at != std::string::npos; at = s->find(m, at)) s->erase(at, m.size());
}

}  // namespace

void parse_tool_calls(const ToolFormat& f, std::string* content, std::vector<ToolCall>* calls,
                      const nlohmann::ordered_json& tools, bool opened, const std::string& opener_tail) {
  std::vector<ToolCall> found;
  std::string kept;
  if (f.at_start) {  // calls opening the reply, or after the lead marker (content before it stays)
    const std::string& text = *content;
    Reader r(f, text, tools);
    size_t p = 0;
    if (!r.calls_at(p, &found) || skip_ws(text, p) != text.size()) {
      found.clear();
      const size_t lead = f.lead.empty() ? std::string::npos : text.find(f.lead);
      if (lead == std::string::npos) return;
      p = lead + f.lead.size();
      if (!r.calls_at(p, &found) || skip_ws(text, p) != text.size()) return;
      kept = text.substr(0, lead);
    }
  } else {
    const std::string& op = f.opener();
    const std::string core = first_run(op);
    if (core.empty()) return;
    // the prompt's part of the opener: all of it, or all but (some of) its trailing whitespace
    std::string text = opened ? op.substr(0, op.size() - std::min(opener_tail.size(), op.size())) + *content : *content;
    size_t pos = 0;
    if (opened) {  // the reply continues the prompt's opener: a call from the first byte, or plain content
      Reader r(f, text, tools);
      size_t p = 0;
      if (r.calls_at(p, &found)) pos = p;
      else text = *content;
    }
    Reader r(f, text, tools);
    for (size_t at = text.find(core, pos); at != std::string::npos; at = text.find(core, pos)) {
      // the literal may start with whitespace before its core: read from the start of that whitespace
      size_t start = at;
      while (start > pos && is_ws(text[start - 1]) && at - start < op.size()) --start;
      size_t p = start;
      if (r.calls_at(p, &found)) {
        kept += text.substr(pos, start - pos);
        pos = p;
      } else {
        kept += text.substr(pos, at + core.size() - pos);
        pos = at + core.size();
      }
    }
    kept += text.substr(pos);
  }
  if (found.empty()) return;
  drop_marker(&kept, f.content_marker);
  *content = trim(kept);
  for (auto& c : found) calls->push_back(std::move(c));
}

}  // namespace kiln::tpl

// parse_reply: generated text -> content / reasoning_content / tool_calls (template.h).
// Invariant: never fails and never loses text: whatever is not recognized as reasoning or as a well-formed
// tool call stays in `content` (a malformed <tool_call> block is kept verbatim).
#include <nlohmann/json.hpp>

#include "template/template.h"
#include "template/value.h"

namespace kiln::tpl {

namespace {

std::string trim(const std::string& s) {
  const size_t b = py_lstrip_begin(s), e = py_rstrip_end(s);
  return b >= e ? std::string() : s.substr(b, e - b);
}

// A tool call from a parsed JSON object: {"name", "arguments"|"parameters", "id"?}; false when not one.
// An empty or blank name is not a call (no function to invoke): the block stays in the content.
bool call_from_json(const nlohmann::ordered_json& j, size_t index, ToolCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out->name = j["name"].get<std::string>();
  if (trim(out->name).empty()) return false;
  const char* keys[] = {"arguments", "parameters"};
  out->arguments = "{}";
  for (const char* k : keys) {
    if (!j.contains(k)) continue;
    const auto& a = j[k];
    if (a.is_string()) {
      // Some models write the arguments as a JSON string; keep it if it is itself valid JSON.
      try {
        out->arguments = nlohmann::ordered_json::parse(a.get<std::string>()).dump();
      } catch (const nlohmann::json::exception&) {
        return false;
      }
    } else if (a.is_object()) {
      out->arguments = a.dump();
    } else {
      return false;
    }
    break;
  }
  out->id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : "call_" + std::to_string(index);
  return true;
}

bool parse_json(const std::string& s, nlohmann::ordered_json* out) {
  try {
    *out = nlohmann::ordered_json::parse(s);
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// Length of the JSON value starting at s[pos] (balanced braces/brackets, strings respected); 0 if unbalanced.
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
    }
  }
  return 0;
}

void hermes(std::string* content, std::vector<ToolCall>* calls) {
  static const std::string open = "<tool_call>", close = "</tool_call>";
  std::string kept;
  size_t pos = 0;
  while (true) {
    const size_t b = content->find(open, pos);
    if (b == std::string::npos) break;
    const size_t e = content->find(close, b + open.size());
    if (e == std::string::npos) break;
    nlohmann::ordered_json j;
    ToolCall c;
    if (parse_json(trim(content->substr(b + open.size(), e - b - open.size())), &j) && call_from_json(j, calls->size(), &c)) {
      kept += content->substr(pos, b - pos);
      calls->push_back(std::move(c));
    } else {
      kept += content->substr(pos, e + close.size() - pos);  // malformed: stays content
    }
    pos = e + close.size();
  }
  kept += content->substr(pos);
  if (!calls->empty()) *content = trim(kept);
}

void mistral(std::string* content, std::vector<ToolCall>* calls) {
  static const std::string tag = "[TOOL_CALLS]";
  const size_t t = content->find(tag);
  if (t == std::string::npos) return;
  std::vector<ToolCall> found;
  size_t pos = t;
  bool ok = true;
  while (pos < content->size() && content->compare(pos, tag.size(), tag) == 0) {
    pos += tag.size();
    while (pos < content->size() && (*content)[pos] == ' ') ++pos;
    if (pos < content->size() && (*content)[pos] == '[') {  // [TOOL_CALLS][{...}, ...]
      const size_t n = json_extent(*content, pos);
      nlohmann::ordered_json j;
      if (!n || !parse_json(content->substr(pos, n), &j) || !j.is_array()) { ok = false; break; }
      for (const auto& x : j) {
        ToolCall c;
        if (!call_from_json(x, calls->size() + found.size(), &c)) { ok = false; break; }
        found.push_back(std::move(c));
      }
      pos += n;
    } else {  // [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2 / Devstral / Ministral 3)
      const size_t a = content->find("[ARGS]", pos);
      if (a == std::string::npos) { ok = false; break; }
      ToolCall c;
      c.name = trim(content->substr(pos, a - pos));
      size_t p = a + 6;
      const size_t n = json_extent(*content, p);
      nlohmann::ordered_json j;
      if (c.name.empty() || !n || !parse_json(content->substr(p, n), &j) || !j.is_object()) { ok = false; break; }
      c.arguments = j.dump();
      c.id = "call_" + std::to_string(calls->size() + found.size());
      found.push_back(std::move(c));
      pos = p + n;
    }
    while (pos < content->size() && py_isspace(static_cast<unsigned char>((*content)[pos]))) ++pos;
  }
  if (!ok || found.empty()) return;
  const std::string rest = trim(content->substr(pos));
  *content = trim(content->substr(0, t) + (rest.empty() ? "" : "\n" + rest));
  for (auto& c : found) calls->push_back(std::move(c));
}

void llama3(std::string* content, std::vector<ToolCall>* calls) {
  std::string body = *content;
  std::string before;
  const size_t tag = body.find("<|python_tag|>");
  if (tag != std::string::npos) {
    before = body.substr(0, tag);
    body = body.substr(tag + 14);
  }
  body = trim(body);
  if (body.empty() || body[0] != '{') return;
  // One call, or several separated by ';' (Llama 3.1 writes one per line).
  std::vector<ToolCall> found;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t n = json_extent(body, pos);
    nlohmann::ordered_json j;
    ToolCall c;
    if (!n || !parse_json(body.substr(pos, n), &j) || !call_from_json(j, calls->size() + found.size(), &c)) return;
    if (!j.contains("parameters") && !j.contains("arguments")) return;
    found.push_back(std::move(c));
    pos += n;
    while (pos < body.size() && (py_isspace(static_cast<unsigned char>(body[pos])) || body[pos] == ';')) ++pos;
    if (pos < body.size() && body[pos] != '{') return;
  }
  *content = trim(before);
  for (auto& c : found) calls->push_back(std::move(c));
}

}  // namespace

ParsedReply parse_reply(const std::string& text, const ReplyOptions& opts) {
  ParsedReply r;
  std::string content = text;
  if (opts.extract_reasoning && !opts.think_end.empty()) {
    const size_t e = content.find(opts.think_end);
    const size_t b = opts.think_begin.empty() ? std::string::npos : content.find(opts.think_begin);
    if (e != std::string::npos && (b == std::string::npos || b < e)) {
      const size_t start = b == std::string::npos ? 0 : b + opts.think_begin.size();
      // Only leading whitespace may precede <think>; otherwise the block is part of the content.
      if (b == std::string::npos || trim(content.substr(0, b)).empty()) {
        r.reasoning_content = trim(content.substr(start, e - start));
        content = content.substr(e + opts.think_end.size());
        const size_t lead = py_lstrip_begin(content);
        content = content.substr(lead);
      }
    } else if (b != std::string::npos && e == std::string::npos && trim(content.substr(0, b)).empty()) {
      r.reasoning_content = trim(content.substr(b + opts.think_begin.size()));  // cut off while thinking
      content.clear();
    }
  }
  switch (opts.tool_format) {
    case ToolCallFormat::kNone: break;
    case ToolCallFormat::kHermes: hermes(&content, &r.tool_calls); break;
    case ToolCallFormat::kMistral: mistral(&content, &r.tool_calls); break;
    case ToolCallFormat::kLlama3: llama3(&content, &r.tool_calls); break;
    case ToolCallFormat::kAuto:
      if (content.find("<tool_call>") != std::string::npos) hermes(&content, &r.tool_calls);
      else if (content.find("[TOOL_CALLS]") != std::string::npos) mistral(&content, &r.tool_calls);
      else llama3(&content, &r.tool_calls);
      break;
  }
  r.content = std::move(content);
  return r;
}

ReplyOptions reply_options_for_template(const std::string& src) {
  ReplyOptions o;
  if (src.find("<tool_call>") != std::string::npos) o.tool_format = ToolCallFormat::kHermes;
  else if (src.find("[TOOL_CALLS]") != std::string::npos) o.tool_format = ToolCallFormat::kMistral;
  else if (src.find("<|python_tag|>") != std::string::npos || src.find("\"parameters\"") != std::string::npos)
    o.tool_format = ToolCallFormat::kLlama3;
  if (src.find("[THINK]") != std::string::npos) {
    o.think_begin = "[THINK]";
    o.think_end = "[/THINK]";
  } else if (src.find("<seed:think>") != std::string::npos) {
    o.think_begin = "<seed:think>";
    o.think_end = "</seed:think>";
  }
  return o;
}

}  // namespace kiln::tpl

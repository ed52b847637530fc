// parse_reply: generated text -> content / reasoning_content / tool_calls (template.h).
// Invariant: never fails and never loses text: whatever is not recognized as reasoning or as a well-formed
// tool call stays in `content` (a malformed <tool_call> block is kept verbatim). The one exception: with
// parallel_tool_calls false, calls after the first are dropped.
#include <nlohmann/json.hpp>

#include "template/template.h"
#include "template/tool_formats.h"
#include "template/value.h"

namespace kiln::tpl {

namespace {

std::string trim(const std::string& s) {
  const size_t b = py_lstrip_begin(s), e = py_rstrip_end(s);
  return b >= e ? std::string() : s.substr(b, e - b);
}

bool starts_at(const std::string& s, size_t p, const std::string& m) {
  return !m.empty() && s.compare(p, m.size(), m) == 0;
}

// Appends a message body to reasoning or content: trimmed, "\n\n" between bodies.
void join(std::string* to, const std::string& body) {
  const std::string t = trim(body);
  if (t.empty()) return;
  if (!to->empty()) *to += "\n\n";
  *to += t;
}

// A harmony message addressed to a recipient, its header in the tool format's order:
//   [" to=R"] "<|channel|>" CHANNEL [" to=R"] [" "] ["<|constrain|>"] [TYPE] "<|message|>" BODY
// becomes "<|channel|>commentary to=R <|constrain|>json<|message|>" BODY. "" when the header names no recipient or
// is not one (the message then stays as it is).
std::string canonical_call_header(const std::string& m) {
  static const std::string kChannel = "<|channel|>", kMessage = "<|message|>", kConstrain = "<|constrain|>";
  const size_t msg = m.find(kMessage);
  const size_t ch = m.find(kChannel);
  if (msg == std::string::npos || ch == std::string::npos || ch > msg) return {};
  const auto recipient = [](std::string_view part) -> std::string {
    const size_t to = part.find("to=");  // a space before it is canonical, not promised (the grammar's is optional)
    if (to == std::string_view::npos) return {};
    size_t e = to + 3;
    while (e < part.size() && part[e] != ' ' && part[e] != '<') ++e;
    return std::string(part.substr(to + 3, e - to - 3));
  };
  const std::string_view role(m.data(), ch), head(m.data() + ch + kChannel.size(), msg - ch - kChannel.size());
  if (!trim(std::string(role.substr(0, role.find("to=")))).empty()) return {};  // text before the header
  std::string r = recipient(role);
  if (r.empty()) r = recipient(head);
  if (r.empty()) return {};
  // The content type: after <|constrain|>, else the header's last word when it is not the channel or recipient.
  std::string type = "json";
  if (const size_t c = head.find(kConstrain); c != std::string_view::npos) {
    type = trim(std::string(head.substr(c + kConstrain.size())));
  } else {
    const size_t sp = head.find_last_of(' ');
    const std::string last = trim(std::string(head.substr(sp == std::string_view::npos ? 0 : sp + 1)));
    if (sp != std::string_view::npos && !last.empty() && last.rfind("to=", 0) != 0) type = last;
  }
  if (type.empty() || type.find(' ') != std::string::npos) return {};
  return "<|channel|>commentary to=" + r + " " + kConstrain + type + kMessage + m.substr(msg + kMessage.size());
}

// A reply of headed messages (ReplyOptions::message_start): reasoning and content into r, tool calls (format f,
// when given) into r->tool_calls; a message that is neither and no well-formed call stays in the content verbatim.
void split_messages(const std::string& text, const ReplyOptions& o, ParsedReply* r) {
  const auto next_end = [&](size_t from, size_t* marker) {
    size_t best = text.find(o.message_start, from);
    *marker = 0;
    for (const std::string& e : o.message_ends) {
      const size_t at = text.find(e, from);
      if (at < best) best = at, *marker = e.size();
    }
    return best;
  };
  std::string reasoning, content;
  size_t pos = 0;
  while (pos < text.size()) {
    pos = py_lstrip_begin(text.substr(pos)) + pos;
    if (pos >= text.size()) break;
    if (starts_at(text, pos, o.message_start)) {
      pos += o.message_start.size();
      continue;
    }
    std::string* to = nullptr;
    size_t body = pos;
    if (starts_at(text, pos, o.think_begin)) to = &reasoning, body += o.think_begin.size();
    for (const std::string& h : o.content_headers)
      if (!to && starts_at(text, pos, h)) to = &content, body += h.size();
    size_t marker = 0;
    if (to) {  // reasoning or content: up to the message's end (or the next message, or the end of the text)
      const size_t e = next_end(body, &marker);
      join(to, text.substr(body, e == std::string::npos ? std::string::npos : e - body));
      pos = e == std::string::npos ? text.size() : e + marker;
      continue;
    }
    // any other message: up to the next message's start, its end marker dropped
    const size_t next = text.find(o.message_start, pos);
    std::string m = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    pos = next == std::string::npos ? text.size() : next;
    m = trim(m);
    std::string bare = m;
    for (const std::string& e : o.message_ends)
      if (bare.size() >= e.size() && bare.compare(bare.size() - e.size(), e.size(), e) == 0) {
        bare.resize(bare.size() - e.size());
        break;
      }
    std::string call = canonical_call_header(bare);
    // A message to one of harmony's builtin tools (browser.*, python, ...: a recipient outside functions.*) is no
    // client function's call and not the answer: dropped, as llama-server does (a server that lets the model call
    // them would run them and add the result).
    static const std::string kFunctions = "<|channel|>commentary to=functions.";
    static const std::string kToAssistant = "<|channel|>commentary to=assistant ";
    if (!call.empty() && call.compare(0, kFunctions.size(), kFunctions) != 0 &&
        call.compare(0, kToAssistant.size(), kToAssistant) != 0)
      continue;
    if (!o.tool_format) call.clear();
    std::vector<ToolCall> found;
    if (!call.empty()) parse_tool_calls(*o.tool_format, &call, &found, o.tools);
    if (!found.empty() && call.empty()) {
      for (auto& c : found) r->tool_calls.push_back(std::move(c));
    } else {
      join(&content, m);
    }
  }
  r->reasoning_content = std::move(reasoning);
  r->content = std::move(content);
}

}  // namespace

ParsedReply parse_reply(const std::string& text, const ReplyOptions& opts) {
  ParsedReply r;
  if (!opts.message_start.empty() && opts.extract_reasoning) {
    split_messages(text, opts, &r);
    if (!opts.parallel_tool_calls && r.tool_calls.size() > 1) r.tool_calls.resize(1);
    return r;
  }
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
  const ToolFormat* f = opts.tool_format;
  if (!f && opts.detect_tools) {  // the common formats, by their markers in the text
    const char* name = "llama3";
    if (content.find("<tool_call>") != std::string::npos) name = "hermes";
    else if (content.find("[CALL_ID]") != std::string::npos) name = "mistral-call-id";
    else if (content.find("[ARGS]") != std::string::npos) name = "mistral-args";
    else if (content.find("[TOOL_CALLS]") != std::string::npos) name = "mistral";
    f = tool_format_by_name(name);
  }
  if (f) {
    parse_tool_calls(*f, &content, &r.tool_calls, opts.tools, opts.opened_tool_call, opts.opener_tail);
    if (!opts.parallel_tool_calls && r.tool_calls.size() > 1) r.tool_calls.resize(1);
  }
  r.content = std::move(content);
  return r;
}

ReplyOptions reply_options_for_template(const std::string& src) {
  ReplyOptions o;
  o.tool_format = detect_tool_format(src);
  if (src.find("<|channel|>") != std::string::npos && src.find("<|message|>") != std::string::npos &&
      src.find("<|start|>assistant") != std::string::npos) {  // harmony (gpt-oss)
    o.think_begin = "<|channel|>analysis<|message|>";
    o.think_end = "<|end|>";
    o.message_start = "<|start|>assistant";
    o.content_headers = {"<|channel|>final<|message|>", "<|channel|>commentary<|message|>"};
    o.message_ends = {"<|end|>", "<|return|>", "<|call|>"};
  } else if (src.find("[THINK]") != std::string::npos) {
    o.think_begin = "[THINK]";
    o.think_end = "[/THINK]";
  } else if (src.find("<seed:think>") != std::string::npos) {
    o.think_begin = "<seed:think>";
    o.think_end = "</seed:think>";
  } else if (src.find("<|START_THINKING|>") != std::string::npos) {
    o.think_begin = "<|START_THINKING|>";
    o.think_end = "<|END_THINKING|>";
  }
  return o;
}

}  // namespace kiln::tpl

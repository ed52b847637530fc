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
    parse_tool_calls(*f, &content, &r.tool_calls, opts.tools, opts.opened_tool_call);
    if (!opts.parallel_tool_calls && r.tool_calls.size() > 1) r.tool_calls.resize(1);
  }
  r.content = std::move(content);
  return r;
}

ReplyOptions reply_options_for_template(const std::string& src) {
  ReplyOptions o;
  o.tool_format = detect_tool_format(src);
  if (src.find("[THINK]") != std::string::npos) {
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

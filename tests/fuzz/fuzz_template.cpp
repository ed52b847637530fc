// Fuzz target: arbitrary bytes as a chat template, rendered with a fixed conversation (tools, tool calls,
// list-of-parts content), and the same bytes as a generated reply through parse_reply.
// Checks: nothing crashes, hangs or aborts (the limits below keep one input well under a second); an error has a
// message that names the template position ("fuzz: line L, column C: ..."); parse_reply never loses text (the
// content, reasoning and tool calls it returns are no longer than the input, plus serialization overhead).
// Links only kiln_template.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "template/template.h"

namespace {

const nlohmann::ordered_json& messages() {
  static const nlohmann::ordered_json m = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": "", "reasoning_content": "call the tool",
     "tool_calls": [{"id": "abc123XYZ", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather", "content": "{\"t\": 18}"},
    {"role": "user", "content": "Thanks"}])");
  return m;
}

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
     "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}])");
  return t;
}

void check(bool ok, const char* what, const std::string& detail) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_template: check failed: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string src(reinterpret_cast<const char*>(data), size);
  kiln::tpl::RenderOptions opts;
  opts.tools = size % 2 ? tools() : nlohmann::ordered_json();
  opts.add_generation_prompt = size % 3 != 0;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  opts.kwargs = {{"enable_thinking", size % 5 != 0}};
  opts.template_name = "fuzz";
  opts.now = 1764582000;
  // Small bounds: a hostile input must fail fast, not merely eventually.
  opts.limits.max_steps = 200'000;
  opts.limits.max_output_bytes = 1 << 20;
  opts.limits.max_string_bytes = 1 << 20;
  opts.limits.max_call_depth = 50;
  auto r = kiln::tpl::render_chat(src, messages(), opts);
  if (!r) {
    const std::string& msg = r.status().message();
    check(msg.rfind("fuzz: line ", 0) == 0, "error names the template position", msg);
  } else {
    check(r->size() <= opts.limits.max_output_bytes, "output within the limit", std::to_string(r->size()));
  }

  const kiln::tpl::ParsedReply p = kiln::tpl::parse_reply(src, kiln::tpl::reply_options_for_template(src));
  check(p.content.size() + p.reasoning_content.size() <= src.size(), "parse_reply does not invent text",
        std::to_string(p.content.size()));
  for (const auto& c : p.tool_calls) check(!c.name.empty(), "tool calls have names", c.arguments);
  return 0;
}

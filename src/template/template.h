// kiln's Jinja2 interpreter for chat templates (`tokenizer.chat_template`), exact against Python's jinja2 as
// Hugging Face transformers configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, the {% generation %} tag, its tojson, raise_exception, strftime_now).
//
// Public API (everything else in src/template is internal):
//
//   render_chat(source, messages, opts)   renders a conversation as transformers' apply_chat_template does:
//       the template sees `messages`, `tools` (none when absent), `documents` (none when absent),
//       `add_generation_prompt`, `bos_token`, `eos_token`, plus opts.kwargs (e.g. {"enable_thinking": false}).
//       Messages and tools are JSON as the OpenAI API writes them (content a string or a list of typed parts,
//       tool_calls, tool_call_id, name, reasoning_content); key order is kept (Python dicts are ordered).
//   Template::parse / Template::render     the same for arbitrary variables (parse once, render many times).
//   parse_reply(text, opts)                splits generated text into content / reasoning_content / tool_calls.
//
// Errors are values: a template that does not parse, raises (raise_exception, an undefined attribute of an
// undefined value, a type error, ...) or exceeds a bound returns an error whose message starts with
// "<template name>: line L, column C: ". Hostile templates are bounded (Limits in template/interp.h: steps,
// macro depth, output size, string and list sizes); nothing aborts or hangs.
//
// Undefined names behave as jinja2's default Undefined: they print as "", are false, iterate as empty and fail
// when used as a value (attribute access, arithmetic, comparison, tojson).
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace kiln::tpl {

struct Program;

struct RenderLimits {
  int64_t max_steps = 20'000'000;       // statements + calls + loop iterations
  int max_call_depth = 100;             // nested macro calls / recursive loops
  size_t max_output_bytes = 32u << 20;  // total bytes the template writes
  size_t max_string_bytes = 32u << 20;  // any one string value
  size_t max_stack_bytes = 4u << 20;    // native stack of the evaluator (at most what the thread has left)
};

class Template {
 public:
  // `name` prefixes error messages (e.g. the file name, or "chat template").
  static Result<Template> parse(const std::string& source, const std::string& name = "template");
  // Renders with the given variables (a JSON object; insertion order kept). `now`: the clock strftime_now reads
  // (0: the real local time; tests pin it so both sides of a comparison agree).
  Result<std::string> render(const nlohmann::ordered_json& variables, std::time_t now = 0,
                             const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Program> prog_;
};

struct RenderOptions {
  nlohmann::ordered_json tools;      // null: no tools (the template sees none)
  nlohmann::ordered_json documents;  // null: none
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra template variables
  std::string template_name = "chat template";
  std::time_t now = 0;
  RenderLimits limits;
};

// transformers' apply_chat_template(messages, tools=..., add_generation_prompt=..., **kwargs).
// kwargs may not redefine messages/tools/documents/add_generation_prompt (an error says so); they may override
// bos_token/eos_token, as transformers' keyword arguments override its special-token map.
Result<std::string> render_chat(const std::string& template_source, const nlohmann::ordered_json& messages,
                                const RenderOptions& opts);

// ---- reply parsing (for `kiln chat` and the server)

struct ToolCall {
  std::string id;         // as the model wrote it, else a fresh random one (new_call_id)
  std::string name;
  std::string arguments;  // a JSON object, serialized (OpenAI's function.arguments)
};

struct ParsedReply {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};

struct ToolFormat;

struct ReplyOptions {
  // The tool-call format (tool_formats.h: the template's, detect_tool_format). Null: with detect_tools, the common
  // formats are tried (<tool_call> JSON, [TOOL_CALLS], Llama 3's JSON); without, no tool calls are read.
  const ToolFormat* tool_format = nullptr;
  bool detect_tools = true;
  nlohmann::ordered_json tools;      // the request's tool definitions (parameter types); null: unknown
  bool parallel_tool_calls = true;   // false: only the first call is kept
  bool opened_tool_call = false;     // the prompt ended with the format's opener (ToolFormat::opener)
  std::string opener_tail;           // opened_tool_call: the opener's trailing whitespace the prompt left out
  // Reasoning markers; the text before `think_end` is reasoning even without `think_begin` (templates that
  // open the block in the generation prompt, like Qwen3 and DeepSeek-R1, leave only the closing tag).
  std::string think_begin = "<think>", think_end = "</think>";
  bool extract_reasoning = true;
  // Replies as a sequence of headed messages (harmony, gpt-oss): every message after the first opens with
  // `message_start` ("<|start|>assistant"); a reasoning message is think_begin ... think_end (several may come), a
  // content message one of `content_headers` ... think_end (the final answer and commentary preambles), any other
  // message (a tool call: its recipient in the role or the channel header) is read by the tool format. Headers and
  // ends are not part of reasoning or content; the bodies of several messages of one kind join with "\n\n".
  // Empty: the reply is one text with at most one reasoning block.
  std::string message_start;
  std::vector<std::string> content_headers;
  std::vector<std::string> message_ends;  // what ends a message (think_end first)
};

// Never fails: malformed tool-call text stays in content.
ParsedReply parse_reply(const std::string& text, const ReplyOptions& opts = {});
// Picks ReplyOptions for a template: its reasoning markers and tool-call format, from what the template writes
// (a template without a known format keeps detect_tools).
ReplyOptions reply_options_for_template(const std::string& template_source);

}  // namespace kiln::tpl

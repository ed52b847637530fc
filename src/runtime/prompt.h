// Prompt policy, written once for run, chat, perplexity and the server: when a BOS token goes in front, and how a
// conversation becomes tokens.
//   - BOS: added when the tokenizer asks for it (tokenizer.ggml.add_bos_token), the model has one, the caller did
//     not turn it off (--no-bos), and the text does not already start with it (a chat template that writes
//     bos_token itself, or a prompt that spells it out with special-token parsing on).
//   - Text prompts are encoded with special-token parsing on (as llama-cli); perplexity turns it off.
//   - Conversations (ChatPrompt), in this order of precedence:
//       1. a built-in family named by the caller (--chat-template NAME: llama3, chatml, ..., or plain);
//       2. a Jinja template given by the caller (--chat-template-file FILE, or --chat-template with Jinja source);
//       3. the GGUF's tokenizer.chat_template;
//     2 and 3 run in kiln's Jinja interpreter (src/template) as transformers' apply_chat_template does: messages
//     as OpenAI JSON, tools, add_generation_prompt, bos_token/eos_token = the text of the model's BOS/EOS tokens,
//     plus the caller's kwargs (--chat-template-kwargs). A template error is a value whose message names the
//     template, line and column.
//       4. no template at all: a hand-written family chosen from the vocabulary's special tokens (llama3, gemma,
//          phi3, chatml), else (when the caller allows it) the plain "User: ... / Assistant:" text conversation,
//          else chatml. ChatPrompt::notice() is then the log line the caller prints (runtime prints nothing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "template/chat_formats.h"
#include "template/template.h"
#include "template/tool_formats.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool add_bos = true,
                                   bool parse_special = true);
// The conversation rendered with a built-in chat format, then encode_prompt (BOS not doubled when the format
// writes it).
std::vector<int32_t> encode_chat(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt = true);

// Which path renders a conversation.
enum class ChatPath {
  kModelTemplate,  // the GGUF's tokenizer.chat_template, in the interpreter
  kCallerTemplate, // a template the caller gave (--chat-template-file), in the interpreter
  kBuiltin,        // a hand-written family (named by the caller, or the fallback for a file without a template)
  kPlain,          // "User: ...\nAssistant:" text (no special tokens)
};
const char* chat_path_name(ChatPath p);  // "model template", "template file", "built-in", "plain"

struct ChatPromptOptions {
  // A built-in family name (chat_format_from_name) or "plain"; wins over every template. Empty: none.
  std::string builtin;
  // Jinja source that replaces the model's template (the text of --chat-template-file); empty: none.
  std::string template_source;
  std::string template_name = "chat template file";  // prefixes its error messages (e.g. the file name)
  // Prefixes errors of the GGUF's template: "<model_name>: tokenizer.chat_template: line L, column C: ...".
  std::string model_name = "model";
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra template variables
  // No template and no ChatML tokens: the plain text conversation (true) or ChatML regardless (false).
  bool allow_plain = true;
};

// Checks what can be checked before a model loads: the builtin name, that the caller's template parses, that
// kwargs is an object that does not redefine a render argument. Errors name the template line and column.
Status check_chat_prompt_options(const ChatPromptOptions& opts);
// Template variables from a caller: null or an object that does not set a render argument of its own (messages,
// tools, documents, add_generation_prompt).
Status check_template_kwargs(const nlohmann::ordered_json& kwargs);

// How one request's replies are split (ChatPrompt::parse_reply, ReplyStream).
struct ReplyContext {
  bool opened_reasoning = false;  // the prompt opened the reasoning block (prompt_opens_reasoning)
  bool want_tools = false;        // tool calls are read (the request offers tools)
  nlohmann::ordered_json tools;   // the tool definitions offered (parameter types of raw-string formats)
  bool parallel = true;           // false: at most one call (parallel_tool_calls: false)
  bool opened_tool_call = false;  // the prompt ended with the format's opener (prompt_opens_tool_call)
  std::string opener_tail;        // opened_tool_call: the opener's trailing whitespace the prompt left out ("" none)
};

class ChatPrompt {
 public:
  // Chooses the path for this tokenizer (see the top of this file). Errors: a bad builtin name, a template that
  // does not parse (line and column), kwargs that are not an object.
  static Result<ChatPrompt> create(const Tokenizer& tok, const ChatPromptOptions& opts);

  ChatPath path() const { return path_; }
  ChatFormat format() const { return format_; }  // kBuiltin only
  bool plain() const { return path_ == ChatPath::kPlain; }
  // The log line for a fallback (the model has no template), without a command prefix; "" otherwise.
  const std::string& notice() const { return notice_; }
  // What renders, for messages: "the model's chat template", "chat template file t.jinja", "built-in chatml", ...
  std::string describe() const;
  // The Jinja source that renders (model or caller template); "" for the built-in families and plain text.
  const std::string& source() const { return source_; }

  // The prompt text: messages is a JSON array of OpenAI messages (content a string or a list of typed parts);
  // tools an array of OpenAI tool definitions or null. Built-in families and plain text read role and the text
  // of content only (tools are not rendered there).
  // request_kwargs (an object that passed check_template_kwargs, or null): template variables of this render only,
  // over the ones the prompt was created with (a request's chat_template_kwargs over --chat-template-kwargs).
  // Built-in families and plain text have no variables.
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                             bool add_generation_prompt = true,
                             const nlohmann::ordered_json& request_kwargs = nullptr) const;
  // render() then encode_prompt (special tokens parsed, BOS not doubled; plain text: special tokens not parsed).
  Result<std::vector<int32_t>> encode(const nlohmann::ordered_json& messages,
                                      const nlohmann::ordered_json& tools = nullptr,
                                      bool add_generation_prompt = true, bool add_bos = true) const;
  // The tokens of text render() returned (encode() is render() then this).
  std::vector<int32_t> tokenize(const std::string& rendered, bool add_bos = true) const;

  // How replies are split (parse_reply): the template's reasoning markers and tool-call format.
  const tpl::ReplyOptions& reply_options() const { return reply_; }
  // Whether the template writes reasoning markers (<think>..</think>, [THINK]..[/THINK], ...): replies are then
  // split into reasoning and content.
  bool has_reasoning() const { return reasoning_; }
  // Whether a reply to `rendered_prompt` starts inside the reasoning block (the generation prompt opened it, as
  // DeepSeek-R1's "<think>\n" does).
  bool prompt_opens_reasoning(const std::string& rendered_prompt) const;
  // The text that closes a thinking block as the template writes it in an earlier assistant turn: the closing marker
  // with the whitespace around it (Qwen3: "\n</think>\n\n"); "\n" + marker + "\n\n" when the template does not show
  // reasoning of earlier turns. Headed messages (harmony): the marker and the next message's start
  // ("<|end|><|start|>assistant"), the model writing the next header. "" without reasoning markers. A reasoning
  // budget forces it (runtime/reasoning.h).
  const std::string& reasoning_close() const { return reasoning_close_; }
  // The template's tool-call format (tool_formats.h); null when it writes none the table knows.
  const tpl::ToolFormat* tool_format() const { return reply_.tool_format; }
  // Whether a reply to `rendered_prompt` continues a tool call the prompt opened (functionary v3.2's ">>>"; a prefill
  // ending in Hermes' "<tool_call>\n"): the prompt ends with the format's opener, or with the opener less some of its
  // trailing whitespace ("<tool_call>"), which the reply may then write. *tail (when given): the whitespace left out.
  // Never for at_start formats (their opener is no marker) nor where the opener is whitespace only.
  bool prompt_opens_tool_call(const std::string& rendered_prompt, std::string* tail = nullptr) const;
  // The control tokens of the tool-call format's markers (special tokens the reply must show as text for the parser
  // to read them, and that a tool-call grammar writes): GenRequest::text_tokens. EOG tokens excluded.
  std::vector<int32_t> tool_marker_tokens() const;
  // Splits a reply: content, reasoning_content (when has_reasoning()), tool_calls (only with ctx.want_tools).
  // ctx.opened_reasoning: the prompt opened the reasoning block (prompt_opens_reasoning), so a reply cut off before
  // the closing marker is all reasoning.
  tpl::ParsedReply parse_reply(const std::string& text, const ReplyContext& ctx) const;
  tpl::ParsedReply parse_reply(const std::string& text, bool want_tools = false, bool opened_reasoning = false) const;
  // The assistant message to append to the conversation for a reply, as transformers templates expect it:
  // {"role": "assistant", "content": ..., "reasoning_content"?: ..., "tool_calls"?: [...]}.
  nlohmann::ordered_json assistant_message(const tpl::ParsedReply& reply) const;
  // Text that ends a reply beyond end-of-generation tokens (plain text: "\nUser:" and a blank line).
  std::vector<std::string> stop_strings() const;

 private:
  std::string probe_reasoning_close() const;

  const Tokenizer* tok_ = nullptr;
  ChatPath path_ = ChatPath::kBuiltin;
  ChatFormat format_ = ChatFormat::kChatML;
  std::string source_, name_, notice_;
  nlohmann::ordered_json kwargs_ = nlohmann::ordered_json::object();
  tpl::ReplyOptions reply_;
  bool reasoning_ = false;
  bool reads_thinking_ = false;  // the template reads an assistant's reasoning as `thinking`, not reasoning_content
  std::string reasoning_close_;
};

// A reply split as it streams (kiln chat, run --chat, the server's SSE chunks): reasoning and content, holding
// back text that may be the start of a marker; with tools, content from the first tool-call marker on (or a bare
// JSON object opening the content, Llama 3.1's form) is held until finish(), which parses the whole reply as
// ChatPrompt::parse_reply does and returns the tool calls and whatever content was held but is not one. Replies of
// headed messages (harmony) stream each reasoning and content message's body ("\n\n" between bodies of one kind,
// as parse_reply joins them); from the first other message (a tool call) on, everything is held for finish().
class ReplyStream {
 public:
  struct Delta {
    std::string reasoning, content;
    bool reasoning_ended = false;        // the closing reasoning marker came in this piece
    std::vector<tpl::ToolCall> tool_calls;  // finish() only
  };
  // in_reasoning: the prompt opened the reasoning block (ChatPrompt::prompt_opens_reasoning).
  ReplyStream(const ChatPrompt& prompt, bool in_reasoning, bool want_tools = false);
  ReplyStream(const ChatPrompt& prompt, const ReplyContext& ctx);
  Delta push(const std::string& piece);
  Delta finish();
  const std::string& text() const { return text_; }  // everything pushed
  // The reply as parse_reply splits it (after finish(): the same split the deltas added up to, where they could).
  tpl::ParsedReply parsed() const;

 private:
  enum State { kStart, kReasoning, kContent };
  void step(Delta* d, bool final);
  void step_messages(Delta* d, bool final);
  void emit_content(Delta* d, bool final);

  const ChatPrompt* prompt_;
  ReplyContext ctx_;
  std::string begin_, end_;
  std::vector<std::string> tool_markers_;
  bool bare_json_ = false;  // a '{' opening the content starts a tool call (Llama 3.1)
  State state_;
  bool after_reasoning_ = false, content_started_ = false, holding_ = false;
  // Headed messages (tpl::ReplyOptions::message_start): kStart reads a header; a message that is neither reasoning
  // nor content is held (with all that follows) until finish(). new_block_: the next text starts a message body.
  bool messages_ = false, new_block_ = false;
  std::string streamed_reasoning_;
  std::string pending_, text_, streamed_content_;
};

}  // namespace kiln

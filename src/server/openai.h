// OpenAI request schemas for kiln serve: parsing and checking the JSON of /v1/chat/completions, /v1/completions,
// /tokenize and /detokenize (every error an OpenAI error body naming the parameter), tokenizing prompts, and the
// response / stream-chunk JSON. No HTTP here (server.cpp) and no compute (runtime/scheduler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/prompt.h"
#include "runtime/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace kiln::server {

using json = nlohmann::json;

// {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;                           // "" -> null
  std::string code;                            // "" -> null
  std::string type = "invalid_request_error";
};
json error_body(const ApiError& e);
// The JSON text of a response: invalid UTF-8 (a token's partial bytes) is replaced, never thrown on.
std::string dump(const json& j);

struct ParseContext {
  const Tokenizer* tok = nullptr;
  const ChatPrompt* chat = nullptr;  // how conversations render (runtime/prompt.h): the model's template, ...
  int64_t max_seq_ctx = 0;      // tokens one sequence may hold
  std::string model_id;         // what /v1/models lists
  bool strict_model = false;    // "model" must name model_id (else 404); otherwise any name is accepted and echoed
  double timeout_s = 0;         // per request
  int32_t default_max_new_tokens = -1;
  SamplerParams sampling;       // the server's defaults (kiln serve's sampling flags); a request overrides them
  int32_t reasoning_budget = -1;  // --reasoning-budget: tokens of a reply's thinking block (-1: unlimited)
  std::string reasoning_budget_message;  // --reasoning-budget-message: text forced before a spent budget's close
  SpecConfig spec;              // the engine's speculative decoding (speculative.* fields are checked against it)
};

// A request's output constraint (docs/GRAMMAR.md) as GBNF text, and the field it came from: at most one of
// response_format (json_object, json_schema), grammar and json_schema (llama-server), guided_json, guided_regex,
// guided_choice and guided_grammar (vLLM). The server compiles it (runtime/grammar_mask.h's GrammarCache) before
// submitting; a compile error is a 400 naming `param` (grammar_error).
struct OutputGrammar {
  std::string param;
  std::string gbnf;
  bool tool_calls = false;  // the grammar of a forced tool call (tool_choice): the reply is still split
  // tool_choice "auto": the grammar is lazy, the reply free until this format's trigger (ToolFormat::trigger)
  const tpl::ToolFormat* lazy = nullptr;
  bool optional = false;  // tool_choice "auto": a grammar that fails to compile leaves the reply free (no 400)
  std::string trigger_prefix{};  // lazy: the text the reply continues (GrammarTriggers::prefix)
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int n = 1;                                    // choices per prompt
  std::vector<std::vector<int32_t>> prompts;    // one per prompt (completions may batch several)
  GenRequest gen;                               // everything but the prompt
  std::string model;
  // chat: how replies are split (ChatPrompt::parse_reply / ReplyStream)
  const ChatPrompt* chat_prompt = nullptr;
  std::string prompt_text;        // the conversation as the template rendered it (POST /apply-template)
  // How replies are split: reply.want_tools when tools were given (and tool_choice is not "none"), their
  // definitions, parallel_tool_calls, whether the prompt opened the reasoning block or a tool call.
  ReplyContext reply;
  bool split = false;             // replies are split (the template has reasoning markers, or tools; never with an
                                  // output constraint: the constrained text is the content; a forced tool call's
                                  // grammar is split as any reply)
  std::optional<OutputGrammar> grammar;
};

// The body of a chat or completions request, checked field by field; tokenized. `ordered`: the same body parsed
// with its key order kept (messages and tools reach the chat template as the client wrote them); null: `body`.
std::optional<ApiError> parse_chat(const json& body, const ParseContext& ctx, ParsedRequest* out,
                                   const nlohmann::ordered_json* ordered = nullptr);
std::optional<ApiError> parse_completion(const json& body, const ParseContext& ctx, ParsedRequest* out,
                                         const nlohmann::ordered_json* ordered = nullptr);
// A grammar-layer error (a schema keyword that cannot be enforced, GBNF syntax, a limit) as the 400 naming the
// request field it came from.
ApiError grammar_error(const std::string& param, const Status& st);
// Maps a Scheduler::submit error (its message starts with the field) to an OpenAI error.
ApiError submit_error(const Status& st);

// One choice of a response as it is built from the token events.
struct ChoiceState {
  int index = 0;
  std::string text;
  json logprobs = json::array();   // chat: content entries; completions: built at the end
  std::vector<int32_t> ids;
  std::vector<float> lps;
  std::vector<std::vector<TokenLogprob>> tops;
  FinishReason finish = FinishReason::kNone;
  RequestTimings timings;
  bool role_sent = false;
  std::shared_ptr<ReplyStream> reply;  // chat with split replies: the streamed split
  bool tool_calls = false;             // the reply ended in tool calls (finish_reason "tool_calls")
};

// Response pieces.
const char* finish_name(FinishReason r);  // OpenAI's: "stop" | "length" (cancelled/error never reach a client)
json usage_json(const std::vector<ChoiceState>& choices, const std::vector<int64_t>& prompt_tokens);
json timings_json(const std::vector<ChoiceState>& choices);
json chat_logprob_entry(const Tokenizer& tok, int32_t id, float lp, const std::vector<TokenLogprob>& top);
// The assistant message of a finished chat choice: content, reasoning_content and tool_calls split from its text
// when the request splits replies (then c->tool_calls says whether finish_reason is "tool_calls").
json chat_message(const ParsedRequest& pr, ChoiceState* c);
// OpenAI's tool_calls entries (function.arguments a JSON string).
json tool_calls_json(const std::vector<tpl::ToolCall>& calls);
// The streamed form: the `delta.tool_calls` arrays of successive chunks, as OpenAI streams them: per call, one with
// its index, id, type and function name (arguments ""), then one with the index and the arguments.
std::vector<json> tool_call_deltas(const std::vector<tpl::ToolCall>& calls);
json completion_logprobs(const Tokenizer& tok, const ChoiceState& c);

}  // namespace kiln::server

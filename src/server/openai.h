// OpenAI request schemas for kiln serve: parsing and checking the JSON of /v1/chat/completions, /v1/completions,
// /tokenize and /detokenize (every error an OpenAI error body naming the parameter), tokenizing prompts, and the
// response / stream-chunk JSON. No HTTP here (server.cpp) and no compute (runtime/scheduler.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/scheduler.h"
#include "tokenizer/chat_template.h"
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
  ChatFormat format = ChatFormat::kChatML;
  int64_t max_seq_ctx = 0;      // tokens one sequence may hold
  std::string model_id;         // what /v1/models lists; "model" must name it (or be absent)
  double timeout_s = 0;         // per request
  int32_t default_max_tokens = -1;
  SamplerParams sampling;       // the server's defaults (kiln serve's sampling flags); a request overrides them
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int n = 1;                                    // choices per prompt
  std::vector<std::vector<int32_t>> prompts;    // one per prompt (completions may batch several)
  GenRequest gen;                               // everything but the prompt
  std::string model;
};

// The body of a chat or completions request, checked field by field; tokenized.
std::optional<ApiError> parse_chat(const json& body, const ParseContext& ctx, ParsedRequest* out);
std::optional<ApiError> parse_completion(const json& body, const ParseContext& ctx, ParsedRequest* out);
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
};

// Response pieces.
const char* finish_name(FinishReason r);  // OpenAI's: "stop" | "length" (cancelled/error never reach a client)
json usage_json(const std::vector<ChoiceState>& choices, const std::vector<int64_t>& prompt_tokens);
json timings_json(const std::vector<ChoiceState>& choices);
json chat_logprob_entry(const Tokenizer& tok, int32_t id, float lp, const std::vector<TokenLogprob>& top);
json completion_logprobs(const Tokenizer& tok, const ChoiceState& c);

}  // namespace kiln::server

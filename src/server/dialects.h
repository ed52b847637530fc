// The request bodies of Anthropic's /v1/messages and OpenAI's /v1/responses, checked field by field and turned into
// the body of a /v1/chat/completions request (which parse_chat then renders and tokenizes: one engine path). No
// HTTP here (anthropic.cpp and responses.cpp serve them).
#pragma once

#include <optional>
#include <string>

#include "server/fields.h"

namespace kiln::server {

// What a messages request asks beyond its chat body.
struct MessagesOptions {
  bool stream = false;
  bool show_thinking = true;       // thinking blocks for the model's reasoning ("thinking": {"type": "disabled"}: none)
  bool single_tool_call = false;   // tool_choice.disable_parallel_tool_use: only the first tool_use block
};
// counting: /v1/messages/count_tokens (no max_tokens, no sampling fields). Errors name the Anthropic field.
std::optional<ApiError> messages_to_chat(const ojson& body, bool counting, ojson* chat, MessagesOptions* opts);

// What a responses request asks beyond its chat body (echoed in the response object).
struct ResponsesOptions {
  bool stream = false;
  bool parallel_tool_calls = true;    // false: only the first function_call item
  ojson echo = ojson::object();       // instructions, tools, tool_choice, temperature, ... as the client sent them
  std::string effort;                 // reasoning.effort ("": none given), checked against reasoning_effort's levels
};
std::optional<ApiError> responses_to_chat(const ojson& body, ojson* chat, ResponsesOptions* opts);

}  // namespace kiln::server

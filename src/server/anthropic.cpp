// POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over the chat engine path: the body
// becomes a chat completions body (anthropic_parse.cpp), parse_chat renders it with the model's template, and the
// reply comes back as content blocks: thinking (the model's reasoning), text, tool_use. Errors are Anthropic's
// {"type": "error", "error": {"type", "message"}} (message naming the field).
#include <httplib.h>

#include "server/dialects.h"
#include "server/generation.h"

namespace kiln::server {

namespace {

using httplib::Request;
using httplib::Response;

const char* anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

json anthropic_error(const ApiError& e) {
  json err = {{"type", anthropic_error_type(e.status)}, {"message", e.message}};
  if (!e.param.empty()) err["param"] = e.param;
  return json{{"type", "error"}, {"error", err}};
}

// stop_reason and stop_sequence of a finished reply.
std::pair<const char*, json> stop_of(const ChatGeneration& g, bool tool_calls) {
  if (tool_calls) return {"tool_use", nullptr};
  if (g.finish() == FinishReason::kLength) return {"max_tokens", nullptr};
  if (g.stop() == StopReason::kStopString) return {"stop_sequence", g.stop_string()};
  return {"end_turn", nullptr};
}

json usage_of(const ChatGeneration& g) {
  const RequestTimings& t = g.timings();
  return json{{"input_tokens", g.prompt_tokens() - t.n_cached},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", t.n_cached},
              {"output_tokens", t.n_gen}};
}

json tool_use_block(const tpl::ToolCall& c) {
  json input = json::object();
  try {
    input = json::parse(c.arguments);
  } catch (const json::exception&) {
  }  // parse_reply writes arguments as a JSON object; anything else is an empty input
  if (!input.is_object()) input = json::object();
  return json{{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input}};
}

json message_response(const std::string& id, const MessagesOptions& o, const ChatGeneration& g,
                      const tpl::ParsedReply& r) {
  json content = json::array();
  if (o.show_thinking && !r.reasoning_content.empty())
    content.push_back({{"type", "thinking"}, {"thinking", r.reasoning_content}, {"signature", ""}});
  if (!r.content.empty()) content.push_back({{"type", "text"}, {"text", r.content}});
  const size_t n_calls = o.single_tool_call ? std::min<size_t>(1, r.tool_calls.size()) : r.tool_calls.size();
  for (size_t k = 0; k < n_calls; ++k) content.push_back(tool_use_block(r.tool_calls[k]));
  const auto [reason, seq] = stop_of(g, n_calls > 0);
  return json{{"id", id},           {"type", "message"},   {"role", "assistant"},
              {"model", g.request().model}, {"content", content}, {"stop_reason", reason},
              {"stop_sequence", seq}, {"usage", usage_of(g)}};
}

// The event stream: message_start, then per content block content_block_start / _delta... / _stop (a thinking
// block for reasoning, a text block for content, a tool_use block per call, in the order they come), then
// message_delta (stop_reason, usage) and message_stop.
class MessagesWriter : public StreamWriter {
 public:
  MessagesWriter(std::string id, MessagesOptions o) : id_(std::move(id)), o_(o) {}

  std::string begin(const ChatGeneration& g) override {
    json m = {{"id", id_},
              {"type", "message"},
              {"role", "assistant"},
              {"model", g.request().model},
              {"content", json::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", g.prompt_tokens()}, {"output_tokens", 0}}}};
    return sse("message_start", {{"type", "message_start"}, {"message", m}});
  }

  std::string delta(const ReplyStream::Delta& d) override {
    std::string s;
    if (o_.show_thinking && !d.reasoning.empty()) {
      s += open(kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      s += block_delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    if (!d.content.empty()) {
      s += open(kText, {{"type", "text"}, {"text", ""}});
      s += block_delta({{"type", "text_delta"}, {"text", d.content}});
    }
    return s;
  }

  std::string end(const ChatGeneration& g, const ReplyStream::Delta& rest) override {
    std::string s = close();
    const size_t n_calls = o_.single_tool_call ? std::min<size_t>(1, rest.tool_calls.size()) : rest.tool_calls.size();
    for (size_t k = 0; k < n_calls; ++k) {
      json start = tool_use_block(rest.tool_calls[k]);
      const std::string args = dump(start["input"]);
      start["input"] = json::object();
      s += open(kToolUse, start);
      s += block_delta({{"type", "input_json_delta"}, {"partial_json", args}});
      s += close();
    }
    const auto [reason, seq] = stop_of(g, n_calls > 0);
    s += sse("message_delta", {{"type", "message_delta"},
                               {"delta", {{"stop_reason", reason}, {"stop_sequence", seq}}},
                               {"usage", usage_of(g)}});
    return s + sse("message_stop", {{"type", "message_stop"}});
  }

  std::string error(const ApiError& e) override { return sse("error", anthropic_error(e)); }
  std::string keep_alive() override { return sse("ping", {{"type", "ping"}}); }

 private:
  enum Block { kNone, kThinking, kText, kToolUse };

  // Opens a block of kind b (closing another kind first); "" when one of that kind is open already.
  std::string open(Block b, const json& content_block) {
    if (open_ == b && b != kToolUse) return "";
    std::string s = close();
    open_ = b;
    ++index_;
    return s + sse("content_block_start",
                   {{"type", "content_block_start"}, {"index", index_}, {"content_block", content_block}});
  }
  std::string close() {
    if (open_ == kNone) return "";
    std::string s;
    if (open_ == kThinking) s = block_delta({{"type", "signature_delta"}, {"signature", ""}});
    open_ = kNone;
    return s + sse("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  }
  std::string block_delta(const json& d) const {
    return sse("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }

  std::string id_;
  MessagesOptions o_;
  Block open_ = kNone;
  int index_ = -1;
};

// The body as a chat request parsed into *pr (errors name the Anthropic field, or 'messages' for the rendering).
std::optional<ApiError> parse_messages(RouteHost& host, const Request& req, bool counting, ParsedRequest* pr,
                                       MessagesOptions* o) {
  try {
    const ojson body = ojson::parse(req.body);
    ojson chat;
    if (auto e = messages_to_chat(body, counting, &chat, o)) return e;
    if (counting && !chat.contains("max_tokens")) chat["max_tokens"] = 1;
    return parse_chat(json::parse(chat.dump()), host.parse_context(), pr, &chat);
  } catch (const std::exception& x) {  // a JSON type surprise the checks missed: still the client's fault
    return field_error("", std::string("bad request: ") + x.what());
  }
}

void messages(RouteHost& host, const Request& req, Response& res, bool counting) {
  auto sr = std::make_shared<ServedRequest>(host, req);
  const std::string id = "msg_" + std::to_string(sr->id);
  MessagesOptions o;
  Dialect d;
  d.error_body = [](const ApiError& e) { return dump(anthropic_error(e)); };
  json body;
  if (auto e = host.gate(req, &body)) return send_dialect_error(d, res, *e, sr.get());
  ParsedRequest pr;
  if (auto e = parse_messages(host, req, counting, &pr, &o)) return send_dialect_error(d, res, *e, sr.get());
  if (counting) {
    res.set_content(dump(json{{"input_tokens", static_cast<int64_t>(pr.prompts.at(0).size())}}), "application/json");
    return;
  }
  d.response = [id, o](const ChatGeneration& g, const tpl::ParsedReply& r) { return message_response(id, o, g, r); };
  d.writer = [id, o] { return std::make_unique<MessagesWriter>(id, o); };
  serve_generation(host, res, std::move(pr), o.stream, d, sr);
}

}  // namespace

void add_anthropic_routes(httplib::Server& http, RouteHost& host) {
  http.Post("/v1/messages", [&host](const Request& q, Response& r) { messages(host, q, r, false); });
  http.Post("/v1/messages/count_tokens", [&host](const Request& q, Response& r) { messages(host, q, r, true); });
}

}  // namespace kiln::server

// POST /v1/responses (OpenAI's Responses API, stateless) over the chat engine path: the body becomes a chat
// completions body (responses_parse.cpp), and the reply comes back as output items: reasoning (the model's
// reasoning, as reasoning_text content), message (output_text), function_call per tool call. Streamed as the
// Responses events, each with its sequence_number. Errors are OpenAI error bodies naming the field.
#include <httplib.h>

#include <ctime>

#include "server/dialects.h"
#include "server/generation.h"

namespace kiln::server {

namespace {

using httplib::Request;
using httplib::Response;

struct Ids {
  std::string resp, msg, rs, fc;  // resp_N, msg_N, rs_N, fc_N (function calls: fc_N_K)
  int64_t created = 0;
};

json usage_of(const ChatGeneration& g) {
  const RequestTimings& t = g.timings();
  return json{{"input_tokens", g.prompt_tokens()},
              {"input_tokens_details", {{"cached_tokens", t.n_cached}}},
              {"output_tokens", t.n_gen},
              {"output_tokens_details", {{"reasoning_tokens", t.n_reasoning}}},
              {"total_tokens", g.prompt_tokens() + t.n_gen}};
}

// The response object; output empty and status "in_progress" before the end (g null).
json response_object(const Ids& ids, const ResponsesOptions& o, const std::string& model, const ChatGeneration* g,
                     const json& output) {
  json r = {{"id", ids.resp},     {"object", "response"}, {"created_at", ids.created}, {"status", "in_progress"},
            {"model", model},     {"output", output},     {"error", nullptr},          {"incomplete_details", nullptr},
            {"instructions", nullptr}, {"tools", json::array()}, {"tool_choice", "auto"},
            {"parallel_tool_calls", o.parallel_tool_calls}, {"store", false}, {"previous_response_id", nullptr},
            {"truncation", "disabled"}, {"metadata", json::object()}, {"text", {{"format", {{"type", "text"}}}}},
            {"usage", nullptr}};
  for (auto it = o.echo.begin(); it != o.echo.end(); ++it) r[it.key()] = json::parse(it.value().dump());
  if (!g) return r;
  const bool cut = g->finish() == FinishReason::kLength;
  r["status"] = cut ? "incomplete" : "completed";
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage_of(*g);
  return r;
}

json reasoning_item(const Ids& ids, const std::string& text, const char* status) {
  json content = json::array();
  if (!text.empty() || std::string(status) == "completed") content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return json{{"id", ids.rs},       {"type", "reasoning"}, {"summary", json::array()},
              {"content", content}, {"encrypted_content", ""}, {"status", status}};
}
json text_part(const std::string& text) {
  return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}
json message_item(const Ids& ids, const std::string& text, const char* status) {
  json content = json::array();
  if (std::string(status) == "completed") content.push_back(text_part(text));
  return json{{"id", ids.msg}, {"type", "message"}, {"role", "assistant"}, {"status", status}, {"content", content}};
}
json call_item(const Ids& ids, size_t k, const tpl::ToolCall& c, const char* status, bool with_args) {
  return json{{"id", ids.fc + "_" + std::to_string(k)}, {"type", "function_call"}, {"call_id", c.id},
              {"name", c.name}, {"arguments", with_args ? c.arguments : ""}, {"status", status}};
}

size_t n_calls(const ResponsesOptions& o, const std::vector<tpl::ToolCall>& calls) {
  return o.parallel_tool_calls ? calls.size() : std::min<size_t>(1, calls.size());
}

json full_response(const Ids& ids, const ResponsesOptions& o, const ChatGeneration& g, const tpl::ParsedReply& r) {
  json output = json::array();
  if (!r.reasoning_content.empty()) output.push_back(reasoning_item(ids, r.reasoning_content, "completed"));
  if (!r.content.empty()) output.push_back(message_item(ids, r.content, "completed"));
  for (size_t k = 0; k < n_calls(o, r.tool_calls); ++k) output.push_back(call_item(ids, k, r.tool_calls[k], "completed", true));
  return response_object(ids, o, g.request().model, &g, output);
}

// The event stream: response.created, response.in_progress; per output item output_item.added, (content_part.added,
// the text deltas, the text's .done, content_part.done) or (function_call_arguments.delta / .done),
// output_item.done; then response.completed (or response.incomplete when max_output_tokens cut the reply).
class ResponsesWriter : public StreamWriter {
 public:
  ResponsesWriter(Ids ids, ResponsesOptions o) : ids_(std::move(ids)), o_(std::move(o)) {}

  std::string begin(const ChatGeneration& g) override {
    const json r = response_object(ids_, o_, g.request().model, nullptr, json::array());
    std::string s = event("response.created", {{"response", r}});
    return s + event("response.in_progress", {{"response", r}});
  }

  std::string delta(const ReplyStream::Delta& d) override {
    std::string s;
    if (!d.reasoning.empty()) {
      if (open_ != kReasoning) s += open(kReasoning, reasoning_item(ids_, "", "in_progress"), {{"type", "reasoning_text"}, {"text", ""}});
      text_ += d.reasoning;
      s += event("response.reasoning_text.delta", part_ref(ids_.rs, {{"delta", d.reasoning}}));
    }
    if (!d.content.empty()) {
      if (open_ != kMessage) s += open(kMessage, message_item(ids_, "", "in_progress"), text_part(""));
      text_ += d.content;
      s += event("response.output_text.delta", part_ref(ids_.msg, {{"delta", d.content}, {"logprobs", json::array()}}));
    }
    return s;
  }

  std::string end(const ChatGeneration& g, const ReplyStream::Delta& rest) override {
    std::string s = close();
    for (size_t k = 0; k < n_calls(o_, rest.tool_calls); ++k) {
      const tpl::ToolCall& c = rest.tool_calls[k];
      const std::string id = ids_.fc + "_" + std::to_string(k);
      const int idx = static_cast<int>(output_.size());
      s += event("response.output_item.added", {{"output_index", idx}, {"item", call_item(ids_, k, c, "in_progress", false)}});
      s += event("response.function_call_arguments.delta", {{"item_id", id}, {"output_index", idx}, {"delta", c.arguments}});
      s += event("response.function_call_arguments.done",
                 {{"item_id", id}, {"output_index", idx}, {"name", c.name}, {"arguments", c.arguments}});
      output_.push_back(call_item(ids_, k, c, "completed", true));
      s += event("response.output_item.done", {{"output_index", idx}, {"item", output_.back()}});
    }
    const json r = response_object(ids_, o_, g.request().model, &g, output_);
    return s + event(r["status"] == "completed" ? "response.completed" : "response.incomplete", {{"response", r}});
  }

  std::string error(const ApiError& e) override {
    return event("error", {{"code", e.code.empty() ? json(nullptr) : json(e.code)}, {"message", e.message},
                           {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
  }

 private:
  enum Item { kNone, kReasoning, kMessage };

  std::string event(const std::string& type, json data) {
    data["type"] = type;
    data["sequence_number"] = seq_++;
    return sse(type, data);
  }
  json part_ref(const std::string& item_id, json extra) const {
    extra["item_id"] = item_id;
    extra["output_index"] = static_cast<int>(output_.size());
    extra["content_index"] = 0;
    return extra;
  }
  std::string open(Item kind, const json& item, const json& part) {
    std::string s = close();
    open_ = kind;
    text_.clear();
    const int idx = static_cast<int>(output_.size());
    s += event("response.output_item.added", {{"output_index", idx}, {"item", item}});
    return s + event("response.content_part.added", part_ref(item["id"], {{"part", part}}));
  }
  std::string close() {
    if (open_ == kNone) return "";
    const bool reasoning = open_ == kReasoning;
    const std::string& id = reasoning ? ids_.rs : ids_.msg;
    const json item = reasoning ? reasoning_item(ids_, text_, "completed") : message_item(ids_, text_, "completed");
    std::string s = event(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                          part_ref(id, {{"text", text_}}));
    s += event("response.content_part.done", part_ref(id, {{"part", item["content"][0]}}));
    s += event("response.output_item.done", {{"output_index", static_cast<int>(output_.size())}, {"item", item}});
    output_.push_back(item);
    open_ = kNone;
    return s;
  }

  Ids ids_;
  ResponsesOptions o_;
  Item open_ = kNone;
  std::string text_;           // the open item's text so far
  json output_ = json::array();  // the items done
  int64_t seq_ = 0;
};

std::optional<ApiError> parse_responses(RouteHost& host, const Request& req, ParsedRequest* pr, ResponsesOptions* o) {
  try {
    const ojson body = ojson::parse(req.body);
    ojson chat;
    if (auto e = responses_to_chat(body, &chat, o)) return e;
    auto e = parse_chat(json::parse(chat.dump()), host.parse_context(), pr, &chat);
    if (e && e->param == "max_tokens") {  // the chat field's checks, under this API's names
      e->param = "max_output_tokens";
      const size_t at = e->message.find("'max_tokens'");
      if (at != std::string::npos) e->message.replace(at, 12, "'max_output_tokens'");
    }
    if (e && e->param == "messages") e->param = "input";  // the rendered conversation: too long, template error
    return e;
  } catch (const std::exception& x) {  // a JSON type surprise the checks missed: still the client's fault
    return field_error("", std::string("bad request: ") + x.what());
  }
}

void responses(RouteHost& host, const Request& req, Response& res) {
  auto sr = std::make_shared<ServedRequest>(host, req);
  const std::string n = std::to_string(sr->id);
  Ids ids{"resp_" + n, "msg_" + n, "rs_" + n, "fc_" + n, static_cast<int64_t>(std::time(nullptr))};
  Dialect d;
  d.error_body = [](const ApiError& e) { return dump(error_body(e)); };
  json body;
  if (auto e = host.gate(req, &body)) return send_dialect_error(d, res, *e, sr.get());
  ParsedRequest pr;
  ResponsesOptions o;
  if (auto e = parse_responses(host, req, &pr, &o)) return send_dialect_error(d, res, *e, sr.get());
  d.response = [ids, o](const ChatGeneration& g, const tpl::ParsedReply& r) { return full_response(ids, o, g, r); };
  d.writer = [ids, o] { return std::make_unique<ResponsesWriter>(ids, o); };
  serve_generation(host, res, std::move(pr), o.stream, d, sr);
}

}  // namespace

void add_responses_routes(httplib::Server& http, RouteHost& host) {
  http.Post("/v1/responses", [&host](const Request& q, Response& r) { responses(host, q, r); });
}

}  // namespace kiln::server

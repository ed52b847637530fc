// One chat reply served in another API's shape (Anthropic messages, OpenAI responses): the parsed chat request is
// submitted to the engine loop as /v1/chat/completions submits it, and its tokens come back split into reasoning,
// content and tool calls (runtime/prompt.h's ReplyStream) for the dialect's writer to shape. One choice (n = 1).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/client_socket.h"
#include "server/openai.h"
#include "server/routes.h"

namespace kiln::server {

class ChatGeneration {
 public:
  // pr: a chat request parsed by parse_chat with one prompt. Errors: the engine loop refused it (submit_error).
  static std::optional<ApiError> start(Scheduler& sched, ParsedRequest pr, std::shared_ptr<ChatGeneration>* out);
  ~ChatGeneration();  // a request still running is cancelled (the client went away)

  // Waits up to `wait` for tokens; what arrived is appended to *d, split. Returns false once the reply ended: *d
  // then also holds the rest of the split and the tool calls.
  bool next(ReplyStream::Delta* d, std::chrono::milliseconds wait);
  // Blocks until the reply ended; the whole reply split (as /v1/chat/completions splits it).
  tpl::ParsedReply wait_all();
  void cancel();

  // After the end:
  bool failed(std::string* msg) const;  // an engine error, or cancelled by the shutdown
  FinishReason finish() const { return finish_; }
  StopReason stop() const { return stop_; }
  const std::string& stop_string() const { return stop_string_; }  // the stop string that matched
  const RequestTimings& timings() const { return timings_; }
  int64_t prompt_tokens() const { return static_cast<int64_t>(pr_.prompts[0].size()); }
  const ParsedRequest& request() const { return pr_; }
  const std::string& text() const { return text_; }  // the raw reply
  const std::shared_ptr<RequestHandle>& handle() const { return h_; }

 private:
  void ended();
  void add(ReplyStream::Delta* d, const std::string& piece);

  ParsedRequest pr_;
  std::shared_ptr<RequestHandle> h_;
  std::unique_ptr<ReplyStream> reply_;  // null when replies are not split: all text is content
  std::string text_;
  FinishReason finish_ = FinishReason::kNone;
  StopReason stop_ = StopReason::kNone;
  std::string stop_string_;
  RequestTimings timings_;
  Status error_;
  bool done_ = false;
};

// A dialect's server-sent events for one generation. Each call returns the SSE text to write ("" for none).
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  virtual std::string begin(const ChatGeneration& g) = 0;  // before any token
  virtual std::string delta(const ReplyStream::Delta& d) = 0;
  // The reply ended (its last text already went through delta()): rest.tool_calls are the reply's tool calls;
  // then the closing events.
  virtual std::string end(const ChatGeneration& g, const ReplyStream::Delta& rest) = 0;
  virtual std::string error(const ApiError& e) = 0;
  virtual std::string keep_alive() { return ": keep-alive\n\n"; }
};

// A request of a generating endpoint, from the gate on: its id, log line and in-flight count (the log line is
// written when the last owner lets go, with the generation's timings when there is one).
struct ServedRequest {
  RouteHost* host;
  uint64_t id;
  std::string method, path;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  int status = 200;
  std::shared_ptr<ChatGeneration> gen;
  bool ended = false;
  ClientWatch client;  // a non-streamed answer watches for a hang-up while it waits

  ServedRequest(RouteHost& h, const httplib::Request& req);
  ~ServedRequest();
};

// How a dialect answers: its error body, its non-streamed body, its stream writer.
struct Dialect {
  std::function<std::string(const ApiError&)> error_body;
  std::function<json(const ChatGeneration&, const tpl::ParsedReply&)> response;
  std::function<std::unique_ptr<StreamWriter>()> writer;
};

// Sends e in the dialect's shape and logs the request.
void send_dialect_error(const Dialect& d, httplib::Response& res, const ApiError& e, ServedRequest* sr);
// Starts pr and answers: the whole response, or the stream of events (a client that hangs up cancels it).
void serve_generation(RouteHost& host, httplib::Response& res, ParsedRequest pr, bool stream, const Dialect& d,
                      std::shared_ptr<ServedRequest> sr);

// Server-sent event text: "event: NAME\ndata: JSON\n\n" (NAME empty: the data line alone).
std::string sse(const std::string& event, const json& data);

}  // namespace kiln::server

// The endpoints beyond OpenAI's chat and completions, each family in its own file: Anthropic's /v1/messages
// (anthropic.cpp), OpenAI's /v1/responses (responses.cpp), embeddings and reranking (embeddings.cpp), llama-server's
// /props, /apply-template, /slots, /completion and /infill (llama_routes.cpp), the chat page at / (webui.cpp). They
// reach the server through RouteHost (server.cpp implements it) and the engine
// through ChatGeneration (generation.h), so chat, messages and responses share one engine path.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "server/openai.h"
#include "server/server.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kiln::server {

class RouteHost {
 public:
  virtual ~RouteHost() = default;
  // Ready (else 503 model_loading), not shutting down (503), and when body is not null a JSON object body.
  virtual std::optional<ApiError> gate(const httplib::Request& req, json* body) = 0;
  virtual Scheduler* scheduler() = 0;             // null until the model is loaded
  virtual const ParseContext& parse_context() const = 0;
  virtual const ServerConfig& config() const = 0;
  virtual uint64_t next_request_id() = 0;
  // One request log line and the HTTP counters (t: the generation's timings, null for other requests).
  virtual void log(uint64_t id, const httplib::Request& req, int status, const RequestTimings* t, double ms,
                   const char* finish) = 0;
  virtual std::atomic<int64_t>& in_flight_count() = 0;  // streams and requests running (graceful shutdown waits)
  // The request's output constraint (a forced tool call's grammar included) compiled and set as its token mask;
  // a compile error is the 400 naming the constraint's field.
  virtual std::optional<ApiError> compile_grammar(ParsedRequest* pr) = 0;
};

void add_anthropic_routes(httplib::Server& http, RouteHost& host);
void add_responses_routes(httplib::Server& http, RouteHost& host);
void add_llama_routes(httplib::Server& http, RouteHost& host);
void add_embedding_routes(httplib::Server& http, RouteHost& host);
void add_webui_route(httplib::Server& http, RouteHost& host);

}  // namespace kiln::server

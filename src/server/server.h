// kiln serve's HTTP side (cpp-httplib): routes, auth, body limits, OpenAI error bodies, SSE streaming, /metrics,
// request logs. HTTP threads parse, check, tokenize, submit to the Scheduler and stream its token channels; the
// scheduler's engine thread does all compute. The server starts listening before the model is loaded (/health
// answers 503 until set_ready()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/prompt.h"
#include "runtime/scheduler.h"
#include "util/status.h"

namespace kiln::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port (port() says which)
  std::string api_key;                   // empty: no auth
  size_t max_body = 8u << 20;            // request body limit (413 above)
  double timeout_s = 600;                // per request: generation stops (finish "length") after this long
  int http_threads = 0;                  // 0: max(64, 4 * parallel + 16)
  std::string model_id = "kiln";         // the id /v1/models lists
  bool strict_model = false;             // a request naming another model gets 404 (else any name is accepted)
  std::string cors_origin;               // Access-Control-Allow-Origin for browsers ("*" or an origin); "": no CORS
  bool slots = false;                    // GET /slots (per-sequence state) is served
  bool webui = true;                     // GET / serves the chat page
  std::string build = "";                // the build string /props reports
  ChatPromptOptions chat;                // how chat requests render (runtime/prompt.h: the model's template,
                                         // --chat-template-file, --chat-template NAME; no template: chatml)
  int32_t default_max_new_tokens = -1;   // when a request names none (-1: until EOG or the context is full)
  bool log_requests = true;              // one line per request on stderr
  int parallel = 4;                      // for the thread count
  SamplerParams sampling;                // defaults of the sampling fields
  int32_t reasoning_budget = -1;         // --reasoning-budget: a request's default (runtime/reasoning.h)
  std::string reasoning_budget_message;  // --reasoning-budget-message: a request's default
};

class Server {
 public:
  explicit Server(ServerConfig cfg);
  ~Server();

  // Binds host:port (the error names them); then run() serves until stop().
  Status bind();
  int port() const;
  void run();
  // The model is loaded: the endpoints open (until then 503 "loading model"). Errors: the chat template does not
  // parse (the message names its line and column); the endpoints stay closed.
  Status set_ready(Scheduler* sched);
  // Graceful shutdown, first step: new requests get 503 while running ones finish.
  void begin_shutdown();
  // Streams and requests still running.
  int64_t in_flight() const;
  // Stops listening and returns from run() once the handlers are done.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server

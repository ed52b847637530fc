#include "server/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/grammar_mask.h"
#include "server/client_socket.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/routes.h"

namespace kiln::server {

using Clock = std::chrono::steady_clock;
using httplib::Request;
using httplib::Response;

namespace {

// Constant-time comparison (the time does not depend on where the strings differ).
bool ct_equal(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

const char* endpoint_of(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                "/tokenize", "/detokenize", "/v1/messages", "/v1/messages/count_tokens",
                                "/v1/responses", "/props", "/apply-template", "/slots", "/infill", "/completion",
                                "/v1/embeddings", "/embedding", "/embeddings", "/v1/rerank", "/rerank", "/reranking",
                                "/v1/reranking",
                                "/"};
  for (const char* k : known)
    if (path == k) return k;
  return "other";
}

// CORS (--cors-origin): every response names the allowed origin; a preflight OPTIONS is answered with the methods
// and the request headers the browser asked for. Without an origin OPTIONS still answers (204, no CORS headers),
// so browsers keep the API closed to other pages.
void add_cors(httplib::Server& http, const std::string& origin) {
  if (!origin.empty())
    http.set_post_routing_handler([origin](const Request&, Response& res) {
      res.set_header("Access-Control-Allow-Origin", origin);
      if (origin != "*") res.set_header("Vary", "Origin");
    });
  http.Options(R"(/.*)", [origin](const Request& req, Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    std::string headers = req.get_header_value("Access-Control-Request-Headers");
    if (headers.empty() || headers.find_first_of("\r\n") != std::string::npos)
      headers = "Authorization, Content-Type, X-Api-Key, Anthropic-Version";
    res.set_header("Access-Control-Allow-Headers", headers);
    res.set_header("Access-Control-Max-Age", "86400");
  });
}

// httplib listens with a backlog of 5 (compiled into the library): a burst of concurrent clients would see dropped
// connections. Linux lets listen() be called again on the bound socket to raise it.
struct HttpServer : httplib::Server {
  void raise_backlog(int n) { ::listen(svr_sock_, n); }
};

}  // namespace

struct Exchange;

struct Server::Impl : RouteHost {
  ServerConfig cfg;
  HttpServer http;
  std::atomic<Scheduler*> sched{nullptr};
  std::atomic<bool> draining{false};
  // run() returned. stop() must not run in the window before httplib marks its loop running (its stop() is a no-op
  // then, and the listener would never return).
  std::atomic<bool> run_done{false};
  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> next_id{1};
  int bound_port = -1;
  ParseContext pctx;
  std::unique_ptr<ChatPrompt> chat;  // set_ready: how chat requests render (pctx.chat points here)
  std::unique_ptr<GrammarCache> grammars;  // set_ready: output constraints compiled for the model's vocabulary
  HttpCounters counters;
  Clock::time_point started = Clock::now();
  std::mutex log_mu;

  void log(uint64_t id, const Request& req, int status, const RequestTimings* t, double ms,
           const char* finish) override {
    counters.count(endpoint_of(req.path), status);
    if (!cfg.log_requests) return;
    char buf[512];
    if (t)
      std::snprintf(buf, sizeof buf,
                    "kiln serve: req %llu %s %s %d prompt %lld (cached %lld) gen %lld tokens %.1f ms finish %s\n",
                    (unsigned long long)id, req.method.c_str(), endpoint_of(req.path), status, (long long)t->n_prompt,
                    (long long)t->n_cached, (long long)t->n_gen, ms, finish);
    else
      std::snprintf(buf, sizeof buf, "kiln serve: req %llu %s %s %d %.1f ms\n", (unsigned long long)id,
                    req.method.c_str(), endpoint_of(req.path), status, ms);
    std::lock_guard<std::mutex> lk(log_mu);
    std::fputs(buf, stderr);
  }

  void send_error(Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_body(e)), "application/json");
  }

  // Common gate of the model endpoints: ready, not shutting down, JSON object body.
  std::optional<ApiError> gate(const Request& req, json* body) override {
    if (!sched.load()) {
      ApiError e;
      e.status = 503;
      e.type = "unavailable_error";
      e.code = "model_loading";
      e.message = "Loading model";
      return e;
    }
    if (draining.load()) {
      ApiError e;
      e.status = 503;
      e.type = "unavailable_error";
      e.code = "shutting_down";
      e.message = "the server is shutting down";
      return e;
    }
    if (!body) return std::nullopt;
    try {
      *body = json::parse(req.body);
    } catch (const json::parse_error& ex) {
      ApiError e;
      e.code = "invalid_json";
      e.message = std::string("the request body is not valid JSON: ") + ex.what();
      return e;
    }
    if (!body->is_object()) {
      ApiError e;
      e.code = "invalid_json";
      e.message = "the request body must be a JSON object";
      return e;
    }
    return std::nullopt;
  }

  Scheduler* scheduler() override { return sched.load(); }
  const ParseContext& parse_context() const override { return pctx; }
  const ServerConfig& config() const override { return cfg; }
  uint64_t next_request_id() override { return next_id.fetch_add(1); }
  std::atomic<int64_t>& in_flight_count() override { return in_flight; }

  void completions(const Request& req, Response& res, bool chat);
  std::optional<ApiError> parse_request(const Request& req, const json& body, bool chat, Exchange* ex);
  std::optional<ApiError> compile_grammar(ParsedRequest* pr) override;
  std::optional<ApiError> submit_all(Scheduler& S, Exchange* ex);
  void tokenize(const Request& req, Response& res);
  void detokenize(const Request& req, Response& res);
};

namespace {

struct InFlight {
  std::atomic<int64_t>& n;
  explicit InFlight(std::atomic<int64_t>& c) : n(c) { ++n; }
  ~InFlight() { --n; }
};

}  // namespace

// The request being answered: its handles and the choices built from their events.
struct Exchange {
  Server::Impl* impl = nullptr;
  uint64_t req_id = 0;
  Request req_copy;  // method and path for the log line (the Request object does not outlive the handler)
  Clock::time_point t0;
  ParsedRequest pr;
  std::string id;
  int64_t created = 0;
  std::vector<std::shared_ptr<RequestHandle>> hs;
  std::vector<ChoiceState> choices;
  std::vector<int64_t> prompt_tokens;
  std::vector<bool> done;
  bool started = false, ended = false;
  Clock::time_point last_write = Clock::now();
  int status = 200;

  ~Exchange() {
    for (auto& h : hs)
      if (!h->finished()) h->cancel();  // the client went away: the blocks are freed at the next step
    if (!impl) return;  // refused before it started: logged by the caller
    RequestTimings sum;
    for (auto& c : choices) {
      sum.n_prompt += c.timings.n_prompt;
      sum.n_cached += c.timings.n_cached;
      sum.n_gen += c.timings.n_gen;
    }
    const char* fin = choices.empty() ? "-" : ended ? finish_name(choices[0].finish) : "disconnected";
    impl->log(req_id, req_copy, status, &sum, ms_since(t0), fin);
    --impl->in_flight;
  }

  void absorb(size_t i, TokenEvent& ev) {
    ChoiceState& c = choices[i];
    c.text += ev.text;
    if (ev.id >= 0 && pr.gen.logprobs) {
      c.ids.push_back(ev.id);
      c.lps.push_back(ev.logprob);
      c.tops.push_back(ev.top);
    }
  }
  void finish(size_t i) {
    choices[i].finish = hs[i]->finish_reason();
    choices[i].timings = hs[i]->timings();
    done[i] = true;
  }
  bool failed(std::string* msg) const {
    for (size_t i = 0; i < hs.size(); ++i) {
      const FinishReason r = choices[i].finish;
      if (r == FinishReason::kError) {
        *msg = hs[i]->error().to_string();
        return true;
      }
      if (r == FinishReason::kCancelled) {
        *msg = "the request was cancelled (the server is shutting down)";
        return true;
      }
    }
    return false;
  }

  json base(const char* object) const {
    return json{{"id", id}, {"object", object}, {"created", created}, {"model", pr.model},
                {"system_fingerprint", "kiln"}};
  }
  json full_response(const Tokenizer& tok) const {
    json r = base(pr.chat ? "chat.completion" : "text_completion");
    json cs = json::array();
    for (const ChoiceState& c : choices) {
      json ch = {{"index", c.index}, {"finish_reason", finish_name(c.finish)}};
      if (pr.chat) {
        ChoiceState split = c;
        ch["message"] = chat_message(pr, &split);
        if (split.tool_calls) ch["finish_reason"] = "tool_calls";
        if (pr.gen.logprobs) {
          json content = json::array();
          for (size_t k = 0; k < c.ids.size(); ++k) content.push_back(chat_logprob_entry(tok, c.ids[k], c.lps[k], c.tops[k]));
          ch["logprobs"] = {{"content", content}};
        } else {
          ch["logprobs"] = nullptr;
        }
      } else {
        ch["text"] = c.text;
        ch["logprobs"] = pr.gen.logprobs ? completion_logprobs(tok, c) : json(nullptr);
      }
      cs.push_back(ch);
    }
    r["choices"] = cs;
    r["usage"] = usage_json(choices, prompt_tokens);
    r["timings"] = timings_json(choices);
    return r;
  }
  std::string chunk(const json& choice, bool with_usage_null) const {
    json r = base(pr.chat ? "chat.completion.chunk" : "text_completion");
    r["choices"] = json::array({choice});
    if (with_usage_null) r["usage"] = nullptr;
    return "data: " + dump(r) + "\n\n";
  }

  // ---- streaming: SSE chunks in OpenAI's format, then data: [DONE] ----
  using Write = std::function<bool(const std::string&)>;

  // The chunk of one token event of choice i ("" text with an id: one chunk per token, its text held back).
  json event_chunk(size_t i, const TokenEvent& ev, const Tokenizer& tok) {
    const bool lp = pr.gen.logprobs && ev.id >= 0;
    json ch = {{"index", choices[i].index}, {"finish_reason", nullptr}};
    if (pr.chat) {
      ChoiceState& cs = choices[i];
      if (cs.reply) {
        // reasoning_content deltas as llama-server sends them; tool-call text is held for the end
        const ReplyStream::Delta d = cs.reply->push(ev.text);
        ch["delta"] = {{"content", d.content}};
        if (!d.reasoning.empty()) ch["delta"]["reasoning_content"] = d.reasoning;
      } else {
        ch["delta"] = {{"content", ev.text}};
      }
      ch["logprobs"] = lp ? json{{"content", json::array({chat_logprob_entry(tok, ev.id, ev.logprob, ev.top)})}}
                          : json(nullptr);
    } else {
      ch["text"] = ev.text;
      if (lp) {
        ChoiceState one;
        one.ids = {ev.id};
        one.lps = {ev.logprob};
        one.tops = {ev.top};
        ch["logprobs"] = completion_logprobs(tok, one);
      } else {
        ch["logprobs"] = nullptr;
      }
    }
    return ch;
  }

  // The end of choice i: an error chunk, or the rest of the reply split, the tool calls, and the finish chunk with
  // usage and timings (llama-server puts them on the last chunk of each choice; OpenAI's include_usage adds a
  // separate usage-only chunk at the end, write_done()).
  bool write_end(size_t i, const Write& write) {
    finish(i);
    const bool usage_null = pr.include_usage;
    const FinishReason r = choices[i].finish;
    if (r == FinishReason::kError || r == FinishReason::kCancelled) {
      std::string msg;
      failed(&msg);
      status = 500;
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = msg;
      return write("data: " + dump(error_body(e)) + "\n\n");
    }
    ChoiceState& cs = choices[i];
    if (pr.chat && cs.reply) {
      // The rest of the split: held content, then the tool calls (per call: its name, then its arguments).
      const ReplyStream::Delta d = cs.reply->finish();
      if (!d.content.empty() || !d.reasoning.empty()) {
        json dc = {{"content", d.content}};
        if (!d.reasoning.empty()) dc["reasoning_content"] = d.reasoning;
        json c0 = {{"index", cs.index}, {"delta", dc}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
        if (!write(chunk(c0, usage_null))) return false;
      }
      if (!d.tool_calls.empty()) cs.tool_calls = true;
      for (json& delta : tool_call_deltas(d.tool_calls)) {
        json c1 = {{"index", cs.index},
                   {"delta", {{"tool_calls", std::move(delta)}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
        if (!write(chunk(c1, usage_null))) return false;
      }
    }
    json ch = {{"index", cs.index}, {"finish_reason", cs.tool_calls ? "tool_calls" : finish_name(r)},
               {"logprobs", nullptr}};
    if (pr.chat) ch["delta"] = json::object();
    else ch["text"] = "";
    json r0 = base(pr.chat ? "chat.completion.chunk" : "text_completion");
    r0["choices"] = json::array({ch});
    std::vector<ChoiceState> one = {choices[i]};
    r0["usage"] = usage_json(one, {choices[i].timings.n_prompt});
    r0["timings"] = timings_json(one);
    return write("data: " + dump(r0) + "\n\n");
  }

  // Every choice ended: the usage-only chunk (include_usage), then [DONE].
  bool write_done(const Write& write) {
    if (pr.include_usage) {
      json u = base(pr.chat ? "chat.completion.chunk" : "text_completion");
      u["choices"] = json::array();
      u["usage"] = usage_json(choices, prompt_tokens);
      u["timings"] = timings_json(choices);
      if (!write("data: " + dump(u) + "\n\n")) return false;
    }
    if (!write("data: [DONE]\n\n")) return false;
    ended = true;
    return true;
  }

  // One call of the content provider: the opening role chunks (chat), then what arrived on every channel. Returns
  // false when a write failed (the client is gone); *all_done once every choice has ended.
  bool pump(const Write& write, const Tokenizer& tok, bool* all_done) {
    const bool usage_null = pr.include_usage;
    if (!started) {
      started = true;
      if (pr.chat)
        for (auto& c : choices) {
          json ch = {{"index", c.index},
                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}};
          if (!write(chunk(ch, usage_null))) return false;
        }
    }
    const auto wait = hs.size() == 1 ? std::chrono::milliseconds(500) : std::chrono::milliseconds(20);
    for (size_t i = 0; i < hs.size(); ++i) {
      if (done[i]) continue;
      std::vector<TokenEvent> evs;
      const bool more = hs[i]->next(evs, wait);
      for (auto& ev : evs) {
        absorb(i, ev);
        if (ev.text.empty() && ev.id < 0) continue;  // one chunk per token (its text may be held back: "")
        if (!write(chunk(event_chunk(i, ev, tok), usage_null))) return false;
      }
      if (!more && !write_end(i, write)) return false;
    }
    bool all = true;
    for (bool d : done) all = all && d;
    *all_done = all;
    if (all) return write_done(write);
    // A comment line now and then: a client that hung up makes the write fail, which cancels the request.
    if (Clock::now() - last_write > std::chrono::milliseconds(1000)) return write(": keep-alive\n\n");
    return true;
  }
};

// The body parsed and checked into ex->pr (errors name the field); null when it is a valid request.
std::optional<ApiError> Server::Impl::parse_request(const Request& req, const json& body, bool chat, Exchange* ex) {
  try {
    // The same body with its key order (tools' JSON schemas reach the template, and a response schema's properties
    // the output, as the client wrote them).
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(req.body);
    if (chat) return parse_chat(body, pctx, &ex->pr, &ordered);
    return parse_completion(body, pctx, &ex->pr, &ordered);
  } catch (const std::exception& x) {  // a JSON type surprise the checks missed: still the client's fault
    ApiError e;
    e.message = std::string("bad request: ") + x.what();
    return e;
  }
}

// The request's output constraint compiled for the model (cached by its GBNF text: the first request with a new
// schema pays the compile, on this HTTP thread) and set as every choice's token mask (lazy for tool_choice "auto").
std::optional<ApiError> Server::Impl::compile_grammar(ParsedRequest* pr) {
  if (!pr->grammar) return std::nullopt;
  auto g = grammars->get(pr->grammar->gbnf, pr->gen.text_tokens);
  if (!g && pr->grammar->optional) return std::nullopt;
  if (!g) return grammar_error(pr->grammar->param, g.status());
  if (const tpl::ToolFormat* f = pr->grammar->lazy)
    pr->gen.hooks = lazy_grammar_hooks(std::move(g).value(),
                                       GrammarTriggers{{f->trigger}, f->at_start, f->lead, pr->grammar->trigger_prefix});
  else
    pr->gen.hooks = grammar_hooks(std::move(g).value());
  return std::nullopt;
}

// One request to the engine loop per prompt and choice (n); a refusal cancels those already submitted.
std::optional<ApiError> Server::Impl::submit_all(Scheduler& S, Exchange* ex) {
  for (size_t p = 0; p < ex->pr.prompts.size(); ++p) {
    ex->prompt_tokens.push_back(static_cast<int64_t>(ex->pr.prompts[p].size()));
    for (int k = 0; k < ex->pr.n; ++k) {
      GenRequest g = ex->pr.gen;
      g.prompt = ex->pr.prompts[p];
      if (k > 0 && g.sampling.seed != kRandomSeed) g.sampling.seed += static_cast<uint64_t>(k);
      auto h = S.submit(std::move(g));
      if (!h) {
        for (auto& o : ex->hs) o->cancel();
        ex->hs.clear();
        ex->choices.clear();
        return submit_error(h.status());
      }
      ex->hs.push_back(*h);
      ChoiceState c;
      c.index = static_cast<int>(ex->choices.size());
      if (ex->pr.split && ex->pr.chat_prompt)
        c.reply = std::make_shared<ReplyStream>(*ex->pr.chat_prompt, ex->pr.reply);
      ex->choices.push_back(c);
    }
  }
  ex->done.assign(ex->hs.size(), false);
  return std::nullopt;
}

void Server::Impl::completions(const Request& req, Response& res, bool chat) {
  const uint64_t rid = next_id.fetch_add(1);
  const Clock::time_point t0 = Clock::now();
  ++in_flight;
  auto fail = [&](const ApiError& e) {
    send_error(res, e);
    log(rid, req, e.status, nullptr, ms_since(t0), nullptr);
    --in_flight;
  };
  json body;
  if (auto e = gate(req, &body)) return fail(*e);
  Scheduler* S = sched.load();
  auto ex = std::make_shared<Exchange>();
  ex->req_id = rid;
  ex->req_copy.method = req.method;
  ex->req_copy.path = req.path;
  ex->t0 = t0;
  if (auto e = parse_request(req, body, chat, ex.get())) return fail(*e);  // ex->impl unset: not logged twice
  if (auto e = compile_grammar(&ex->pr)) return fail(*e);
  ex->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(rid);
  ex->created = static_cast<int64_t>(std::time(nullptr));
  if (auto e = submit_all(*S, ex.get())) return fail(*e);
  ex->impl = this;  // from here on ~Exchange logs the request
  const Tokenizer& tok = S->tokenizer();

  if (!ex->pr.stream) {
    ClientWatch client(req);
    if (!wait_while_connected(ex->hs, client)) {  // the client hung up: cancelled, nobody to answer
      ex->status = kClientClosed;
      send_error(res, client_closed_error());
      return;
    }
    for (size_t i = 0; i < ex->hs.size(); ++i) {
      for (auto& ev : ex->hs[i]->wait_all()) ex->absorb(i, ev);
      ex->finish(i);
    }
    ex->ended = true;
    std::string msg;
    if (ex->failed(&msg)) {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = msg;
      ex->status = 500;
      send_error(res, e);
      return;
    }
    res.set_content(dump(ex->full_response(tok)), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [ex, tokp = &tok](size_t, httplib::DataSink& sink) -> bool {
        const Exchange::Write write = [&](const std::string& s) {
          ex->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        bool all_done = false;
        if (!ex->pump(write, *tokp, &all_done)) return false;
        if (all_done) sink.done();
        return true;
      },
      [ex](bool) {
        for (auto& h : ex->hs)
          if (!h->finished()) h->cancel();
      });
}

void Server::Impl::tokenize(const Request& req, Response& res) {
  const uint64_t rid = next_id.fetch_add(1);
  const Clock::time_point t0 = Clock::now();
  InFlight fl(in_flight);
  json body;
  auto done = [&](int status) { log(rid, req, status, nullptr, ms_since(t0), nullptr); };
  if (auto e = gate(req, &body)) return send_error(res, *e), done(e->status);
  ApiError err;
  err.code = "invalid_type";
  if (!body.contains("content") || !body["content"].is_string()) {
    err.param = "content";
    err.message = "'content' must be a string";
    return send_error(res, err), done(400);
  }
  bool add_special = false, parse_special = true, with_pieces = false;
  for (auto [k, p] : {std::pair<const char*, bool*>{"add_special", &add_special}, {"parse_special", &parse_special},
                      {"with_pieces", &with_pieces}}) {
    if (body.contains(k) && !body[k].is_null()) {
      if (!body[k].is_boolean()) {
        err.param = k;
        err.message = std::string("'") + k + "' must be a boolean";
        return send_error(res, err), done(400);
      }
      *p = body[k].get<bool>();
    }
  }
  const Tokenizer& tok = sched.load()->tokenizer();
  std::vector<int32_t> ids = tok.encode(body["content"].get<std::string>(), add_special, parse_special);
  json toks = json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      toks.push_back(id);
      continue;
    }
    const std::string piece = tok.token_to_piece(id, true);
    json p = {{"id", id}};
    // llama-server: the piece as a string when it is valid UTF-8, else its bytes.
    try {
      p["piece"] = json::parse(json(piece).dump());
    } catch (...) {
      json b = json::array();
      for (unsigned char c : piece) b.push_back(static_cast<int>(c));
      p["piece"] = b;
    }
    toks.push_back(p);
  }
  res.set_content(dump(json{{"tokens", toks}}), "application/json");
  done(200);
}

void Server::Impl::detokenize(const Request& req, Response& res) {
  const uint64_t rid = next_id.fetch_add(1);
  const Clock::time_point t0 = Clock::now();
  InFlight fl(in_flight);
  json body;
  auto done = [&](int status) { log(rid, req, status, nullptr, ms_since(t0), nullptr); };
  if (auto e = gate(req, &body)) return send_error(res, *e), done(e->status);
  ApiError err;
  err.param = "tokens";
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    err.code = "invalid_type";
    err.message = "'tokens' must be an array of token ids";
    return send_error(res, err), done(400);
  }
  const Tokenizer& tok = sched.load()->tokenizer();
  std::vector<int32_t> ids;
  const json& t = body["tokens"];
  for (size_t i = 0; i < t.size(); ++i) {
    if (!t[i].is_number_integer()) {
      err.code = "invalid_type";
      err.message = "'tokens[" + std::to_string(i) + "]' must be an integer";
      return send_error(res, err), done(400);
    }
    const int64_t v = t[i].get<int64_t>();
    if (v < 0 || v >= tok.n_vocab()) {
      err.code = "invalid_value";
      err.message = "'tokens[" + std::to_string(i) + "]': token id " + std::to_string(v) +
                    " is outside the vocabulary [0, " + std::to_string(tok.n_vocab()) + ")";
      return send_error(res, err), done(400);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  res.set_content(dump(json{{"content", tok.decode(ids)}}), "application/json");
  done(200);
}

Server::Server(ServerConfig cfg) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = std::move(cfg);
  const int n_threads = I.cfg.http_threads > 0 ? I.cfg.http_threads : std::max(64, 4 * I.cfg.parallel + 16);
  I.http.new_task_queue = [n_threads] { return new httplib::ThreadPool(static_cast<size_t>(n_threads)); };
  I.http.set_payload_max_length(I.cfg.max_body);
  I.http.set_read_timeout(60, 0);
  I.http.set_write_timeout(60, 0);
  I.http.set_keep_alive_timeout(5);
  I.http.set_tcp_nodelay(true);

  // Auth: a Bearer token on everything but /health.
  I.http.set_pre_routing_handler([&I](const Request& req, Response& res) {
    // Preflights carry no key; the chat page holds none and asks for it.
    if (I.cfg.api_key.empty() || req.path == "/health" || req.method == "OPTIONS" ||
        (req.path == "/" && req.method == "GET"))
      return httplib::Server::HandlerResponse::Unhandled;
    // Bearer (OpenAI's clients) or x-api-key (Anthropic's).
    const std::string auth = req.get_header_value("Authorization");
    const std::string key = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : req.get_header_value("X-Api-Key");
    if (ct_equal(key, I.cfg.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = 401;
    e.code = "invalid_api_key";
    e.message = key.empty() ? "missing API key: send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>')"
                             : "invalid API key";
    I.send_error(res, e);
    I.log(I.next_id.fetch_add(1), req, 401, nullptr, 0, nullptr);
    return httplib::Server::HandlerResponse::Handled;
  });
  // What httplib answers itself (no route, body over the limit, a malformed request line) gets an OpenAI body.
  I.http.set_error_handler(httplib::Server::HandlerWithResponse([&I](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    switch (res.status) {
      case 404: e.code = "not_found", e.message = "no such endpoint: " + req.method + " " + req.path; break;
      case 405: e.code = "method_not_allowed", e.message = "method not allowed"; break;
      case 413:
        e.code = "request_too_large";
        e.message = "the request body is larger than the limit of " + std::to_string(I.cfg.max_body) + " bytes";
        break;
      case 414: e.code = "uri_too_long", e.message = "the request URI is too long"; break;
      default: e.code = "bad_request", e.message = "malformed HTTP request"; break;
    }
    if (res.status >= 500) e.type = "server_error";
    I.send_error(res, e);
    I.log(I.next_id.fetch_add(1), req, res.status, nullptr, 0, nullptr);
    return httplib::Server::HandlerResponse::Handled;
  }));
  I.http.set_exception_handler([&I](const Request& req, Response& res, std::exception_ptr ep) {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    e.message = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& x) {
      e.message = std::string("internal error: ") + x.what();
    } catch (...) {
    }
    I.send_error(res, e);
  });

  I.http.Post("/v1/chat/completions", [&I](const Request& q, Response& r) { I.completions(q, r, true); });
  I.http.Post("/v1/completions", [&I](const Request& q, Response& r) { I.completions(q, r, false); });
  I.http.Post("/chat/completions", [&I](const Request& q, Response& r) { I.completions(q, r, true); });
  I.http.Post("/completions", [&I](const Request& q, Response& r) { I.completions(q, r, false); });
  I.http.Post("/tokenize", [&I](const Request& q, Response& r) { I.tokenize(q, r); });
  I.http.Post("/detokenize", [&I](const Request& q, Response& r) { I.detokenize(q, r); });
  auto models = [&I](const Request& q, Response& r) {
    const uint64_t rid = I.next_id.fetch_add(1);
    if (auto e = I.gate(q, nullptr); e && e->code == "model_loading") {
      I.send_error(r, *e);
      return I.log(rid, q, e->status, nullptr, 0, nullptr);
    }
    json m = {{"id", I.cfg.model_id}, {"object", "model"}, {"created", static_cast<int64_t>(std::time(nullptr))},
              {"owned_by", "kiln"}};
    if (Scheduler* S = I.sched.load()) {
      m["meta"] = {{"n_vocab", S->n_vocab()}, {"n_ctx", S->max_seq_ctx()}, {"n_ctx_train", S->n_ctx_train()},
                   {"parallel", S->config().max_seqs}, {"description", S->model_description()},
                   {"generation", S->config().generation}};
      const EmbeddingSetup& es = S->embedding();
      if (es.on) m["meta"]["embeddings"] = {{"pooling", pooling_name(es.pooling)}, {"n_embd", es.n_out}};
    }
    r.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    I.log(rid, q, 200, nullptr, 0, nullptr);
  };
  I.http.Get("/v1/models", models);
  I.http.Get("/models", models);
  I.http.Get("/health", [&I](const Request& q, Response& r) {
    if (!I.sched.load()) {
      r.status = 503;
      r.set_content(dump(json{{"error", {{"code", 503}, {"message", "Loading model"}, {"type", "unavailable_error"}}}}),
                    "application/json");
    } else {
      r.set_content(dump(json{{"status", "ok"}}), "application/json");
    }
    I.counters.count("/health", r.status);
  });
  add_anthropic_routes(I.http, I);
  add_responses_routes(I.http, I);
  add_llama_routes(I.http, I);
  add_embedding_routes(I.http, I);
  add_webui_route(I.http, I);
  add_cors(I.http, I.cfg.cors_origin);
  I.http.Get("/metrics", [&I](const Request& q, Response& r) {
    Scheduler* S = I.sched.load();
    SchedulerStats st;
    if (S) st = S->stats();
    const double up = std::chrono::duration<double>(Clock::now() - I.started).count();
    I.counters.count("/metrics", 200);
    r.set_content(render_metrics(I.counters, S ? &st : nullptr, I.in_flight.load(), up),
                  "text/plain; version=0.0.4; charset=utf-8");
  });
}

Server::~Server() = default;

Status Server::bind() {
  Impl& I = *impl_;
  if (I.cfg.port == 0) {
    I.bound_port = I.http.bind_to_any_port(I.cfg.host);
    if (I.bound_port < 0)
      return make_error(ErrorCode::kIo, "--host %s: cannot bind a port", I.cfg.host.c_str());
    I.http.raise_backlog(1024);
    return Status::ok();
  }
  if (!I.http.bind_to_port(I.cfg.host, I.cfg.port))
    return make_error(ErrorCode::kIo, "--host %s --port %d: cannot bind (in use, or not an address of this machine)",
                      I.cfg.host.c_str(), I.cfg.port);
  I.bound_port = I.cfg.port;
  I.http.raise_backlog(1024);
  return Status::ok();
}

int Server::port() const { return impl_->bound_port; }
void Server::run() {
  impl_->http.listen_after_bind();
  impl_->run_done.store(true);
}

Status Server::set_ready(Scheduler* s) {
  Impl& I = *impl_;
  I.pctx.tok = &s->tokenizer();
  I.pctx.max_seq_ctx = s->max_seq_ctx();
  I.pctx.model_id = I.cfg.model_id;
  I.pctx.strict_model = I.cfg.strict_model;
  I.pctx.timeout_s = I.cfg.timeout_s;
  I.pctx.default_max_new_tokens = I.cfg.default_max_new_tokens;
  I.pctx.sampling = I.cfg.sampling;
  I.pctx.reasoning_budget = I.cfg.reasoning_budget;
  I.pctx.reasoning_budget_message = I.cfg.reasoning_budget_message;
  I.pctx.spec = s->config().spec;
  // The chat prompt (runtime/prompt.h): --chat-template NAME, --chat-template-file, else the model's template,
  // else (a file without one) a built-in family its vocabulary points to, else chatml; the fallback is logged.
  ChatPromptOptions o = I.cfg.chat;
  o.allow_plain = false;
  auto cp = ChatPrompt::create(s->tokenizer(), o);
  if (!cp) return cp.status();
  I.chat = std::make_unique<ChatPrompt>(std::move(cp).value());
  if (!I.chat->notice().empty()) std::fprintf(stderr, "kiln serve: %s\n", I.chat->notice().c_str());
  I.pctx.chat = I.chat.get();
  I.grammars = std::make_unique<GrammarCache>(s->tokenizer());
  I.sched.store(s);
  return Status::ok();
}

void Server::begin_shutdown() { impl_->draining.store(true); }
int64_t Server::in_flight() const { return impl_->in_flight.load(); }
void Server::stop() {
  // Called right after run() was started (a model that fails to load), the listener may not be looping yet: wait
  // for it (bounded: 10 s) so the stop is not lost.
  Impl& I = *impl_;
  for (int i = 0; i < 1000 && !I.run_done.load() && !I.http.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  I.http.stop();
}

}  // namespace kiln::server

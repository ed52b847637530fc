#include "server/generation.h"

#include <httplib.h>

namespace kiln::server {

using Clock = std::chrono::steady_clock;

std::optional<ApiError> ChatGeneration::start(Scheduler& sched, ParsedRequest pr, std::shared_ptr<ChatGeneration>* out) {
  auto g = std::make_shared<ChatGeneration>();
  GenRequest r = pr.gen;
  r.prompt = pr.prompts.at(0);
  auto h = sched.submit(std::move(r));
  if (!h) return submit_error(h.status());
  g->h_ = *h;
  if (pr.split && pr.chat_prompt)
    g->reply_ = std::make_unique<ReplyStream>(*pr.chat_prompt, pr.reply);
  g->pr_ = std::move(pr);
  *out = std::move(g);
  return std::nullopt;
}

ChatGeneration::~ChatGeneration() {
  if (h_ && !h_->finished()) h_->cancel();
}

void ChatGeneration::cancel() {
  if (h_) h_->cancel();
}

void ChatGeneration::add(ReplyStream::Delta* d, const std::string& piece) {
  text_ += piece;
  if (!reply_) {
    d->content += piece;
    return;
  }
  ReplyStream::Delta x = reply_->push(piece);
  d->reasoning += x.reasoning;
  d->content += x.content;
  d->reasoning_ended = d->reasoning_ended || x.reasoning_ended;
}

void ChatGeneration::ended() {
  done_ = true;
  finish_ = h_->finish_reason();
  stop_ = h_->stop_reason();
  stop_string_ = h_->stop_string();
  timings_ = h_->timings();
  error_ = h_->error();
}

bool ChatGeneration::next(ReplyStream::Delta* d, std::chrono::milliseconds wait) {
  if (done_) return false;
  std::vector<TokenEvent> evs;
  const bool more = h_->next(evs, wait);
  for (const TokenEvent& ev : evs) add(d, ev.text);
  if (more) return true;
  ended();
  if (reply_) {
    ReplyStream::Delta x = reply_->finish();
    d->reasoning += x.reasoning;
    d->content += x.content;
    d->tool_calls = std::move(x.tool_calls);
  }
  return false;
}

tpl::ParsedReply ChatGeneration::wait_all() {
  for (const TokenEvent& ev : h_->wait_all()) text_ += ev.text;
  ended();
  if (!pr_.split || !pr_.chat_prompt) {
    tpl::ParsedReply r;
    r.content = text_;
    return r;
  }
  return pr_.chat_prompt->parse_reply(text_, pr_.reply);
}

bool ChatGeneration::failed(std::string* msg) const {
  if (finish_ == FinishReason::kError) {
    *msg = error_.to_string();
    return true;
  }
  if (finish_ == FinishReason::kCancelled) {
    *msg = "the request was cancelled (the server is shutting down)";
    return true;
  }
  return false;
}

std::string sse(const std::string& event, const json& data) {
  std::string s;
  if (!event.empty()) s = "event: " + event + "\n";
  return s + "data: " + dump(data) + "\n\n";
}

ServedRequest::ServedRequest(RouteHost& h, const httplib::Request& req)
    : host(&h), id(h.next_request_id()), method(req.method), path(req.path), client(req) {
  ++host->in_flight_count();
}

ServedRequest::~ServedRequest() {
  httplib::Request r;
  r.method = method;
  r.path = path;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (gen) {
    const char* fin = ended ? finish_reason_name(gen->finish()) : "disconnected";
    host->log(id, r, status, &gen->timings(), ms, fin);
  } else {
    host->log(id, r, status, nullptr, ms, nullptr);
  }
  --host->in_flight_count();
}

void send_dialect_error(const Dialect& d, httplib::Response& res, const ApiError& e, ServedRequest* sr) {
  res.status = e.status;
  res.set_content(d.error_body(e), "application/json");
  sr->status = e.status;
}

namespace {

ApiError engine_error(const std::string& msg) {
  ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.message = msg;
  return e;
}

// The state of one streamed answer across calls of httplib's content provider.
struct StreamState {
  std::shared_ptr<ServedRequest> sr;
  std::unique_ptr<StreamWriter> w;
  bool started = false;
  Clock::time_point last_write = Clock::now();
};

}  // namespace

void serve_generation(RouteHost& host, httplib::Response& res, ParsedRequest pr, bool stream, const Dialect& d,
                      std::shared_ptr<ServedRequest> sr) {
  Scheduler* S = host.scheduler();
  if (auto e = host.compile_grammar(&pr)) return send_dialect_error(d, res, *e, sr.get());
  if (auto e = ChatGeneration::start(*S, std::move(pr), &sr->gen)) return send_dialect_error(d, res, *e, sr.get());
  ChatGeneration& g = *sr->gen;
  if (!stream) {
    if (!wait_while_connected({g.handle()}, sr->client))  // the client hung up: cancelled, nobody to answer
      return send_dialect_error(d, res, client_closed_error(), sr.get());
    const tpl::ParsedReply reply = g.wait_all();
    sr->ended = true;
    std::string msg;
    if (g.failed(&msg)) return send_dialect_error(d, res, engine_error(msg), sr.get());
    res.set_content(dump(d.response(g, reply)), "application/json");
    return;
  }
  auto st = std::make_shared<StreamState>();
  st->sr = sr;
  st->w = d.writer();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          st->last_write = Clock::now();
          return sink.write(s.data(), s.size());
        };
        ChatGeneration& gen = *st->sr->gen;
        if (!st->started) {
          st->started = true;
          if (!write(st->w->begin(gen))) return false;
        }
        ReplyStream::Delta dl;
        const bool more = gen.next(&dl, std::chrono::milliseconds(500));
        if (!dl.reasoning.empty() || !dl.content.empty())
          if (!write(st->w->delta(dl))) return false;
        if (!more) {
          st->sr->ended = true;
          std::string msg;
          if (gen.failed(&msg)) {
            st->sr->status = 500;
            if (!write(st->w->error(engine_error(msg)))) return false;
          } else {
            dl.reasoning.clear();
            dl.content.clear();
            if (!write(st->w->end(gen, dl))) return false;
          }
          sink.done();
          return true;
        }
        // A client that hung up makes a write fail, which cancels the request.
        if (Clock::now() - st->last_write > std::chrono::milliseconds(1000)) return write(st->w->keep_alive());
        return true;
      },
      [st](bool) { st->sr->gen->cancel(); });
}

}  // namespace kiln::server

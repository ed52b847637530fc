#include "runtime/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/sequence.h"
#include "util/thread_pool.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

// ---- RequestHandle ----

void RequestHandle::push(TokenEvent ev) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

void RequestHandle::finish(FinishReason r, const RequestTimings& t, Status err) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    reason_ = r;
    timings_ = t;
    error_ = std::move(err);
  }
  cv_.notify_all();
}

bool RequestHandle::next(std::vector<TokenEvent>& out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lk(mu_);
  if (events_.empty() && !done_) cv_.wait_for(lk, wait, [&] { return !events_.empty() || done_; });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return !(done_ && events_.empty()) || !out.empty();
}

std::vector<TokenEvent> RequestHandle::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  std::vector<TokenEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

bool RequestHandle::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}
FinishReason RequestHandle::finish_reason() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reason_;
}
Status RequestHandle::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}
RequestTimings RequestHandle::timings() const {
  std::lock_guard<std::mutex> lk(mu_);
  return timings_;
}

void Histogram::add(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

// ---- the engine thread's state ----

namespace {

struct Active {
  std::shared_ptr<RequestHandle> h;
  std::unique_ptr<Sequence> seq;
  int32_t slot = -1;
  bool started = false;  // scheduled at least once
  bool got_first = false;
  Clock::time_point t_sched, t_first, t_last;
  Clock::time_point deadline = Clock::time_point::max();
  RequestTimings tm;
  // Stop strings: generated text, bytes released so far, longest stop string.
  std::string text;
  size_t sent = 0;
  size_t max_stop = 0;
  // This step.
  bool scheduled = false, wants = false;
  size_t n_sched = 0;
  OutputKind kind = OutputKind::kArgmax;
  Sequence::Step st;
  TokenEvent ev;
  bool stop_hit = false;
  bool preempted_now = false;  // preempted in this step: recomputed from the next one on
};

// Finds the earliest full stop-string match in text[from..]; npos if none.
size_t find_stop(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    size_t p = text.find(s, from);
    if (p < best) best = p;
  }
  return best;
}

// Length of the longest suffix of text that is a proper prefix of some stop string.
size_t partial_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > best; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        best = n;
        break;
      }
  }
  return best;
}

// Log-softmax of the raw logits: the sampled token's logprob and the top k alternatives.
void logprobs_of(std::span<const float> row, int32_t id, int32_t k, TokenEvent* ev) {
  float mx = -INFINITY;
  for (float v : row) mx = std::max(mx, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v - mx));
  const double logz = mx + std::log(sum);
  if (id >= 0 && id < static_cast<int32_t>(row.size())) ev->logprob = static_cast<float>(row[id] - logz);
  if (k <= 0) return;
  std::vector<TokenLogprob> top;
  top.reserve(k + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    if (static_cast<int32_t>(top.size()) == k && !(row[i] > top.back().logprob)) continue;
    TokenLogprob t{i, row[i]};
    auto it = std::upper_bound(top.begin(), top.end(), t,
                               [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob > b.logprob; });
    top.insert(it, t);
    if (static_cast<int32_t>(top.size()) > k) top.pop_back();
  }
  for (auto& t : top) t.logprob = static_cast<float>(t.logprob - logz);
  ev->top = std::move(top);
}

uint64_t model_identity(const Model& m, bool q8) {
  const HParams& hp = m.hparams();
  uint64_t h = 1469598103934665603ull;
  auto add = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (char c : hp.arch) add(static_cast<unsigned char>(c));
  for (char c : hp.name) add(static_cast<unsigned char>(c));
  add(hp.n_vocab), add(hp.n_layer), add(hp.n_embd), add(hp.n_head), add(hp.n_head_kv), add(hp.n_ff);
  add(m.stats().weight_bytes), add(m.stats().n_params), add(q8 ? 1 : 0);
  return h;
}

}  // namespace

struct Scheduler::Impl {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ThreadPool> pool;
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<RequestHandle>> incoming;
  bool stop = false, draining = false, cancel_all = false;
  uint64_t next_id = 1;
  std::atomic<int64_t> n_pending{0};  // submitted, not finished

  // Engine thread only.
  std::deque<std::shared_ptr<RequestHandle>> waiting;
  std::vector<std::unique_ptr<Active>> active;  // oldest first
  std::vector<int32_t> free_slots;
  Batch batch;
  std::vector<OutputKind> kinds;
  std::vector<Active*> sched, outs;

  mutable std::mutex stats_mu;
  SchedulerStats stats;
  struct Tick {
    Clock::time_point t;
    int64_t prompt, gen;
  };
  std::deque<Tick> window;
};

Result<std::unique_ptr<Scheduler>> Scheduler::create(std::unique_ptr<Model> model, const SchedulerConfig& cfg) {
  if (!model) return make_error(ErrorCode::kInvalidArgument, "scheduler: no model");
  if (cfg.parallel < 1 || cfg.parallel > 256)
    return make_error(ErrorCode::kInvalidArgument, "--parallel: must be in [1, 256] (got %d)", cfg.parallel);
  if (cfg.max_batch < 1)
    return make_error(ErrorCode::kInvalidArgument, "-b: batch size must be >= 1 (got %d)", cfg.max_batch);
  if (cfg.n_ctx < 1) return make_error(ErrorCode::kInvalidArgument, "-c: must be >= 1 (got %lld)", (long long)cfg.n_ctx);
  std::unique_ptr<Scheduler> s(new Scheduler());
  s->cfg_ = cfg;
  s->impl_ = std::make_unique<Impl>();
  Impl& I = *s->impl_;
  KvCacheConfig kc;
  kc.n_ctx = cfg.n_ctx;
  kc.block_size = cfg.block_size;
  kc.max_seqs = cfg.parallel;
  kc.dtype = cfg.kv_q8 ? DType::Q8_0 : DType::F16;
  kc.max_batch = static_cast<int32_t>(std::min<int64_t>(cfg.max_batch, cfg.n_ctx));
  kc.max_outputs = std::min(cfg.parallel, kc.max_batch);
  kc.prefix_cache = cfg.prefix_cache;
  kc.prefix_seed = model_identity(*model, cfg.kv_q8);
  auto e = Engine::create(*model, kc);
  if (!e) return e.status();
  I.engine = std::move(e).value();
  I.model = std::move(model);
  s->max_seq_ctx_ = cfg.max_seq_ctx > 0 ? std::min(cfg.max_seq_ctx, cfg.n_ctx) : cfg.n_ctx;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nt = cfg.sampling_threads > 0 ? cfg.sampling_threads : std::min(cfg.parallel, cores);
  I.pool = std::make_unique<ThreadPool>(std::max(1, nt));
  for (int32_t i = cfg.parallel - 1; i >= 0; --i) I.free_slots.push_back(i);
  I.kinds.resize(static_cast<size_t>(cfg.parallel));
  I.stats.ttft = Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  I.stats.itl = Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  I.stats.block_size = cfg.block_size;
  if (cfg.start) s->start();
  return s;
}

Scheduler::~Scheduler() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  // Whatever never reached the engine thread.
  for (auto& h : impl_->incoming) h->finish(FinishReason::kCancelled, {}, Status::ok());
}

void Scheduler::start() {
  if (!impl_->thread.joinable()) impl_->thread = std::thread([this] { loop(); });
}

const Tokenizer& Scheduler::tokenizer() const { return impl_->model->tokenizer(); }
int32_t Scheduler::n_vocab() const { return static_cast<int32_t>(impl_->model->hparams().n_vocab); }
int64_t Scheduler::n_ctx_train() const { return impl_->model->hparams().n_ctx_train; }

std::string Scheduler::model_description() const {
  const Model& m = *impl_->model;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %.1fM params, on %s", m.hparams().arch.c_str(),
                static_cast<double>(m.stats().n_params) / 1e6, m.placement().describe().c_str());
  return buf;
}

Result<std::shared_ptr<RequestHandle>> Scheduler::submit(GenRequest req) {
  const int32_t nv = n_vocab();
  if (req.prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "prompt: empty (no tokens)");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= nv)
      return make_error(ErrorCode::kInvalidArgument, "prompt: token %zu: id %d is outside the vocabulary [0, %d)", i,
                        req.prompt[i], nv);
  if (static_cast<int64_t>(req.prompt.size()) >= max_seq_ctx_)
    return make_error(ErrorCode::kOutOfRange,
                      "prompt: %zu tokens do not fit the context of %lld tokens per sequence (at least one token "
                      "must be left to generate)", req.prompt.size(), (long long)max_seq_ctx_);
  if (req.max_tokens < -1)
    return make_error(ErrorCode::kInvalidArgument, "max_tokens: must be >= 0 (got %d)", req.max_tokens);
  if (req.top_logprobs < 0 || req.top_logprobs > 20)
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs: must be in [0, 20] (got %d)", req.top_logprobs);
  for (const std::string& s : req.stop)
    if (s.empty()) return make_error(ErrorCode::kInvalidArgument, "stop: empty stop string");
  if (!(req.timeout_s >= 0)) return make_error(ErrorCode::kInvalidArgument, "timeout: must be >= 0");
  {
    Sampler probe(req.sampling, nv);
    KILN_TRY(probe.validate());
  }
  std::shared_ptr<RequestHandle> h;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->draining || impl_->stop)
      return make_error(ErrorCode::kUnsupported, "the server is shutting down");
    h.reset(new RequestHandle(impl_->next_id++, std::move(req)));
    h->submitted_ = Clock::now();
    impl_->incoming.push_back(h);
    impl_->n_pending.fetch_add(1);
  }
  impl_->cv.notify_all();
  return h;
}

void Scheduler::shutdown(bool cancel) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->draining = true;
    if (cancel) impl_->cancel_all = true;
  }
  impl_->cv.notify_all();
}

bool Scheduler::wait_idle(std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (impl_->n_pending.load() > 0) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  SchedulerStats s = impl_->stats;
  const auto now = Clock::now();
  int64_t p = 0, g = 0;
  for (const auto& t : impl_->window)
    if (now - t.t <= std::chrono::seconds(10)) p += t.prompt, g += t.gen;
  s.prompt_tps = p / 10.0;
  s.gen_tps = g / 10.0;
  return s;
}

// ---- the loop ----

void Scheduler::loop() {
  Impl& I = *impl_;
  Engine& engine = *I.engine;
  KvCache& cache = engine.cache();
  const Tokenizer& tok = I.model->tokenizer();
  const int32_t nv = n_vocab();
  const int64_t bs = cfg_.block_size;
  struct Notice {
    std::shared_ptr<RequestHandle> h;
    FinishReason r;
    RequestTimings tm;
    Status err;
  };
  std::vector<Notice> notify;

  auto finish = [&](Active& a, FinishReason r, Status err) {
    // The decoder's held-back tail, then whatever text was held for a stop string.
    if (r != FinishReason::kError) {
      a.text += a.seq->flush_text();
      size_t end = a.text.size();
      if (!a.h->request().stop.empty() && !a.stop_hit) {
        const size_t p = find_stop(a.text, a.sent > a.max_stop ? a.sent - a.max_stop : 0, a.h->request().stop);
        if (p != std::string::npos) {
          end = std::max(p, a.sent);
          r = FinishReason::kStop;
        }
      }
      if (end > a.sent && !a.stop_hit) {
        TokenEvent ev;
        ev.text = a.text.substr(a.sent, end - a.sent);
        a.h->push(std::move(ev));
        a.sent = end;
      }
    }
    const auto now = Clock::now();
    if (a.got_first) a.tm.gen_ms = ms_between(a.t_first, now);
    else if (a.started) a.tm.prompt_ms = ms_between(a.t_sched, now);
    notify.push_back({a.h, r, a.tm, std::move(err)});
    cache.truncate(a.slot, 0);
    I.free_slots.push_back(a.slot);
    a.slot = -1;
  };
  auto finish_waiting = [&](const std::shared_ptr<RequestHandle>& h, FinishReason r) {
    RequestTimings tm;
    tm.n_prompt = static_cast<int64_t>(h->request().prompt.size());
    tm.queue_ms = ms_between(h->submitted_, Clock::now());
    notify.push_back({h, r, tm, Status::ok()});
  };
  // The gauges first, then the requests hear that they finished (so a client that saw its request end sees the
  // blocks it held freed in the stats).
  auto publish = [&] {
    {
      std::lock_guard<std::mutex> lk(I.stats_mu);
      SchedulerStats& S = I.stats;
      S.queue_depth = static_cast<int64_t>(I.waiting.size());
      S.running = static_cast<int64_t>(I.active.size());
      S.kv_blocks_total = cache.n_blocks_total();
      S.kv_blocks_used = cache.n_blocks_used();
      S.kv_blocks_cached = cache.n_blocks_cached();
      S.kv_blocks_free = cache.n_blocks_free() - cache.n_blocks_cached();
      for (auto& n : notify) ++S.finished[static_cast<int>(n.r)];
    }
    for (auto& n : notify) {
      n.h->finish(n.r, n.tm, std::move(n.err));
      I.n_pending.fetch_sub(1);
    }
    notify.clear();
  };
  auto remove_finished = [&] {
    I.active.erase(std::remove_if(I.active.begin(), I.active.end(), [](auto& a) { return a->slot < 0; }),
                   I.active.end());
  };
  auto has_kv = [&](const Active& a) { return cache.seq_len(a.slot) > 0 || !cache.table(a.slot).empty(); };
  uint64_t preempted_now = 0;
  auto preempt = [&](Active& a) {
    cache.truncate(a.slot, 0);  // the tokens stay in the Sequence: all pending again
    ++a.tm.n_preempted;
    a.preempted_now = true;
    ++preempted_now;
  };
  // Tokens (<= n) of a's pending ones whose blocks fit into `free` blocks.
  auto fit = [&](const Active& a, int64_t n, int64_t free) {
    if (cache.blocks_needed(a.slot, n) <= free) return n;
    int64_t lo = 0, hi = n;  // blocks_needed(lo) fits, blocks_needed(hi) does not
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      (cache.blocks_needed(a.slot, mid) <= free ? lo : hi) = mid;
    }
    return lo;
  };
  // Prefix cache: an empty sequence takes the longest cached prefix of its tokens (all but the last one at most).
  auto attach = [&](Active& a) {
    if (!cfg_.prefix_cache || has_kv(a)) return;
    const auto& toks = a.seq->tokens();
    const int64_t got = cache.attach_prefix(a.slot, toks, static_cast<int64_t>(toks.size()) - 1);
    if (!a.started) a.tm.n_cached = got;
    std::lock_guard<std::mutex> lk(I.stats_mu);
    I.stats.prefix_hit_tokens += static_cast<uint64_t>(got);
  };

  for (;;) {
    // 1. Requests join at the step boundary.
    {
      std::unique_lock<std::mutex> lk(I.mu);
      if (I.active.empty() && I.waiting.empty() && I.incoming.empty() && !I.stop)
        I.cv.wait(lk, [&] { return I.stop || !I.incoming.empty(); });
      if (I.stop) break;
      while (!I.incoming.empty()) {
        I.waiting.push_back(std::move(I.incoming.front()));
        I.incoming.pop_front();
      }
      if (I.cancel_all) {
        for (auto& a : I.active) a->h->cancel();
        for (auto& h : I.waiting) h->cancel();
      }
    }
    // 2. Cancelled and timed-out requests end here; their blocks are freed now.
    const auto now = Clock::now();
    for (auto& a : I.active) {
      if (a->h->cancelled()) finish(*a, FinishReason::kCancelled, Status::ok());
      else if (now >= a->deadline) finish(*a, FinishReason::kLength, Status::ok());
    }
    remove_finished();
    for (auto it = I.waiting.begin(); it != I.waiting.end();) {
      RequestHandle& h = **it;
      const bool late = h.request().timeout_s > 0 &&
                        now - h.submitted_ >= std::chrono::duration<double>(h.request().timeout_s);
      if (h.cancelled() || late) {
        finish_waiting(*it, h.cancelled() ? FinishReason::kCancelled : FinishReason::kLength);
        it = I.waiting.erase(it);
      } else {
        ++it;
      }
    }
    if (I.active.empty() && I.waiting.empty()) {
      publish();
      continue;
    }

    // 3. The step: decode tokens first, then prompt chunks of running sequences, then new requests.
    StepInfo info;
    preempted_now = 0;
    I.batch.clear();
    I.sched.clear();
    int64_t budget = engine.caps().max_tokens;
    int64_t outs_left = engine.caps().max_outputs;
    for (auto& a : I.active) a->scheduled = a->preempted_now = false;
    auto put = [&](Active& a, size_t n) {
      // Blocks now (the engine's plan finds them reserved); n fits: checked by the caller.
      Status st = cache.reserve(a.slot, static_cast<int64_t>(n));
      if (!st.is_ok()) return false;
      const size_t got = a.seq->schedule(I.batch, n);
      a.n_sched = got;
      a.scheduled = true;
      a.wants = a.seq->scheduled_wants_logits();
      if (!a.started) {
        a.started = true;
        a.t_sched = Clock::now();
        a.tm.queue_ms = ms_between(a.h->submitted_, a.t_sched);
      }
      budget -= static_cast<int64_t>(got);
      if (a.wants) --outs_left;
      I.sched.push_back(&a);
      return true;
    };
    // 3a. Decode: one token for each running sequence whose prompt is in the cache, oldest first. A sequence that
    // finds no block preempts the newest sequence holding blocks (itself, when it is the newest).
    for (size_t i = 0; i < I.active.size() && budget > 0 && outs_left > 0; ++i) {
      Active& a = *I.active[i];
      if (!has_kv(a) || a.seq->n_pending() != 1) continue;
      bool self = false;
      while (cache.blocks_needed(a.slot, 1) > cache.n_blocks_free()) {
        Active* victim = nullptr;
        for (size_t j = I.active.size(); j-- > 0;)
          if (has_kv(*I.active[j]) && !I.active[j]->scheduled) {
            victim = I.active[j].get();
            break;
          }
        if (!victim) break;
        preempt(*victim);
        if (victim == &a) {
          self = true;
          break;
        }
      }
      if (self || cache.blocks_needed(a.slot, 1) > cache.n_blocks_free()) continue;
      if (put(a, 1)) ++info.n_decode;
    }
    // 3b. Prompt chunks (and recomputation of preempted sequences), oldest first.
    for (size_t i = 0; i < I.active.size() && budget > 0 && outs_left > 0; ++i) {
      Active& a = *I.active[i];
      if (a.scheduled || a.preempted_now || a.seq->n_pending() == 0) continue;
      if (has_kv(a) && a.seq->n_pending() == 1 && a.got_first) continue;  // a decode that found no room
      attach(a);
      const int64_t n = fit(a, std::min<int64_t>(static_cast<int64_t>(a.seq->n_pending()), budget),
                            cache.n_blocks_free());
      if (n <= 0) continue;
      put(a, static_cast<size_t>(n));
      info.n_prefill_tokens += static_cast<int32_t>(n);
    }
    // 3c. Admission while a slot, budget and blocks are free (one free block kept per running sequence, so the
    // decodes of the next step do not preempt at once).
    while (!I.waiting.empty() && !I.free_slots.empty() && budget > 0 && outs_left > 0) {
      std::shared_ptr<RequestHandle> h = I.waiting.front();
      const int32_t slot = I.free_slots.back();
      const GenRequest& rq = h->request();
      auto a = std::make_unique<Active>();
      a->h = h;
      a->slot = slot;
      SequenceOptions so;
      so.n_predict = rq.max_tokens;
      so.ignore_eos = rq.ignore_eos;
      so.sampling = rq.sampling;
      a->seq = std::make_unique<Sequence>(slot, tok, nv, max_seq_ctx_, so, cache);
      if (Status st = a->seq->append(rq.prompt); !st.is_ok()) {  // checked in submit(); a backstop
        I.waiting.pop_front();
        notify.push_back({h, FinishReason::kError, {}, st});
        continue;
      }
      a->seq->begin_turn();
      a->tm.n_prompt = static_cast<int64_t>(rq.prompt.size());
      for (const auto& s : rq.stop) a->max_stop = std::max(a->max_stop, s.size());
      if (rq.timeout_s > 0)
        a->deadline = h->submitted_ + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(std::min(rq.timeout_s, 1e7)));
      attach(*a);
      int64_t keep = 0;
      for (auto& o : I.active) keep += has_kv(*o) ? 1 : 0;
      const int64_t room = cache.n_blocks_free() - keep;
      const int64_t n = room > 0 ? fit(*a, std::min<int64_t>(static_cast<int64_t>(a->seq->n_pending()), budget), room)
                                 : 0;
      if (n <= 0) {  // admission waits for blocks
        cache.truncate(slot, 0);
        if (!a->started) {
          std::lock_guard<std::mutex> lk(I.stats_mu);
          I.stats.prefix_hit_tokens -= static_cast<uint64_t>(a->tm.n_cached);
        }
        break;
      }
      I.waiting.pop_front();
      I.free_slots.pop_back();
      I.active.push_back(std::move(a));
      put(*I.active.back(), static_cast<size_t>(n));
      info.n_prefill_tokens += static_cast<int32_t>(n);
      ++info.n_admitted;
      std::lock_guard<std::mutex> lk(I.stats_mu);
      I.stats.prompt_tokens += rq.prompt.size();
    }
    info.n_preempted = static_cast<int32_t>(preempted_now);
    if (I.batch.size() == 0) {
      // Nothing fits: blocks are held by sequences that cannot grow. Preempt the newest holder; a sequence that
      // holds every block alone and still cannot grow fails (it needs more than the pool).
      Active* victim = nullptr;
      int holders = 0;
      for (auto& o : I.active) holders += has_kv(*o) ? 1 : 0;
      for (size_t j = I.active.size(); j-- > 0;)
        if (has_kv(*I.active[j])) {
          victim = I.active[j].get();
          break;
        }
      if (victim && holders > 1) {
        preempt(*victim);
      } else if (!I.active.empty()) {
        Active& a = victim ? *victim : *I.active.front();
        finish(a, FinishReason::kError,
               make_error(ErrorCode::kOutOfRange, "out of KV cache: the request needs more than the %lld token "
                          "slots of -c", (long long)cache.n_blocks_total() * bs));
        remove_finished();
      } else {
        // Waiting requests only and none admitted: cannot happen with an empty pool; avoid a busy loop anyway.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      {
        std::lock_guard<std::mutex> lk(I.stats_mu);
        I.stats.preemptions += preempted_now;
      }
      publish();
      continue;
    }

    // 4. One forward for everything.
    I.outs.clear();
    for (Active* a : I.sched) {
      if (!a->wants) continue;
      const GenRequest& rq = a->h->request();
      a->kind = (rq.logprobs || !a->seq->sampler().argmax_only()) ? OutputKind::kLogits : OutputKind::kArgmax;
      I.kinds[I.outs.size()] = a->kind;
      I.outs.push_back(a);
    }
    auto out = engine.step(I.batch.tokens, std::span<const OutputKind>(I.kinds.data(), I.outs.size()));
    if (!out) {
      for (Active* a : I.sched) {
        a->seq->rollback();
        finish(*a, FinishReason::kError, out.status());
      }
      remove_finished();
      publish();
      continue;
    }
    const StepOutputs so = *out;
    int64_t n_prompt_tok = 0;
    for (Active* a : I.sched) {
      a->seq->commit();
      if (cfg_.prefix_cache) cache.cache_blocks(a->slot, a->seq->tokens());
      if (!a->got_first || !a->wants || a->n_sched > 1) n_prompt_tok += static_cast<int64_t>(a->n_sched);
    }
    info.n_tokens = static_cast<int32_t>(I.batch.size());
    info.n_seqs = static_cast<int32_t>(I.sched.size());

    // 5. Sampling of every output row, in parallel; each task touches only its own sequence.
    auto sample_one = [&](size_t j) {
      Active& a = *I.outs[j];
      const GenRequest& rq = a.h->request();
      a.ev = TokenEvent{};
      a.stop_hit = false;
      if (a.kind == OutputKind::kLogits) {
        std::span<const float> row(so.row(static_cast<int32_t>(j)), static_cast<size_t>(so.n_vocab));
        a.st = a.seq->on_logits(row);
        if (rq.logprobs && a.st.token >= 0) logprobs_of(row, a.st.token, rq.top_logprobs, &a.ev);
      } else {
        a.st = a.seq->on_token(so.argmax[j]);
      }
      a.ev.id = a.st.token;
      if (a.st.token < 0) return;
      a.text += a.st.piece;
      if (rq.stop.empty()) {
        a.ev.text = a.text.substr(a.sent);
        a.sent = a.text.size();
        return;
      }
      const size_t p = find_stop(a.text, a.sent > a.max_stop ? a.sent - a.max_stop : 0, rq.stop);
      size_t end;
      if (p != std::string::npos) {
        end = std::max(p, a.sent);
        a.stop_hit = true;
      } else {
        end = a.text.size() - partial_stop(a.text, rq.stop);
        end = std::max(end, a.sent);
      }
      a.ev.text = a.text.substr(a.sent, end - a.sent);
      a.sent = end;
    };
    if (I.outs.size() >= 2 && I.pool->size() > 1) {
      I.pool->parallel_for(static_cast<int64_t>(I.outs.size()), [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j) sample_one(static_cast<size_t>(j));
      });
    } else {
      for (size_t j = 0; j < I.outs.size(); ++j) sample_one(j);
    }

    // 6. Tokens out, stop rules, finished sequences free their slots and blocks.
    const auto t_out = Clock::now();
    int64_t n_gen_tok = 0;
    double ttft_add[256];
    double itl_add[256];
    int n_ttft = 0, n_itl = 0;
    for (Active* a : I.outs) {
      if (!a->got_first) {
        a->got_first = true;
        a->t_first = t_out;
        a->tm.prompt_ms = ms_between(a->t_sched, t_out);
        a->tm.ttft_ms = ms_between(a->h->submitted_, t_out);
        if (n_ttft < 256) ttft_add[n_ttft++] = a->tm.ttft_ms / 1000.0;
      } else if (n_itl < 256) {
        itl_add[n_itl++] = ms_between(a->t_last, t_out) / 1000.0;
      }
      a->t_last = t_out;
      if (a->st.token >= 0) {
        ++a->tm.n_gen;
        ++n_gen_tok;
        a->h->push(std::move(a->ev));
      }
      if (a->stop_hit) {
        a->seq->stop(StopReason::kCallback);
        finish(*a, FinishReason::kStop, Status::ok());
      } else if (a->st.stop != StopReason::kNone) {
        finish(*a, a->st.stop == StopReason::kEog ? FinishReason::kStop : FinishReason::kLength, Status::ok());
      }
    }
    remove_finished();
    {
      std::lock_guard<std::mutex> lk(I.stats_mu);
      SchedulerStats& S = I.stats;
      for (int i = 0; i < n_ttft; ++i) S.ttft.add(ttft_add[i]);
      for (int i = 0; i < n_itl; ++i) S.itl.add(itl_add[i]);
      S.steps += 1;
      S.preemptions += preempted_now;
      S.generated_tokens += static_cast<uint64_t>(n_gen_tok);
      S.prompt_tokens_computed += static_cast<uint64_t>(n_prompt_tok);
      I.window.push_back({t_out, n_prompt_tok, n_gen_tok});
      while (!I.window.empty() && t_out - I.window.front().t > std::chrono::seconds(10)) I.window.pop_front();
    }
    if (observer_) observer_(info);
    publish();
  }

  // Shutdown: everything left is cancelled.
  for (auto& a : I.active) finish(*a, FinishReason::kCancelled, Status::ok());
  I.active.clear();
  for (auto& h : I.waiting) finish_waiting(h, FinishReason::kCancelled);
  I.waiting.clear();
  publish();
}

}  // namespace kiln

// The continuous-batching scheduler (docs/ARCHITECTURE.md, "Scheduler"): one engine thread owns the model, the
// Engine (KV cache + model state) and every sequence; other threads only submit requests and read their token
// channels. Each step spends a token budget (max_batch): first one decode token for every running sequence, then
// chunks of prompts still being prefilled (oldest first), then new requests are admitted at the step boundary while
// a sequence slot (parallel) and KV blocks are free; all of that is one Engine::step. The KV pool (n_ctx token
// slots in total) is shared by all sequences through the paged cache; when a decode token finds no free block, the
// newest running sequence is preempted: its KV blocks are dropped, its tokens kept, and it is recomputed (through
// the prefix cache, which usually still holds its blocks) when blocks are free again. The sampling of all
// sequences of a step runs in parallel on a thread pool.
//
// Prefix cache (SchedulerConfig::prefix_cache, runtime/kv_cache.h): full blocks are indexed by a hash chained over
// their tokens and the model; a request attaches the longest cached prefix of its prompt (recomputing at least the
// last token, whose logits it needs) and prefills only the rest.
//
// This header names no model or backend type (the server includes it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

class Model;

struct SchedulerConfig {
  int64_t n_ctx = 4096;        // KV token slots in total, shared by all sequences (-c)
  int32_t max_batch = 512;     // token budget per step (-b)
  int32_t parallel = 4;        // sequences running at once (--parallel), 1..256
  int64_t max_seq_ctx = 0;     // most tokens one sequence may hold; 0: n_ctx
  bool prefix_cache = true;    // --no-prefix-cache turns it off
  int32_t block_size = 16;     // KV block (token slots)
  bool kv_q8 = false;          // KV storage q8_0 instead of f16
  int sampling_threads = 0;    // 0: min(parallel, cores)
  bool start = true;           // start the engine thread in create() (tests may call start() later)
};

// One generation request (the server has validated and tokenized it; submit() checks it again).
struct GenRequest {
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int32_t max_tokens = -1;         // -1: until EOG or the sequence's context is full
  bool ignore_eos = false;
  std::vector<std::string> stop;   // stop strings (the text up to the first match is returned)
  int32_t top_logprobs = 0;        // alternatives reported per token (with logprobs)
  bool logprobs = false;           // report the log-probability of every generated token
  double timeout_s = 0;            // stop generating after this long (finish "length"); 0: no limit
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
};

// What a request's channel carries: per generated token, the text it releases (text is held back while it could
// still be the start of a stop string, or is incomplete UTF-8) and, when asked for, its log-probabilities. The
// final event of a request may have id -1 (the rest of the text).
struct TokenEvent {
  int32_t id = -1;
  std::string text;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

struct RequestTimings {
  int64_t n_prompt = 0;     // prompt tokens
  int64_t n_cached = 0;     // of which the prefix cache held (not recomputed, on the first admission)
  int64_t n_gen = 0;        // generated tokens (emitted)
  double queue_ms = 0;      // submit -> first scheduled
  double prompt_ms = 0;     // first scheduled -> first token
  double gen_ms = 0;        // first token -> finish
  double ttft_ms = 0;       // submit -> first token
  int32_t n_preempted = 0;  // times this request was preempted
};

// The two ends of a request: the engine thread pushes, the submitter reads (and may cancel).
class RequestHandle {
 public:
  uint64_t id() const { return id_; }
  // Waits up to `wait` for events or the end; moves what arrived into `out` (appended). Returns false once the
  // request has finished and every event was taken.
  bool next(std::vector<TokenEvent>& out, std::chrono::milliseconds wait);
  // Blocks until the request finished; returns every remaining event.
  std::vector<TokenEvent> wait_all();
  // Asks the scheduler to stop this request at the next step (its KV blocks are freed there).
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  bool finished() const;
  FinishReason finish_reason() const;
  Status error() const;
  RequestTimings timings() const;
  const GenRequest& request() const { return req_; }

 private:
  friend class Scheduler;
  RequestHandle(uint64_t id, GenRequest req) : id_(id), req_(std::move(req)) {}
  void push(TokenEvent ev);
  void finish(FinishReason r, const RequestTimings& t, Status err);

  uint64_t id_;
  GenRequest req_;
  std::chrono::steady_clock::time_point submitted_;
  std::atomic<bool> cancel_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;
  FinishReason reason_ = FinishReason::kNone;
  RequestTimings timings_;
  Status error_;
};

// Fixed-bucket histogram (seconds) for time to first token and inter-token latency.
struct Histogram {
  std::vector<double> bounds;     // upper bounds, increasing (+Inf implied)
  std::vector<uint64_t> counts;   // per bucket (not cumulative), bounds.size() + 1 entries
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void add(double v);
};

struct SchedulerStats {
  int64_t queue_depth = 0;         // waiting for a slot or for blocks
  int64_t running = 0;             // sequences holding a slot
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int32_t block_size = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens of finished-prefill requests
  uint64_t prompt_tokens_computed = 0;  // tokens run through the model as prompt (incl. recomputation)
  uint64_t prefix_hit_tokens = 0;  // prompt tokens attached from the prefix cache
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  uint64_t finished[5] = {};       // by FinishReason
  double prompt_tps = 0, gen_tps = 0;  // over the last ~10 s of steps
  Histogram ttft, itl;
};

// Per-step observation for tests and logs.
struct StepInfo {
  int32_t n_tokens = 0, n_decode = 0, n_prefill_tokens = 0, n_seqs = 0, n_admitted = 0, n_preempted = 0;
};

class Scheduler {
 public:
  // Creates the engine for `model` (owned from here on) with cfg's KV pool; errors name the bad option.
  static Result<std::unique_ptr<Scheduler>> create(std::unique_ptr<Model> model, const SchedulerConfig& cfg);
  ~Scheduler();  // cancels what is left and joins the engine thread

  void start();
  // Checks the request (token ids, lengths, sampler values; errors name the field) and queues it.
  Result<std::shared_ptr<RequestHandle>> submit(GenRequest req);
  // Stops admitting; with cancel, running requests are cancelled too. wait(): until the engine thread is idle.
  void shutdown(bool cancel);
  bool wait_idle(std::chrono::milliseconds timeout);

  SchedulerStats stats() const;
  const Tokenizer& tokenizer() const;
  int32_t n_vocab() const;
  int64_t max_seq_ctx() const { return max_seq_ctx_; }
  int64_t n_ctx_train() const;
  const SchedulerConfig& config() const { return cfg_; }
  std::string model_description() const;  // architecture, parameters, placement
  // Called on the engine thread after every step (tests).
  void set_step_observer(std::function<void(const StepInfo&)> f) { observer_ = std::move(f); }

  struct Impl;

 private:
  Scheduler() = default;
  void loop();

  SchedulerConfig cfg_;
  int64_t max_seq_ctx_ = 0;
  std::unique_ptr<Impl> impl_;
  std::function<void(const StepInfo&)> observer_;
};

}  // namespace kiln

// What a client of the engine loop sees (runtime/scheduler.h): the request it submits, the events its tokens come
// back as, and the handle that carries them across threads. `kiln run` and `kiln chat` submit one request at a
// time, the server many; all go through these same types.
//
// This header names no model or backend type (the server includes it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/hooks.h"
#include "runtime/reasoning.h"
#include "runtime/sampler.h"
#include "runtime/stop_reason.h"
#include "util/status.h"

namespace kiln {

// A request's own speculative-decoding limits (llama-server's speculative.n_max / n_min / p_min); -1: the engine's
// (EngineConfig::spec). Scheduler::submit refuses n_max above the engine's draft_max, n_min above n_max, p_min
// outside [0, 1], and any of them on an engine without speculation (n_max 0 excepted: no drafts).
struct SpecRequest {
  int32_t n_max = -1, n_min = -1;
  float p_min = -1.0f;
  bool any() const { return n_max >= 0 || n_min >= 0 || p_min >= 0.0f; }
};

// One generation request (the server has validated and tokenized it; Scheduler::submit checks it again).
struct GenRequest {
  std::vector<int32_t> prompt;
  SamplerParams sampling;
  int32_t max_new_tokens = -1;     // generation limit; -1: until EOG or the sequence's context is full
  bool ignore_eos = false;
  std::vector<std::string> stop;   // stop strings (the text up to the first match is returned)
  int32_t top_logprobs = 0;        // alternatives reported per token (with logprobs)
  bool logprobs = false;           // report the log-probability of every generated token
  double timeout_s = 0;            // stop generating after this long (finish "length"); 0: no limit
  SequenceHooksFactory hooks;      // the sequence's logits processors, token mask, draft proposer; null: none
  SpecRequest spec;                // speculative decoding limits of this request (the engine's by default)
  std::vector<int32_t> text_tokens;  // control tokens whose text the reply shows (a tool-call format's markers)
  ReasoningBudget reasoning;         // the thinking block's budget (runtime/reasoning.h); disabled: not tracked
  // An embedding request (runtime/embedding.h): the prompt runs once, nothing is generated, and the pooled hidden
  // state comes back in RequestEnd::embedding (of the fields above only `prompt` and
  // `timeout_s` apply).
  bool embed = false;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"
// The API's finish reason for a sequence's stop reason: EOG and stop strings are "stop", limits "length".
FinishReason finish_reason_of(StopReason r);

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
  int64_t n_reasoning = 0;  // of which the thinking block's (ReasoningTracker::n_reasoning)
  double queue_ms = 0;      // submit -> first scheduled
  double prompt_ms = 0;     // first scheduled -> first token
  double gen_ms = 0;        // first token -> finish
  double ttft_ms = 0;       // submit -> first token
  int32_t n_preempted = 0;  // times this request was preempted
  int64_t n_draft = 0;          // speculative decoding: draft tokens verified
  int64_t n_draft_accepted = 0;  // of which the samples confirmed
};

// How a request ended, as the engine thread reports it once.
struct RequestEnd {
  FinishReason reason = FinishReason::kNone;
  StopReason stop = StopReason::kNone;  // the finer reason (eog, limit, context_full, stop_string, ...)
  std::string stop_string;              // kStopString: the request's stop string that matched
  RequestTimings timings;
  Status error;
  uint64_t seed = 0;  // the sampler's seed (the random one drawn when the request asked for kRandomSeed)
  std::vector<float> embedding;  // an embedding request that ended well: its pooled result (EmbeddingSetup::n_out)
};

// The two ends of a request: the engine thread pushes, the submitter reads (and may cancel).
class RequestHandle {
 public:
  RequestHandle(uint64_t id, GenRequest req) : id_(id), req_(std::move(req)) {}
  uint64_t id() const { return id_; }
  // Waits up to `wait` for events or the end; moves what arrived into `out` (appended). Returns false once the
  // request has finished and every event was taken.
  bool next(std::vector<TokenEvent>& out, std::chrono::milliseconds wait);
  // Blocks until the request finished; returns every remaining event.
  std::vector<TokenEvent> wait_all();
  // Waits up to `wait` for the request to finish (its events stay queued); whether it has.
  bool wait_done(std::chrono::milliseconds wait);
  // Asks the scheduler to stop this request at the next step (its KV blocks are freed there).
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  bool finished() const;
  FinishReason finish_reason() const;
  StopReason stop_reason() const;
  std::string stop_string() const;  // the stop string that ended the request ("" when none did)
  Status error() const;
  RequestTimings timings() const;
  uint64_t seed() const;
  // An embedding request's result (empty until it finished, or when it failed); moved out by the first call.
  std::vector<float> take_embedding();
  const GenRequest& request() const { return req_; }
  std::chrono::steady_clock::time_point submitted() const { return submitted_; }

  // The engine side (Scheduler only).
  void set_submitted(std::chrono::steady_clock::time_point t) { submitted_ = t; }
  void push(TokenEvent ev);
  void finish(RequestEnd end);

 private:
  uint64_t id_;
  GenRequest req_;
  std::chrono::steady_clock::time_point submitted_;
  std::atomic<bool> cancel_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool done_ = false;
  RequestEnd end_;
};

}  // namespace kiln

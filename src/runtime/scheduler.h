// The engine loop (docs/ARCHITECTURE.md, "The engine loop"): the one driver of generation. `kiln serve` submits
// many requests, `kiln run` and `kiln chat` one at a time; all take the same path. One engine thread owns the
// model, the Engine (KV cache + model state) and every sequence; other threads only submit requests and read their
// token channels (runtime/request.h).
//
// Each step is three functions, as in vLLM's v1 engine core:
//   schedule()  which sequences run and how many tokens each, within the step's token budget (batch_tokens) and
//               output rows: one pass over the running sequences, those decoding (one pending token) before those
//               with prompt left, oldest first; no separate prefill or decode phase. Then waiting requests are
//               admitted while a sequence slot and KV blocks are free. A decode token that finds no free block
//               preempts the newest running sequence (its blocks are dropped, its tokens kept; it is recomputed,
//               usually through the prefix cache, once blocks are free).
//   execute()   plan -> forward -> fetch: one Engine::step for every scheduled token; per output row the argmax or
//               the logits row, as the sequence needs.
//   update()    per output row, in parallel over sequences: the logits-processor chain and the sampler
//               (runtime/hooks.h), then in order: append, stop checks (EOG, max_new_tokens, context, stop strings,
//               runtime/stop_filter.h), the token event out, finished sequences free their slot and blocks.
//
// Prefix cache (EngineConfig::prefix_cache, runtime/kv_cache.h): full blocks are indexed by a hash chained over
// their tokens and the model; a request attaches the longest cached prefix of its prompt (recomputing at least the
// last token, whose logits it needs) and prefills only the rest. This is also how a chat turn reuses the
// conversation before it.
//
// Hybrid models (recurrent + attention layers) resume only where a checkpoint of the recurrent state was kept
// (EngineConfig::ctx_checkpoints per slot, one LRU pool; runtime/kv_cache.h). While a prompt of P tokens is
// prefilled, its chunks end at the checkpoint positions and the state is copied after them:
//   - the last block boundary before its last token, floor((P - 1) / block) * block: a chat's next turn repeats
//     this prompt and resumes there;
//   - for long prompts also every `every` tokens, every = the smallest power of two >= max(kCheckpointSpacing,
//     P / (N - 1)) with N = ctx_checkpoints: a shared long prefix (a document, a system prompt) resumes at most
//     `every` tokens before it ends, and one prompt makes at most N checkpoints, so it does not evict the others'.
// Every block would cost a copy of the whole state (tens of MiB on real models) per block_size tokens and churn the
// pool; the decode never makes one (a chat template re-renders the reply anyway).
//
// This header names no model or backend type (the server includes it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/embedding.h"
#include "runtime/engine_config.h"
#include "runtime/request.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

class Model;

// Fixed-bucket histogram (seconds) for time to first token and inter-token latency.
struct Histogram {
  std::vector<double> bounds;     // upper bounds, increasing (+Inf implied)
  std::vector<uint64_t> counts;   // per bucket (not cumulative), bounds.size() + 1 entries
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void add(double v);
};

// One sequence slot as the last step left it (GET /slots).
struct SlotState {
  int32_t id = 0;
  bool busy = false;
  uint64_t request = 0;     // RequestHandle::id() of the request holding it
  int64_t n_prompt = 0;     // the request's prompt tokens
  int64_t n_cached = 0;     // tokens of the sequence in the KV cache
  int64_t n_gen = 0;        // generated so far
  int64_t n_ctx = 0;        // tokens the sequence may hold
};

struct SchedulerStats {
  int64_t queue_depth = 0;         // waiting for a slot or for blocks
  int64_t running = 0;             // sequences holding a slot
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_free = 0, kv_blocks_cached = 0;
  int64_t kv_checkpoints_total = 0, kv_checkpoints_used = 0;  // hybrid models' recurrent-state checkpoints
  int32_t block_size = 0;
  uint64_t prompt_tokens = 0;      // prompt tokens of admitted requests
  uint64_t prompt_tokens_computed = 0;  // tokens run through the model as prompt (incl. recomputation)
  uint64_t prefix_hit_tokens = 0;  // prompt tokens attached from the prefix cache
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  uint64_t draft_tokens = 0, draft_accepted = 0;  // speculative decoding: drafts verified, drafts confirmed
  // Engine-thread wall time: choosing the output kinds before the steps, which includes the token masks computed
  // ahead for the device's masked argmax; and sampling the output rows after them (host masks, samplers).
  double mask_seconds = 0, sample_seconds = 0;
  uint64_t finished[5] = {};       // by FinishReason
  double prompt_tps = 0, gen_tps = 0;  // over the last ~10 s of steps
  Histogram ttft, itl;
  std::vector<SlotState> slots;    // every slot (max_seqs), by id
};

// What schedule() decided for one step (the step observer's view; tests).
struct StepInfo {
  struct Entry {
    uint64_t request = 0;  // RequestHandle::id()
    int32_t n_tokens = 0;  // tokens of this sequence in the step
    bool output = false;   // the chunk ends at the sequence's last token: an output row (a sampled token)
    bool row = false;      // its output's logits row(s) came to the host (else only the device's argmax)
    bool masked = false;   // the device took the argmax over its token mask (runtime/hooks.h, allowed_ahead)
  };
  int32_t n_tokens = 0, n_decode = 0, n_prefill_tokens = 0, n_seqs = 0, n_admitted = 0, n_preempted = 0;
  std::vector<Entry> entries;  // in batch order (filled only while an observer is set)
};

// A request's speculative limits (GenRequest::spec) against the engine's; errors start with llama-server's field
// name (speculative.n_max, speculative.n_min, speculative.p_min). Scheduler::submit runs it.
Status check_spec_request(const SpecRequest& r, const SpecConfig& sp);

class Scheduler {
 public:
  // Creates the engine for `model` (owned from here on) with cfg's KV pool; errors name the bad option. `draft`:
  // the draft model of cfg.spec.type kDraft (runtime/draft_model.h: its vocabulary is checked, it gets its own KV
  // cache), required by that type and refused by the others.
  static Result<std::unique_ptr<Scheduler>> create(std::unique_ptr<Model> model, const EngineConfig& cfg,
                                                   std::unique_ptr<Model> draft = nullptr);
  ~Scheduler();  // cancels what is left and joins the engine thread

  void start();
  // Checks the request (token ids, lengths, sampler values; errors name the field) and queues it.
  Result<std::shared_ptr<RequestHandle>> submit(GenRequest req);
  // Stops admitting; with cancel, running requests are cancelled too. wait_idle(): until nothing is pending.
  void shutdown(bool cancel);
  bool wait_idle(std::chrono::milliseconds timeout);

  SchedulerStats stats() const;
  const Tokenizer& tokenizer() const;
  int32_t n_vocab() const;
  int64_t max_seq_ctx() const;
  int64_t n_ctx_train() const;
  const EngineConfig& config() const;
  // What embedding requests get (on = false: they are refused); set from EngineConfig::embeddings / pooling.
  const EmbeddingSetup& embedding() const;
  std::string model_description() const;  // architecture, parameters, placement
  // The model (the CLI prints its sizes) and the bytes of KV storage.
  const Model& model() const;
  const Model* draft_model() const;  // null without one
  const KvCacheConfig* draft_cache_config() const;  // the draft model's KV cache (-ctkd / -ctvd); null without one
  uint64_t kv_bytes() const;
  uint64_t checkpoint_bytes() const;  // hybrid models' recurrent-state checkpoints (0: none kept)
  // Called on the engine thread after every step that ran the model (tests). Set it before start() or while idle.
  void set_step_observer(std::function<void(const StepInfo&)> f);

  struct Impl;

 private:
  Scheduler() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln

// The engine thread's state (runtime/scheduler.h): private to scheduler.cpp (creation, submission, the thread) and
// scheduler_step.cpp (one step: schedule -> execute -> update).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/draft_model.h"
#include "runtime/dry.h"
#include "runtime/engine.h"
#include "runtime/mtp_draft.h"
#include "runtime/pooler.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/stop_filter.h"
#include "util/thread_pool.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// One admitted request. The fields under "this step" are written by schedule() and read by execute() and update()
// of the same step.
struct Active {
  std::shared_ptr<RequestHandle> h;
  std::unique_ptr<Sequence> seq;
  int32_t slot = -1;        // block-table row; -1 once finished (removed at the end of the step)
  StopFilter stops;         // the request's stop strings
  bool started = false;     // scheduled at least once
  bool got_first = false;   // produced its first output
  Clock::time_point t_sched, t_first, t_last;
  Clock::time_point deadline = Clock::time_point::max();
  RequestTimings tm;
  // Hybrid models with checkpoints (Scheduler::Impl::checkpoint_at): the prompt's checkpoint spacing (0: none but
  // the last) and its last checkpoint position (0: none).
  int64_t ckpt_every = 0, ckpt_last = 0;
  // Prefill progress (EngineConfig::on_prefill): where this prefill began (-1: not begun), when, when last shown.
  int64_t prefill_from = -1;
  Clock::time_point t_prefill, t_shown;
  bool shown = false;
  // This step.
  bool scheduled = false, wants = false;
  bool preempted_now = false;  // preempted in this step: recomputed from the next one on
  // A hybrid model's rollback left the confirmed tokens pending again with the last sample (Scheduler::Impl::settle):
  // they decode together, with drafts, until a step runs them all.
  bool replay = false;
  size_t n_sched = 0;
  OutputKind kind = OutputKind::kArgmax;
  int32_t spec_max = 0, spec_min = 0;  // the request's draft limits (GenRequest::spec, else EngineConfig::spec)
  std::vector<int32_t> draft;  // the drafts verified in this step (after the pending token)
  size_t row0 = 0;             // its first output row; 1 + draft.size() rows when it wants output
  int64_t pos0 = 0;            // the position of its first token in the step
  struct Out {
    Sequence::Step st;
    TokenEvent ev;
  };
  std::vector<Out> outs;  // what this step emitted: one per sampled row until a draft is rejected or it stops
  // An embedding request (GenRequest::embed): its pooled hidden states; tok0 = its first token's batch row.
  std::unique_ptr<Pooler> pool;
  size_t tok0 = 0;
};

struct Scheduler::Impl {
  EngineConfig cfg;
  int64_t max_seq_ctx = 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
  std::shared_ptr<DraftModel> draft;  // SpecConfig::kDraft: shared with the sequences' proposers
  std::shared_ptr<MtpDraft> mtp;      // SpecConfig::kMtp: likewise
  EmbeddingInfo emb_info;  // embeddings on: the model's pooling key and head (model/embedding.h)
  EmbeddingSetup emb;      // what embedding requests get (runtime/embedding.h)
  std::unique_ptr<ThreadPool> pool;  // samples the output rows of a step in parallel
  std::thread thread;

  // Submitters -> engine thread.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<RequestHandle>> incoming;
  bool stop = false, draining = false, cancel_all = false;
  uint64_t next_id = 1;
  std::atomic<int64_t> n_pending{0};  // submitted, not finished

  // DRY's sequence breakers resolved for the vocabulary, by their strings: submitters share them (the first request
  // with a new list pays the scan of the vocabulary, on its own thread). At most kDryCacheSize lists are kept.
  static constexpr size_t kDryCacheSize = 32;
  std::mutex dry_mu;
  std::map<std::vector<std::string>, std::shared_ptr<const DryBreakers>> dry_cache;
  std::shared_ptr<const DryBreakers> dry_breakers(const std::vector<std::string>& strings);

  // Engine thread only.
  std::deque<std::shared_ptr<RequestHandle>> waiting;
  std::vector<std::unique_ptr<Active>> active;  // oldest first
  std::vector<int32_t> free_slots;
  struct Notice {
    std::shared_ptr<RequestHandle> h;
    RequestEnd end;
  };
  std::vector<Notice> notify;  // finished this step; told after the gauges are published
  std::function<void(const StepInfo&)> observer;

  // The step being built (schedule() fills, execute() and update() read).
  Batch batch;
  std::vector<Active*> order, sched, outs;
  std::vector<OutputKind> kinds;  // [max_outputs]
  std::vector<const uint64_t*> row_masks;  // [max_outputs] a kMaskedArgmax row's mask (Sequence::step_mask)
  bool device_mask = false;       // the engine takes kMaskedArgmax rows (Engine::supports_masked_argmax)
  std::vector<int32_t> drafts;    // [cfg.spec.drafts_per_step()] DraftProposer output
  std::vector<DraftJob> draft_jobs;  // draft_ahead(): the step's decoding sequences
  StepInfo info;
  int64_t tokens_left = 0, outs_left = 0;  // what is left of batch_tokens and max_outputs in this step
  int64_t n_prompt_tok = 0;       // prompt tokens computed in this step (incl. recomputation)
  std::vector<double> ttft, itl;  // latencies observed in this step (seconds)

  mutable std::mutex stats_mu;
  SchedulerStats stats;
  struct Tick {
    Clock::time_point t;
    int64_t prompt, gen;
  };
  std::deque<Tick> window;

  // ---- the loop (scheduler_step.cpp) ----
  void loop();
  bool step();  // one iteration; false once the scheduler stops

  // Requests join at the step boundary; false: stop.
  bool take_incoming();
  // Cancelled and timed-out requests end here (their blocks are freed now).
  void expire();
  void schedule();
  bool execute(StepOutputs* out);
  void update(const StepOutputs& out);
  // Nothing could be scheduled: preempt, or fail the one request that can never fit.
  void stall();

  // schedule() pieces.
  bool decoding(const Active& a) const;  // its prompt is in the cache and one token is pending (or a replay's)
  bool has_kv(const Active& a) const;
  int64_t decode_room(Active& a);        // pending + drafts when the decode fits (preempting if needed), else 0
  int64_t propose_drafts(Active& a);     // fills a.draft: how many
  int64_t draft_limit(const Active& a) const;  // a's drafts at most, before the step's budget
  void draft_ahead();                    // the batched drafts of the step (DraftBatch), before the decodes
  int64_t chunk_room(Active& a);         // prompt tokens of a that fit tokens_left and the free blocks
  int64_t fit(const Active& a, int64_t n, int64_t free_blocks) const;
  int64_t prompt_chunk(const Active& a) const;  // pending tokens for the next chunk, ending at a checkpoint
  int64_t whole_or_none(const Active& a, int64_t n) const;  // an encoder runs a sequence whole: n, or 0 to wait
  void attach(Active& a);                // prefix cache
  // Hybrid models: whether a checkpoint is kept at position pos of a's sequence; the next such position after pos.
  bool checkpoint_at(const Active& a, int64_t pos) const;
  int64_t next_checkpoint(const Active& a, int64_t pos) const;
  void put(Active& a, size_t n);
  void preempt(Active& a);
  void admit();
  std::unique_ptr<Active> make_active(const std::shared_ptr<RequestHandle>& h, int32_t slot);

  // execute() pieces.
  void prepare_outputs();  // a.kind of every sequence that wants output; masks computed ahead (in parallel)

  // update() pieces.
  void sample(Active& a, const StepOutputs& out);
  // After a's rows are sampled, before its tokens go out: a hybrid model's rejected drafts roll its recurrent state
  // back (Engine::restore_verify_state); a proposer that wants them gets the step's hidden rows of a's tokens.
  void settle(Active& a, const StepOutputs& out);
  void pool_rows(Active& a, const StepOutputs& out);  // an embedding request's rows of the step; finishes it at the end
  void deliver(Active& a, Clock::time_point now);
  void record(Clock::time_point now, int64_t n_gen, uint64_t drafted, uint64_t confirmed);
  void progress(Active& a, Clock::time_point t_step, Clock::time_point now);  // EngineConfig::on_prefill

  // Ends a request: the held-back text goes out, its blocks and slot are freed, the handle hears at publish().
  void finish(Active& a, StopReason r, Status err = Status::ok());
  void finish_waiting(const std::shared_ptr<RequestHandle>& h, StopReason r);
  void remove_finished();
  void publish();
};

// FNV-1a over the model's identity (architecture, name, shape, weights) and the K and V cache types: the first link
// of the prefix cache's hash chain.
uint64_t model_identity(const Model& m, DType type_k, DType type_v);

}  // namespace kiln

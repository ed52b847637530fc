// Per-sequence generation state, kept apart from the model and the KV cache so that the scheduler (the one engine
// loop, runtime/scheduler.h) can drive many sequences through shared forward passes (continuous batching): each
// step it asks every sequence to schedule some of its pending tokens into one Batch, runs Engine::step once,
// commits, and hands each sequence that asked for an output its row (or the device's argmax).
//
// Token flow: append() queues tokens (the prompt) as pending; schedule() moves the next chunk of pending tokens
// into a batch at positions n_cached() .. (the last pending token asks for an output); commit() marks the chunk as
// stored in the cache (rollback() after a failed step); on_logits() runs the row through the sequence's
// logits-processor chain (runtime/hooks.h) and the sampler, applies the stop rules and, unless stopping, queues
// the sampled token as the next pending one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/step.h"
#include "runtime/hooks.h"
#include "runtime/kv_cache.h"
#include "runtime/reasoning.h"
#include "runtime/sampler.h"
#include "runtime/stop_reason.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

struct SequenceOptions {
  int32_t max_new_tokens = -1;  // tokens to generate; -1: until EOG or the context is full
  bool ignore_eos = false;      // keep going past EOG tokens (they are emitted like any other)
  SamplerParams sampling;
  std::vector<int32_t> text_tokens;  // control tokens rendered as their text (GenRequest::text_tokens)
  bool no_outputs = false;      // an embedding request: no token asks for an output row (hidden states instead)
  ReasoningBudget reasoning;    // the thinking block's budget: its forced close replaces sampled tokens
};

class Sequence {
 public:
  // n_ctx: the most tokens this sequence may hold in the cache. n_vocab: rows of logits / valid ids. cache: the
  // KV cache bookkeeping that holds this sequence's length (the one place it lives; must outlive the Sequence).
  Sequence(int32_t seq_id, const Tokenizer& tok, int32_t n_vocab, int64_t n_ctx, const SequenceOptions& opts,
           KvCache& cache);

  Status validate() const;  // sampler parameters, max_new_tokens
  int32_t id() const { return id_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Every token of the sequence: cached first, then pending.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t n_cached() const { return cache_.seq_len(id_); }
  size_t n_pending() const {  // 0 while a verify step's drafts sit in the cache (commit .. settle_drafts)
    const int64_t n = static_cast<int64_t>(tokens_.size()) - (n_cached() + n_scheduled_);
    return n > 0 ? static_cast<size_t>(n) : 0;
  }

  // Queues tokens to feed; they also enter the sampler's history (penalties, DRY). Errors (nothing queued): an id
  // outside [0, n_vocab) (names its index), or more tokens than the context holds.
  Status append(std::span<const int32_t> ids);
  // Forgets tokens from position `pos` on (cached or pending) and truncates the cache to match. The penalty
  // and DRY windows are rebuilt from what remains.
  void truncate(int64_t pos);
  // Adds up to max_n pending tokens to `batch` (positions continue the cache; want_logits on the last pending
  // token only, none with no_outputs). Returns how many; at most one chunk may be outstanding.
  size_t schedule(Batch& batch, size_t max_n);
  bool scheduled_wants_logits() const { return scheduled_logits_; }
  // A decode that verifies drafts (runtime/hooks.h DraftProposer): the pending tokens (one, or after a hybrid
  // model's rollback the confirmed tokens run again and the last sample) and `drafts` after them; the last pending
  // token and each draft ask for an output row. Returns the pending tokens + drafts.size() (0 when a chunk is
  // outstanding or nothing is pending). The drafts become tokens of the sequence only as the samples of their rows
  // confirm them (on_logits / on_token); settle_drafts(n) after the rows: the cache keeps the pending tokens and the
  // first n drafts, the rejected drafts' slots go.
  size_t schedule_drafts(Batch& batch, std::span<const int32_t> drafts);
  void settle_drafts(size_t n_confirmed);
  void commit();    // the scheduled chunk is in the cache (the engine committed its length)
  void rollback();  // the forward pass failed: the chunk is pending again

  // Starts generating: resets the generated-token count and the stop state.
  void begin_turn();
  // The hooks this sequence runs with (runtime/hooks.h); set before the first step.
  void set_hooks(SequenceHooks hooks) { hooks_ = std::move(hooks); }
  SequenceHooks& hooks() { return hooks_; }
  struct Step {
    int32_t token = -1;     // the sampled token (-1 if nothing was emitted)
    std::string piece;      // its complete UTF-8 text so far (StreamDecoder)
    StopReason stop = StopReason::kNone;
    Status error;           // a hook failed (a token mask that allows nothing): the sequence must end
  };
  // Samples from the logits row of the last fed token (n_vocab floats, not modified) through the logits-processor
  // chain: processors, token mask, sampler. The token is emitted (returned with its text) unless it is an EOG token
  // without ignore_eos; it is queued for feeding unless the sequence stops.
  Step on_logits(std::span<const float> row);
  // The same with the token already chosen (the backend's argmax when output_kind() is kArgmax).
  Step on_token(int32_t id);
  // The device's masked argmax of a kMaskedArgmax row: on_token(id), or, for -1 (the mask allowed no token), the
  // error on_logits gives for such a mask.
  Step on_masked_token(int32_t id);
  // What the step should fetch for this sequence's output row: the argmax when the sampler only takes the argmax
  // (Sampler::argmax_only) and no hook needs the row.
  OutputKind output_kind() const;
  // The same, before a step whose output backend may take a masked argmax (`device_mask`: the engine supports it
  // and the sequence samples one row): where output_kind() fetches the row only for a restricting mask whose
  // allowed() may be asked ahead (runtime/hooks.h), it is asked now into step_mask() and the answer is
  // kMaskedArgmax; kArgmax when the mask leaves every token allowed this time, or a forced token will be emitted.
  OutputKind prepare_output(bool device_mask);
  // The mask prepare_output() computed: ceil(n_vocab / 64) words, valid until the row's token is taken.
  const uint64_t* step_mask() const { return mask_.data(); }
  // Text held back by the stream decoder (an incomplete UTF-8 tail) at the end of a turn.
  std::string flush_text() { return decoder_.flush(); }
  // Marks the sequence stopped from outside (e.g. the consumer hung up).
  void stop(StopReason r) { stop_ = r; }
  StopReason stop_reason() const { return stop_; }
  int32_t n_generated() const { return n_generated_; }
  int32_t n_reasoning() const { return reasoning_.n_reasoning(); }  // generated tokens of the thinking block
  Sampler& sampler() { return sampler_; }
  const Sampler& sampler() const { return sampler_; }

 private:
  int32_t id_;
  const Tokenizer& tok_;
  int32_t n_vocab_;
  int64_t n_ctx_;
  SequenceOptions opts_;
  Sampler sampler_;
  StreamDecoder decoder_;
  KvCache& cache_;
  SequenceHooks hooks_;
  ReasoningTracker reasoning_;
  Step no_token_allowed();       // ends the sequence: the mask allowed no token
  std::vector<float> row_;       // [n_vocab] the processed copy of a logits row (only with hooks)
  std::vector<uint64_t> mask_;   // [ceil(n_vocab / 64)] the token mask's bits (only with a mask)
  std::vector<int32_t> tokens_;
  int64_t n_scheduled_ = 0;   // tokens in the outstanding chunk
  int64_t verify_base_ = -1;  // with drafts outstanding: the cache length the pending token ends at
  bool scheduled_logits_ = false;
  int32_t n_generated_ = 0;
  StopReason stop_ = StopReason::kNone;
};

}  // namespace kiln

// The engine: one model, its KV cache bookkeeping (runtime/kv_cache.h) and its ModelState (storage, workspace),
// and the step planner between them (docs/ARCHITECTURE.md, "A step"). Every caller that runs the network (the
// generator, bench, perplexity, logits, later the server's scheduler) goes through it.
//
// plan (here, host): validates the batch (token ids, sequence ids, positions continuing each sequence), reserves
// cache blocks, resolves slots and block tables, chooses buckets, writes the StepPlan; execute and fetch are the
// ModelState's. The planner is where value checks live (ops check only shapes and dtypes): its errors name the
// batch token and the sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/kv_cache.h"
#include "util/status.h"

namespace kiln {

class Engine {
 public:
  // Checks the KV storage this config needs against the backends' memory before allocating anything.
  static Result<std::unique_ptr<Engine>> create(Model& model, const KvCacheConfig& cfg);

  Model& model() { return model_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  ModelState& state() { return *state_; }
  const StepCaps& caps() const { return state_->caps(); }

  // One step: tokens.size() <= caps().batch_tokens and at most caps().max_outputs want_logits tokens; kinds[i] says
  // what output i (the i-th want_logits token, in batch order) brings back. hidden: a hidden step (model/step.h:
  // every token's final-norm hidden state comes back too; needs KvCacheConfig::hidden). The outputs stay valid
  // until the next step. On error nothing is committed (the reservations are dropped).
  // masks: per output row (as kinds), for a kMaskedArgmax row its allowed-token bits, ceil(n_vocab / 64) words
  // (TokenMaskProvider::allowed's layout); other rows' entries are not read. kMaskedArgmax needs
  // supports_masked_argmax().
  // hidden_in: a NextN view (model/mtp.h, takes_hidden_in()) takes one hidden row per token, [n_tok][n_embd] in
  // batch order; other models take none.
  Result<StepOutputs> step(std::span<const BatchToken> tokens, std::span<const OutputKind> kinds, bool hidden = false,
                           std::span<const uint64_t* const> masks = {}, std::span<const float> hidden_in = {});
  bool takes_hidden_in() const { return state_->plan().hidden_in != nullptr; }
  // Whether step() takes kMaskedArgmax rows (the output backend runs argmax_masked).
  bool supports_masked_argmax() const { return state_->supports_masked_argmax(); }
  // Any batch: split into steps within the caps (in order; a sequence's tokens stay in order); for every
  // want_logits token, in batch order, n_vocab logits into `logits` (resized; may be null: the rows still come back
  // to the step's host staging, as every step's outputs do, and are not copied further).
  Status forward(const Batch& batch, std::vector<float>* logits);

  // ---- hybrid models (ModelState::has_recurrent_state: linear-attention layers with per-sequence state) ----
  // The recurrent state of a sequence slot is valid for exactly the tokens the cache holds for it: a step that
  // starts a sequence at position 0 zeroes it (StepPlan::seq_reset); a step that continues a sequence whose state
  // does not match its cache length (the cache was truncated to a position > 0, or a step failed part way) is
  // refused, naming the sequence: restart it from position 0. Freeing a sequence (truncate to 0) needs nothing
  // more. Prefix reuse needs checkpoints (KvCacheConfig::checkpoints: cached K/V without the matching state would
  // be wrong): without them Engine::create turns KvCacheConfig::prefix_cache off.
  bool recurrent() const { return recurrent_; }
  // The prefix cache for any model: the empty sequence seq gets the longest cached prefix of `tokens` of at most
  // `limit` tokens (KvCache::attach_prefix); a hybrid model's sequence starts at a checkpoint, its recurrent state
  // restored from it. Returns the sequence's length (0: nothing attached).
  int64_t attach_prefix(int32_t seq, std::span<const int32_t> tokens, int64_t limit);
  // Whether hybrid-model checkpoints are kept (a hybrid model with the prefix cache and KvCacheConfig::checkpoints).
  bool checkpoints() const { return cache_->config().checkpoints > 0; }
  // Keeps seq's recurrent state at its current length, a block boundary whose block cache_blocks() has indexed
  // (KvCache::add_checkpoint; nothing when that block has one already, or without checkpoints).
  Status checkpoint(int32_t seq);
  // dst shares src's cache blocks (KvCache::fork) and gets a copy of its recurrent state: the way to fork a
  // sequence (parallel sampling) on any model.
  Status fork(int32_t src, int32_t dst);
  // Draft verification on a hybrid model (KvCacheConfig::verify_states): a step that runs a sequence's pending token
  // and its drafts advances the recurrent state past all of them. save_verify_state(seq) before that step keeps
  // seq's state at its current length; restore_verify_state(seq) after it puts the state back and truncates the
  // cache to that length (the confirmed tokens then run again, as pending tokens: the state cannot stop part way
  // through a step). Both need verify states (kInternal without).
  bool verify_states() const { return verify_states_; }
  Status save_verify_state(int32_t seq);
  Status restore_verify_state(int32_t seq);

  // Buckets and padding even on a host-only placement (tests: the padding rules are checked on the CPU too).
  void force_buckets(bool on) { force_buckets_ = on; }
  bool buckets() const { return force_buckets_ || state_->wants_buckets(); }
  // Rounds n up to its bucket (model/step.h), or returns n when the placement does not want buckets.
  int32_t bucket_tokens(int32_t n) const;
  int32_t bucket_kv(int32_t n) const;

 private:
  Engine(Model& m) : model_(m) {}
  Status plan(std::span<const BatchToken> tokens, std::span<const OutputKind> kinds, bool hidden,
              std::span<const uint64_t* const> masks, std::span<const float> hidden_in);
  // The masks of a masked step into the plan's staging (rows [0, n_out)).
  void plan_masks(std::span<const uint64_t* const> masks);

  Model& model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ModelState> state_;
  // Planner scratch, sized at creation (max_seqs entries): tokens of each sequence in this step, its plan index.
  std::vector<int64_t> count_;
  std::vector<int32_t> seq_index_;
  std::vector<int32_t> seqs_;
  std::vector<int32_t> dirty_;
  std::vector<OutputKind> kinds_;  // forward(): all kLogits
  bool force_buckets_ = false;
  bool recurrent_ = false;
  bool verify_states_ = false;
  int32_t verify_base_ = 0;          // the first verify row among the state's checkpoint rows (after the cache's)
  std::vector<int64_t> verify_pos_;  // per slot: the length its saved verify state is for (-1: none)
  std::vector<int64_t> state_pos_;  // hybrid models: per slot, the cache length its recurrent state is for (-1: none)
};

}  // namespace kiln

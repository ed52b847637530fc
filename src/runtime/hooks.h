// The per-sequence hooks of the engine step (docs/ARCHITECTURE.md, "The engine loop"). A request may bring its own
// instances (GenRequest::hooks builds them when the request is admitted); they live with the request's Sequence
// and run on the engine thread only, one sequence each, so they need no locking. kiln ships the identity of each:
// no logits processor, no token mask, no drafts. Grammar-constrained sampling is a TokenMaskProvider
// (runtime/grammar_mask.h); speculative decoding plugs in as a DraftProposer.
//
// Where they sit in one step (Scheduler: schedule -> execute -> update):
//   schedule()  DraftBatch::propose once for the decoding sequences whose proposers draft together, then
//               DraftProposer::propose for each sequence that decodes (its only pending token is its last sample)
//   execute()   plan -> forward -> fetch: a greedy sequence whose sampler only takes the argmax
//               (Sampler::argmax_only: no logit bias, penalty, DRY, typical or XTC) and that has no logits processor
//               takes the device's argmax (OutputKind::kArgmax) and no row leaves the device; with a restricting
//               mask whose allowed() may be asked ahead (TokenMaskProvider::allowed_ahead) and one output row (no
//               drafts), allowed() runs here, before the step, and the device takes the argmax over the allowed
//               tokens (OutputKind::kMaskedArgmax; the output backend must run Backend::argmax_masked). Any other
//               sequence with a processor or a restricting mask fetches its logits row (OutputKind::kLogits)
//   update()    per output row: copy of the row -> LogitsProcessor::process (in order) -> TokenMaskProvider::allowed
//               (disallowed ids set to -inf) -> the sampler (runtime/sampler.h: logit bias -> penalties -> DRY ->
//               top-k -> typical -> top-p -> min-p -> XTC -> temperature -> draw) -> TokenMaskProvider::accept(token)
//               -> stop checks (EOG, TokenMaskProvider::finished, max_new_tokens, context, stop strings) -> the token
//               event streams out. A kMaskedArgmax row skips the row steps: its token (or, when the mask allowed
//               nothing, the same error as below) goes to accept() and on. Log-probabilities are those of the raw row (the model's distribution, before any
//               processor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace kiln {

// One link of a sequence's logits-processor chain: rewrites the sequence's own copy of its logits row (n_vocab
// floats, raw model output) in place before the sampler sees it. -inf removes a token; NaN is never written.
class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  virtual void process(std::span<float> logits) = 0;
};

// Says which tokens may come next (grammar-constrained sampling, JSON schemas, tool-call formats).
//   restricts()      asked once per step in execute(): false promises that allowed() will leave every token
//                    allowed, so a greedy sequence may keep the device's argmax instead of fetching its row.
//   allowed_ahead()  true promises that allowed() is a function of the state the last accept() (or construction)
//                    left, and changes nothing a later call could see: a greedy sequence may then call it in
//                    execute(), before the step computes the row it masks, instead of in update() (and not again
//                    for that row). false (the default): allowed() is asked in update() only.
//   allowed(mask)    update(), before the sampler, once per sampled position (or execute(), see allowed_ahead): `mask` holds n_vocab bits in
//                    ceil(n_vocab / 64) words, bit (i % 64) of word i / 64 set = token i may come next; it arrives
//                    all set (bits past n_vocab are ignored). Returns false to leave every token allowed (nothing is
//                    touched), true when it wrote a mask. A mask that allows no token ends the request with an error.
//   accept(token)    update(), after the token is chosen (EOG tokens included), before the stop checks: the provider
//                    advances its state. Prompt tokens are never passed; a preempted sequence is recomputed without
//                    calls (its state is that of the tokens it has generated).
//   accept_in_block(token, text, n_block)
//                    update(), in place of accept(token), while the sequence tracks a thinking block
//                    (runtime/reasoning.h; GenRequest::reasoning), from the reply's first token to the one that ends
//                    the block (EOG tokens excepted): `text` is the token's bytes (special tokens rendered), of which
//                    the first n_block are the block's (ReasoningTracker::accept). The default is accept(token); a
//                    lazy grammar scans only the text outside the block for its trigger.
//   finished()       update(), after accept(): true when nothing but an end of generation may follow (a grammar that
//                    is complete and cannot go on). The sequence then ends there, as at an EOG token ("stop"),
//                    without a step for the EOG token, and also with ignore_eos.
class TokenMaskProvider {
 public:
  virtual ~TokenMaskProvider() = default;
  virtual bool restricts() const = 0;
  virtual bool allowed_ahead() const { return false; }
  virtual bool allowed(std::span<uint64_t> mask) = 0;
  virtual void accept(int32_t token) = 0;
  virtual void accept_in_block(int32_t token, std::string_view /*text*/, size_t /*n_block*/) { accept(token); }
  virtual bool finished() const { return false; }
};

// Proposes draft tokens for a decoding sequence (speculative decoding: a draft model, n-grams of the context, ...).
//   propose(tokens, max_k, out)   schedule(), for a sequence whose only pending token is its last sampled one:
//                                 writes up to max_k ids that may follow `tokens` (the whole sequence, prompt and
//                                 generated, the last one not in the cache yet) into out[0..) and returns how many.
//   accepted(n)                   update(), after the step: how many of the proposed drafts the sampler confirmed.
// Verification: the step runs the last token and the k drafts as one chunk with k + 1 output rows; update() samples
// row 0, and while the sample equals draft j it samples row j + 1; the confirmed drafts and the one sampled token
// stay, the cache is truncated past them. max_k is at most EngineConfig::spec's draft_max (0 with speculation off:
// every decode step is one token) and what the step's token, output and KV budgets leave. Sampling each row as
// usual and stopping at the first mismatch is the rejection rule for drafts proposed with certainty (prompt
// lookup): the distribution of every emitted token is the sampler's.
class DraftBatch;
class DraftProposer {
 public:
  virtual ~DraftProposer() = default;
  virtual int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) = 0;
  virtual void accepted(int32_t n) = 0;
  // The batch this proposer drafts in (null: it drafts alone, in propose()). The proposers of one batch share it.
  virtual DraftBatch* batch() { return nullptr; }
  // A proposer that drafts from the model's own hidden states (runtime/mtp_draft.h) says so: every step then
  // brings back the final-norm hidden row of each token (a hidden step, model/step.h), and hidden_rows() hands
  // over those of this sequence.
  virtual bool wants_hidden() const { return false; }
  //   hidden_rows(tokens, pos0, rows, n, n_embd)
  //                               update(), on the engine thread, after the step's samples (tokens: the whole
  //                               sequence as they left it, the new pending token included): the rows of the
  //                               sequence's tokens at positions pos0 .. pos0 + n - 1, [n][n_embd], those that stay
  //                               (a verify step's rejected drafts are left out). Valid during the call only.
  virtual void hidden_rows(std::span<const int32_t> tokens, int64_t pos0, const float* rows, int64_t n,
                           int64_t n_embd) {
    (void)tokens, (void)pos0, (void)rows, (void)n, (void)n_embd;
  }
};

// A proposer that counts its drafts: propose() reports what it returns through proposed(k), and accepted() adds
// those k and the n confirmed to the totals (DraftModelProposer, MtpProposer). accepted() may run on a sampling
// thread (Scheduler::update): it touches only these counters.
class CountingProposer : public DraftProposer {
 public:
  void accepted(int32_t n) override {
    n_proposed_ += last_k_;
    n_accepted_ += n;
    last_k_ = 0;
  }
  int64_t n_proposed() const { return n_proposed_; }
  int64_t n_accepted() const { return n_accepted_; }

 protected:
  int32_t proposed(int32_t k) { return last_k_ = k; }

 private:
  int32_t last_k_ = 0;
  int64_t n_proposed_ = 0, n_accepted_ = 0;
};

// One decoding sequence of a step, for DraftBatch::propose.
struct DraftJob {
  DraftProposer* proposer = nullptr;  // null: a sequence that drafts elsewhere (or not): its token counts, no more
  std::span<const int32_t> tokens;    // as propose()'s
  int32_t max_k = 0;                  // the sequence's own limit (the request's draft_max, its context, its last token)
};

// Drafts for many sequences at once: a draft model runs the forward passes of all of them as one batch instead of
// one sequence after another (vLLM's and SGLang's way; llama-server drafts per slot).
//   propose(jobs, budget)   schedule(), once per step, before the per-sequence propose() calls: `jobs` are the
//                           step's decoding sequences in the order the step takes them; the jobs whose proposer's
//                           batch() is this one draft, together. Job i drafts at most
//                             min(max_k, budget - sum over jobs j < i of (1 + drafts of j) - 1),
//                           the step's token and output budget as the scheduler spends it in that order (an estimate:
//                           a sequence may find more room or less). Afterwards each proposer's propose(tokens, k, out)
//                           in the same step answers from what was drafted: exactly the ids it would have proposed
//                           alone, drafting the rest on its own only when asked for more than was drafted here.
//                           A failure (the draft's KV full) stays with its sequence, as in propose().
class DraftBatch {
 public:
  virtual ~DraftBatch() = default;
  virtual void propose(std::span<const DraftJob> jobs, int64_t budget) = 0;
};

// What one sequence runs with. Empty members are the identity (no processor, every token allowed, no drafts).
struct SequenceHooks {
  std::vector<std::unique_ptr<LogitsProcessor>> processors;
  std::unique_ptr<TokenMaskProvider> mask;
  std::unique_ptr<DraftProposer> drafts;
};

// Builds a sequence's hooks at admission (called on the engine thread, once per request).
using SequenceHooksFactory = std::function<SequenceHooks()>;

}  // namespace kiln

// Speculative decoding with a draft model ("draft-simple", llama.cpp's -md FILE): a smaller model with the same
// vocabulary proposes the next tokens greedily and the model verifies them in one step (runtime/hooks.h
// DraftProposer, the scheduler's verify path).
//
// DraftModel: the draft Model and its own Engine: a KV cache with one slot per sequence slot of the engine loop (the
// sequence's slot id is its draft slot), no prefix cache, the engine's block size and its KV types unless -ctkd /
// -ctvd say otherwise. Shared by the sequences' proposers and used on the engine thread only, in schedule().
//
// Vocabulary compatibility (check_draft_vocab; llama.cpp's rules, made strict): the same tokenizer model, sizes at
// most kMaxVocabDiff apart, the same BOS and EOS ids and add-BOS/EOS flags, the same end-of-generation ids, and
// the same text for every id from kVocabCheckFrom up to the smaller size. The error names what differs.
//
// DraftModelProposer, one per sequence: the draft's cache of the slot holds a prefix of the sequence and then the
// drafts it fed last (held()). Each propose() keeps the longest common prefix of that and the sequence (the
// confirmed drafts stay; the rejected ones are truncated away: the rollback), runs the rest (at least the newest
// token, whose row it needs), then drafts greedily: the argmax of the draft's row, fed back, until max_k tokens or a
// token whose probability is below p_min (the softmax over the draft's 10 most likely tokens, as llama.cpp's draft
// sampler with top-k 10), which is not proposed. The draft-count floor (n_min) is the scheduler's: fewer drafts
// than that and the step decodes one token. A draft failure (a step error, the draft's KV full) proposes nothing
// more for that sequence: drafts only ever save steps, they never fail a request.
//
// Batched drafting (DraftModel is the proposers' DraftBatch, runtime/hooks.h): once per step the scheduler hands
// over every decoding sequence; the catch-up tokens of all of them run in shared steps (within the engine's
// batch_tokens and max_outputs: a sequence's tokens may span steps), then each round feeds every still-drafting
// sequence's newest draft as one step (several when the round exceeds the caps), until each has reached its share
// of the budget or stopped at p_min. The drafts are the per-sequence ones: each row is the argmax (and p) of the
// same positions of the same tokens, and on the CPU backend a row does not depend on what else is in the step
// (tests: test_runtime_speculative). Blocks are reserved per sequence before each step, so a sequence whose tokens
// do not fit the draft's KV fails alone (catch-up: it proposes nothing more; a round: its drafts so far stand).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/defaults.h"
#include "runtime/engine_config.h"
#include "runtime/engine.h"
#include "runtime/hooks.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace kiln {

inline constexpr int32_t kMaxVocabDiff = 128;   // llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
inline constexpr int32_t kVocabCheckFrom = 5;   // llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
inline constexpr int32_t kDraftTopK = 10;       // p_min is over the draft's top-k (llama.cpp's draft sampler)

// OK when `draft` may propose tokens for `target`; else an error starting with "-md:" naming the difference.
Status check_draft_vocab(const Tokenizer& target, const Tokenizer& draft);

class DraftModelProposer;

class DraftModel final : public DraftBatch, public std::enable_shared_from_this<DraftModel> {
 public:
  // Checks the vocabularies and that the draft can roll back (no recurrent layers, causal), then creates its engine.
  static Result<std::shared_ptr<DraftModel>> create(const Model& target, std::unique_ptr<Model> draft,
                                                    const DraftCacheConfig& cfg);
  Model& model() { return *model_; }
  Engine& engine() { return *engine_; }
  // The proposer of the sequence in slot `slot` (its draft slot is emptied first); p_min as above.
  std::unique_ptr<DraftProposer> proposer(int32_t slot, float p_min);

  struct Next {
    int32_t id = -1;  // the argmax of the row after the last token run
    float p = 1;      // its probability among the top kDraftTopK (1 when not asked for)
  };
  // Runs ids at positions pos0.. of slot's sequence (in steps within the engine's caps); the last one's next token.
  Result<Next> run(int32_t slot, std::span<const int32_t> ids, int64_t pos0, bool want_p);

  // DraftBatch: the jobs' drafts together (see above); each proposer's next propose() in this step serves them.
  void propose(std::span<const DraftJob> jobs, int64_t budget) override;
  uint64_t generation() const { return gen_; }  // counts propose(jobs) calls: what a proposer's drafts belong to

 private:
  DraftModel() = default;
  // A sequence in a batched step: ids at positions pos0.. of its slot; the row after the last one comes to next.
  struct Lane {
    DraftModelProposer* p = nullptr;
    std::span<const int32_t> ids;
    int64_t pos0 = 0;
    bool want_p = false;
    bool ok = true;    // false: its blocks could not be reserved, or a step with its tokens failed
    bool live = true;  // propose(jobs): still drafting
    Next next;
  };
  // Runs every lane's ids in steps within the engine's caps (one lane's tokens stay consecutive).
  void run_lanes(std::span<Lane> lanes);
  void flush(std::span<Lane> lanes);  // run_lanes' step of toks_

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<BatchToken> toks_;  // the batch of run() and run_lanes()
  std::vector<OutputKind> kinds_;
  std::vector<size_t> out_lane_;  // run_lanes(): the lane of each output row
  std::vector<Lane> lanes_, round_;
  std::vector<size_t> lane_of_job_;
  uint64_t gen_ = 0;
};

class DraftModelProposer final : public CountingProposer {
 public:
  DraftModelProposer(std::shared_ptr<DraftModel> m, int32_t slot, float p_min);
  ~DraftModelProposer() override;  // frees the slot's draft KV
  // Serves the drafts of this step's batch when there are some for these tokens (drafting on alone past them when
  // max_k asks for more), else drafts alone; the same ids either way.
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override;
  DraftBatch* batch() override { return m_.get(); }

  const std::vector<int32_t>& held() const { return held_; }  // what the draft's cache holds for the slot
  bool off() const { return off_; }

 private:
  friend class DraftModel;
  void reset();  // empties the slot
  // Keeps the common prefix of held() and tokens (at least the newest token runs again); how many tokens stay.
  size_t rollback(std::span<const int32_t> tokens);
  void fail();   // the catch-up failed: no more drafts for this sequence
  // The drafting state after a catch-up: drafts so far, of which n_fed are in the draft's cache; next: the row
  // after held() (valid when n_fed == drafts.size()); stopped: at p_min or by a failed step (no further drafts).
  struct Drafting {
    uint64_t gen = 0;      // DraftModel::generation() of the batch that made it (0: made by propose() alone)
    size_t n_tokens = 0;   // the sequence's length it was made for
    std::vector<int32_t> drafts;
    size_t n_fed = 0;
    DraftModel::Next next;
    bool stopped = false;
    bool valid = false;
    void clear() {  // keeps the drafts' storage
      std::vector<int32_t> keep = std::move(drafts);
      keep.clear();
      *this = Drafting{};
      drafts = std::move(keep);
    }
  };
  // Drafts on alone (DraftModel::run per token) until k drafts, p_min or a failure.
  void extend(size_t k);
  std::shared_ptr<DraftModel> m_;
  int32_t slot_;
  float p_min_;
  std::vector<int32_t> held_;
  Drafting d_;
  bool off_ = false;
};

}  // namespace kiln

// Speculative decoding with a draft model ("draft-simple", llama.cpp's -md FILE): a smaller model with the same
// vocabulary proposes the next tokens greedily and the model verifies them in one step (runtime/hooks.h
// DraftProposer, the scheduler's verify path).
//
// DraftModel: the draft Model and its own Engine: a KV cache with one slot per sequence slot of the engine loop (the
// sequence's slot id is its draft slot), no prefix cache, the engine's KV types and block size. Shared by the
// sequences' proposers and used on the engine thread only: propose() runs in schedule(), one sequence at a time.
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
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "runtime/defaults.h"
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

struct DraftModelConfig {
  int64_t n_ctx = 4096;       // KV token slots of the draft's cache in total (all sequences and their drafts)
  int32_t max_seqs = 1;       // sequence slots (the engine loop's)
  int32_t batch_tokens = defaults::kBatch;
  int32_t block_size = defaults::kBlockSize;
  DType kv_type_k = DType::F16, kv_type_v = DType::F16;
};

class DraftModel : public std::enable_shared_from_this<DraftModel> {
 public:
  // Checks the vocabularies and that the draft can roll back (no recurrent layers, causal), then creates its engine.
  static Result<std::shared_ptr<DraftModel>> create(const Model& target, std::unique_ptr<Model> draft,
                                                    const DraftModelConfig& cfg);
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

 private:
  DraftModel() = default;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<BatchToken> toks_;  // run()'s batch
};

class DraftModelProposer final : public DraftProposer {
 public:
  DraftModelProposer(std::shared_ptr<DraftModel> m, int32_t slot, float p_min);
  ~DraftModelProposer() override;  // frees the slot's draft KV
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override;
  // May run on a sampling thread (Scheduler::update): touches only this proposer's counters.
  void accepted(int32_t n) override;

  const std::vector<int32_t>& held() const { return held_; }  // what the draft's cache holds for the slot
  int64_t n_proposed() const { return n_proposed_; }
  int64_t n_accepted() const { return n_accepted_; }
  bool off() const { return off_; }

 private:
  void reset();  // empties the slot
  std::shared_ptr<DraftModel> m_;
  int32_t slot_;
  float p_min_;
  std::vector<int32_t> held_;
  int32_t last_k_ = 0;
  int64_t n_proposed_ = 0, n_accepted_ = 0;
  bool off_ = false;
};

}  // namespace kiln

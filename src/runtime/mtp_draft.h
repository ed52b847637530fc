// Speculative decoding with the model's own multi-token-prediction layer ("draft-mtp", llama.cpp's name): the
// NextN view of the model (model/mtp.h) proposes the next tokens greedily from the model's hidden states, and the
// model verifies them in one step as for the other draft types (runtime/hooks.h DraftProposer).
//
// Pairing: MTP row q (of trunk position q) takes token t_(q+1) with the trunk's final-norm hidden row h_q of
// position q, and its argmax predicts t_(q+2). Its K/V go to position q - base of the MTP's own cache (RoPE is
// relative: one constant offset changes nothing; base is the first position whose hidden row the proposer saw, 0
// unless a prefix came from the prefix cache without its rows). The rows come from the engine loop: every step is a
// hidden step while a proposer wants them (DraftProposer::wants_hidden), and after each step hidden_rows() hands
// over those of the sequence; the proposer runs the MTP over every position whose token and row are both known
// (the catch-up), so after a decode step the last row predicts the token after the pending one: the first draft.
// Further drafts (draft_max > 1) feed the MTP's own final-norm output row back as the hidden row of the next
// position (the trunk's is not known yet); those speculative positions are truncated away before the next
// catch-up. Rows of positions the MTP has already run (a hybrid model's rollback replays the confirmed tokens, a
// preempted sequence is recomputed) are skipped: the tokens are the same, and so are the rows.
//
// MtpDraft: the view's Engine, a KV cache with one slot per sequence slot of the engine loop (the sequence's slot id
// is its MTP slot), no prefix cache, the engine's block size and KV types; hidden steps on (the fed-back rows).
// Shared by the sequences' proposers, used on the engine thread only. A failed MTP step (its KV full) proposes
// nothing more for that sequence: drafts only ever save steps, they never fail a request.
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
#include "util/status.h"

namespace kiln {

class MtpDraft final : public std::enable_shared_from_this<MtpDraft> {
 public:
  // OK when `target` can draft for itself: it has a NextN view (Model::nextn_model). Else an error starting with
  // "--spec-type draft-mtp:" that says why (no NextN layers in the file, or a tensor-parallel model).
  static Status check(Model& target);
  // The model's NextN view and its engine (check() first).
  static Result<std::shared_ptr<MtpDraft>> create(Model& target, const DraftCacheConfig& cfg);
  Model& model() { return *model_; }
  Engine& engine() { return *engine_; }
  // The proposer of the sequence in slot `slot` (its MTP slot is emptied first).
  std::unique_ptr<DraftProposer> proposer(int32_t slot);

  // Runs ids at MTP positions pos0.. of slot with their hidden rows h_in ([ids.size()][n_embd]), in steps within
  // the engine's caps; returns the argmax after the last one, and its final-norm row into *h_out (n_embd floats).
  Result<int32_t> run(int32_t slot, std::span<const int32_t> ids, int64_t pos0, std::span<const float> h_in,
                      std::vector<float>* h_out);

 private:
  MtpDraft() = default;
  Model* model_ = nullptr;  // owned by the target model
  std::unique_ptr<Engine> engine_;
  std::vector<BatchToken> toks_;
};

class MtpProposer final : public CountingProposer {
 public:
  MtpProposer(std::shared_ptr<MtpDraft> m, int32_t slot);
  ~MtpProposer() override;  // frees the slot's MTP KV
  int32_t propose(std::span<const int32_t> tokens, int32_t max_k, std::span<int32_t> out) override;
  bool wants_hidden() const override { return true; }
  void hidden_rows(std::span<const int32_t> tokens, int64_t pos0, const float* rows, int64_t n,
                   int64_t n_embd) override;

  int64_t held() const { return held_; }  // MTP rows run from the trunk's own hidden rows
  bool off() const { return off_; }

 private:
  void reset(int64_t base);  // empties the slot; the next row seen is of trunk position base
  void drop_speculative();  // truncates the slot's MTP KV to held_ (the last drafts' speculative positions)
  std::shared_ptr<MtpDraft> m_;
  int32_t slot_;
  int64_t base_ = -1;  // the trunk position of MTP position 0 (-1: no row seen yet)
  int64_t held_ = 0;   // MTP positions [0, held_) ran from the trunk's rows; past them: speculative ones
  // The trunk's rows not run yet: positions [base_ + held_, base_ + held_ + rows_.size() / n_embd).
  std::vector<float> rows_;
  // The first draft after the last catch-up: valid for a sequence of n_tokens tokens, with its row h.
  struct Next {
    size_t n_tokens = 0;
    int32_t id = -1;
    std::vector<float> h;
  } next_;
  std::vector<float> h_;
  bool off_ = false;
};

}  // namespace kiln

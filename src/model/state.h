// The ModelState implementation (model/step.h): KV storage, per-backend workspace, pinned staging, execute, fetch.
// Internal to the model layer; Model::create_state is the public way in.
#pragma once

#include <memory>

#include "backend/placement.h"
#include "model/arch.h"
#include "model/step.h"

namespace kiln {

Result<std::unique_ptr<ModelState>> make_model_state(const HParams& hp, const ArchDef& arch, const Weights& w,
                                                     const Placement& place, const StepCaps& caps);
// Tensor parallel: one State per rank (its HParams and weight shards on its backend, its communicator) behind
// one ModelState; logits are gathered to [n_vocab_full] rows on rank 0 (model/tensor_parallel.h).
struct TpRankView {
  const HParams* hp = nullptr;
  const Weights* w = nullptr;
  Placement place;  // every layer, the input and the output on the rank's backend
  Communicator* comm = nullptr;
};
Result<std::unique_ptr<ModelState>> make_tp_model_state(const ArchDef& arch, const std::vector<TpRankView>& ranks,
                                                        int64_t n_vocab_full, const StepCaps& caps);
// Bytes of K+V storage for these caps over all layers (the attention layers: linear layers keep none).
uint64_t kv_storage_bytes(const HParams& hp, const StepCaps& caps);
// Layers with a K/V cache (all but the recurrent ones of a hybrid model).
int64_t n_kv_layers(const HParams& hp);
// Bytes of recurrent state (hybrid models: conv history + delta-rule matrices per linear layer per sequence slot).
uint64_t recurrent_state_bytes(const HParams& hp, const StepCaps& caps);
// Bytes of the recurrent-state checkpoints (StepCaps::n_checkpoints rows like the state's).
uint64_t checkpoint_state_bytes(const HParams& hp, const StepCaps& caps);
// Bytes of one sequence's recurrent state over all linear layers (0 for models without them).
uint64_t recurrent_row_bytes(const HParams& hp);

}  // namespace kiln

// Multi-token prediction (MTP): the NextN blocks some files carry after the trunk (qwen35: nextn_predict_layers,
// Weights::nextn; model/arch/qwen35.cpp says what llama.cpp's converter writes), run as a model of their own for
// speculative decoding (runtime/mtp_draft.h, --spec-type draft-mtp).
//
// The NextN view (make_nextn_model) is a one-layer Model over the trunk's weights: NextN block 0 is its only layer,
// a full-attention layer of the trunk's architecture (its own K/V cache through the usual ModelState), with
//   input row of token t paired with hidden row h:  x = eh_proj concat(enorm(embed(t)), hnorm(h))
//   head:                                           shared_head_norm (the view's output_norm), then the output
//                                                   projection (shared_head_head, else the trunk's output)
// embed: nextn.embed_tokens, else the trunk's token_embd. The hidden rows come with each step
// (StepPlan::hidden_in, Engine::step's hidden_in): [n_tok][n_embd] f32, the trunk's final-norm hidden state of
// the position before the token's (runtime/mtp_draft.h pairs them). A hidden step of the view returns its own
// final-norm rows (after shared_head_norm), which the draft feeds back as h for the next draft.
#pragma once

#include <memory>

#include "backend/placement.h"
#include "model/arch.h"
#include "model/model.h"

namespace kiln {

// The view of NextN block 0 of a loaded model (trunk_hp.n_nextn > 0). It borrows everything from the trunk:
// tokenizer, file, weights, backends; the trunk must outlive it.
Result<std::unique_ptr<Model>> make_nextn_model(const Model& trunk, const HParams& trunk_hp, const ArchDef& arch,
                                                const Weights& trunk_w, const Placement& trunk_place);

// The view's input rows, on one backend: x [n_embd, n] holds the token embeddings and becomes the block's input;
// h_in [n_embd, n] the paired hidden rows; cat [2 n_embd, n] scratch (its two halves are strided destinations of
// the norms: row r = [enorm(x_r) | hnorm(h_r)], the layout eh_proj's input columns expect).
Status nextn_input(Backend& be, const NextnWeights& nw, float eps, const Tensor& x, const Tensor& h_in,
                   const Tensor& cat);

}  // namespace kiln

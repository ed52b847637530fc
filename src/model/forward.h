// The forward pass, written once against Backend (docs/ARCHITECTURE.md). ModelState::execute (model/state.cpp)
// fills a ForwardCtx per layer with that layer's backend and workspace (token ids, positions, cache slots, block
// tables already uploaded there), embeds, runs the architecture's block per layer (model/arch/*.cpp, built from
// the pieces below), and projects the rows that want output.
//
// Activations, n = tokens in the batch (ggml order [row width, rows]):
//   x    [n_embd, n]            residual stream (in place across layers)
//   h    [n_embd, n]            normed input of a sublayer, then its output before the residual add
//   q    [hd_k, n_head, n]      k [hd_k, n_head_kv, n]   v [hd_v, n_head_kv, n]
//   attn [hd_v, n_head, n]      g, u [n_ff, n]
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/arch.h"

namespace kiln {

struct ForwardCtx {
  Backend* be = nullptr;  // the current layer's backend; every tensor below lives on it
  const HParams* hp = nullptr;
  const Weights* w = nullptr;
  const KvLayer* kv = nullptr;  // [n_layer] K/V storage of each layer
  int64_t n = 0;  // tokens in the batch (the bucket: padded rows included)

  Tensor x, h, q, k, v, attn, g, u;
  Tensor pos, slots;  // I32 [n]
  // Rows that want logits: I32 [n_out], increasing. In the last layer only these rows go on past attention
  // (keep_output_rows), into x_keep/attn_keep; then n = n_out.
  Tensor out_ids, x_keep, attn_keep;
  int64_t n_out = 0;
  AttnBatch meta;
  RopeParams rope;
  float attn_scale = 1.0f;
};

namespace pieces {

// h = rms_norm(x) * attn_norm; q/k/v projections (+ biases when the layer has them); per-head q/k RMS norm when
// the layer has q_norm/k_norm; RoPE on q and k; K/V into the cache; paged causal attention; output projection;
// x += result.
Status self_attention(ForwardCtx& c, int64_t il);

// h = rms_norm(x) * ffn_norm; x += down(silu(gate(h)) * up(h)).
Status swiglu_ffn(ForwardCtx& c, int64_t il);

// Last layer, after attention: keeps only the rows of x and attn that want logits (the K/V of every token are
// already in the cache, nothing after this point feeds another token) and shrinks the batch to them.
Status keep_output_rows(ForwardCtx& c);

}  // namespace pieces
}  // namespace kiln

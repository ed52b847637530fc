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
//   s    [ws_extra, batch_tokens] scratch region of architectures that need more (HParams::ws_extra; carve())
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/comm.h"
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
  RopeParams rope;    // freq_base is the layer's (HParams::rope_base)
  float attn_scale = 1.0f;
  Tensor s;           // the whole scratch region (not shrunk to n): carve() views out of it
  // The current layer's recurrent state (linear-attention layers of hybrid models; invalid otherwise): one row per
  // sequence slot, addressed through meta.seq_row, zeroed where meta.seq_reset.
  Tensor conv_state;  // F32 [(d_conv - 1) * conv_dim, max_seqs]
  Tensor ssm_state;   // F32 [head_v_dim * d_state * n_v_heads, max_seqs]
  // Tensor parallel (model/tensor_parallel.h): this rank's communicator, nullptr on one rank. hp and w are then the
  // rank's shard (n_head, n_head_kv, n_ff its own; wo and w_down its input columns), so the output projections give
  // partial sums that the pieces all-reduce before the residual add.
  Communicator* comm = nullptr;
  // The current layer's expert tensors when they live on another backend than `be` (Placement::experts: --cpu-moe
  // keeps them in host memory while the layer runs on a GPU); pieces::moe_ffn runs the op there. be nullptr: the
  // experts are on c.be like everything else.
  struct ExpertsApart {
    Backend* be = nullptr;
    Tensor x, out, zero;     // F32 [n_embd, batch_tokens] on be: the normed input's copy, the experts' sum, zeros
    void* bounce = nullptr;  // host staging for copy_between when neither side is host memory
    size_t bounce_bytes = 0;
  } experts;
};

// Consecutive [w, n] f32 tensors out of the scratch region c.s: each takes round_up(w, 16) * capacity floats, so
// HParams::ws_extra = the sum of round_up(w, 16) of what a block carves.
struct Carver {
  explicit Carver(const Tensor& s) : s_(s) {}
  Tensor take(int64_t w, int64_t n) {
    Tensor t = Tensor::make(DType::F32, static_cast<float*>(s_.data) + off_, s_.backend, w, n);
    off_ += (w + 15) / 16 * 16 * s_.ne[1];
    return t;
  }
  static int64_t width(int64_t w) { return (w + 15) / 16 * 16; }

 private:
  Tensor s_;
  int64_t off_ = 0;
};

// A view of `base` at element offset `off` with shape [ne0, ne1, ne2] and row / plane strides in elements.
Tensor strided_view(const Tensor& base, int64_t off, int64_t ne0, int64_t ne1, int64_t ne2, int64_t s1, int64_t s2);

namespace pieces {

// h = rms_norm(x) * attn_norm; q/k/v projections (+ biases when the layer has them); per-head q/k RMS norm when
// the layer has q_norm/k_norm; RoPE on q and k; K/V into the cache; paged causal attention (with the layer's
// attn_sinks when it has them); output projection (+ bo when the layer has it); x += result.
Status self_attention(ForwardCtx& c, int64_t il);

// The core of self_attention on projections already made (c.q/c.k/c.v hold them; q3 = the query heads
// [hd_k, n_head, n], possibly a strided view): per-head q/k norm when the layer has them, RoPE, K/V into the
// cache, attention (sliding window from the layer's KvLayer, sinks from its attn_sinks) into c.attn. No output
// projection, no row selection.
Status attend(ForwardCtx& c, int64_t il, const Tensor& q3);

// h = rms_norm(x) * ffn_norm; x += post_ffn_norm(down(gelu(gate(h)) * up(h))) when the layer has post_ffn_norm
// (gemma3), else x += down(...).
Status geglu_ffn(ForwardCtx& c, int64_t il);

// h = rms_norm(x) * ffn_norm; x += down(silu(gate(h)) * up(h)).
Status swiglu_ffn(ForwardCtx& c, int64_t il);

// h = rms_norm(x) * ffn_norm; x += the routed experts' gated FFN of h (Backend::moe_ffn: the layer's router
// ffn_gate_inp and expert stacks, with their biases when the layer has them, hp.n_expert_used experts per token,
// `gating`, renormalised top-k weights when norm_topk, activation `act`). With the experts apart (c.experts.be):
// h is copied to their backend, the op adds the experts' sum into zeros there, the sum is copied back into h and
// added to x on the layer's backend (two transfers of [n_embd, n] f32; the router runs with the experts).
Status moe_ffn(ForwardCtx& c, int64_t il, MoeGating gating, bool norm_topk,
               MoeActivation act = MoeActivation::kSwiglu);

// x += o, with o = W a computed as the sum over tensor-parallel ranks of each rank's input-column slice of W times
// its slice of a (one all-reduce of h in f32: the residual stream is f32, and a bf16 sum would round it once per
// sublayer; the partial sums are [n_embd, n] per rank, small next to the weights each rank reads). One rank:
// matmul_add (the backend's fused op). bias (optional, f32 [n_out]) is added once to the sum. Uses c.h as the
// output buffer.
Status project_add(ForwardCtx& c, const Tensor& W, const Tensor& a, const Tensor& bias = Tensor{});

// Last layer, after attention: keeps only the rows of x and attn that want logits (the K/V of every token are
// already in the cache, nothing after this point feeds another token) and shrinks the batch to them.
Status keep_output_rows(ForwardCtx& c);

}  // namespace pieces
}  // namespace kiln

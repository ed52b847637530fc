// The backend op interface (docs/ARCHITECTURE.md, "Backends"). The forward pass (model/) is written once against
// this class and runs unchanged on every backend. Rules every implementation follows:
//   - Tensors (backend/tensor.h) are views into this backend's memory; all memory the model uses at run time
//     (activations, scratch, KV cache, index arrays) comes from alloc(), host bytes go in and out through
//     write()/read(). Pinned host staging for uploads comes from alloc_host().
//   - Weights enter through import_weight(): the CPU backend returns a zero-copy view of the host bytes (the GGUF
//     mapping), a device backend uploads them once. Weights keep their GGUF block layout everywhere.
//   - Ops check dtypes and shapes only and return an error (kUnsupported / kInvalidArgument naming the operand) for a
//     combination they do not handle; they never crash on one. *Values* in index tensors (ids, positions, slots,
//     block tables, kv lengths) are not checked by ops: the step planner (runtime/) validates them on the host, where
//     it is cheap and can name the request. (Debug builds of the CPU backend still assert them.)
//   - supports(op, types) answers without running anything, with the same selector the op itself uses.
//   - Ops are stream-ordered: a device backend may return before the work is done; read() and synchronize()
//     wait. Index tensors live in backend memory, so a device backend can capture a whole step in a graph and
//     replay it with new indices: no op derives a launch shape from tensor *values* (only from shapes and the
//     host-known bounds in AttnBatch).
//   - write(): a host buffer from alloc_host() (pinned) may be read by the device after write() returns, so it may
//     be reused only after synchronize() (or a read() on the same backend); any other host memory may be reused as
//     soon as write() returns.
//   - Padding: a slot of -1 in kv_store writes nothing; a token with kv_len 0 in attention gets a zero output row.
//     Padded tokens therefore cost compute but change no state and are never fetched.
//   - Unless stated, an op's dst may alias its first input (in-place), never partially overlap.
// Shapes below use ggml order, innermost first: "[d, n]" = n rows of d elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/tensor.h"
#include "util/status.h"

namespace kiln {

enum class RopeMode { kNormal, kNeox };

struct RopeParams {
  RopeMode mode = RopeMode::kNormal;  // normal: pairs (2i, 2i+1); neox: pairs (i, i + n_rot/2)
  int32_t n_rot = 0;                  // rotated leading dims of each head (even, <= head_dim); the rest pass through
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;            // theta = freq_scale * pos * freq_base^(-2i/n_rot) / freq_factor[i]
  Tensor freq_factors;                // optional: f32 [n_rot/2] (llama3 rope_freqs.weight); invalid = all 1
  // YaRN (ggml's rope_yarn; supports(Op::kRopeYarn) says whether a backend honours it): with ext_factor != 0, the
  // pair i's angle mixes the interpolated theta (freq_scale applied) and the extrapolated one (without it):
  // theta = theta_interp (1 - r) + theta_extrap r, r = ext_factor (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)),
  // lo = max(0, floor(c(beta_fast))), hi = min(n_rot - 1, ceil(c(beta_slow))),
  // c(b) = n_rot ln(n_ctx_orig / (2 pi b)) / (2 ln freq_base); then cos and sin are multiplied by
  // attn_factor (1 + 0.1 ln(1 / freq_scale)). ext_factor 0: cos and sin times attn_factor only (1: plain RoPE).
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int32_t n_ctx_orig = 0;
  bool yarn() const { return ext_factor != 0.0f || attn_factor != 1.0f; }
};
// The per-call YaRN terms, in ggml's f32 steps (every backend's rope takes them from here, so the ramp agrees bit for
// bit): the correction range [lo, hi] of pair indices (0, 0 when ext_factor is 0) and mscale, the factor of cos and
// sin (attn_factor, times 1 + 0.1 ln(1 / freq_scale) when ext_factor != 0; 1 for plain RoPE).
struct YarnTerms {
  float lo = 0.0f, hi = 0.0f, mscale = 1.0f;
};
YarnTerms yarn_terms(const RopeParams& p);

// The KV cache storage types of the op contract: llama.cpp's -ctk/-ctv set, in its order. A backend stores the
// ones supports(Op::kKvStore, k type, v type) accepts (the CPU all of them, K and V independently).
inline constexpr DType kKvCacheTypes[] = {DType::F32,  DType::F16,    DType::BF16, DType::Q8_0, DType::Q4_0,
                                          DType::Q4_1, DType::IQ4_NL, DType::Q5_0, DType::Q5_1};
inline bool is_kv_cache_type(DType t) {
  for (DType c : kKvCacheTypes)
    if (c == t) return true;
  return false;
}

// One layer of the paged KV cache as the attention ops see it.
//   k: [n_head_kv * head_dim_k, n_slots] of a cache type (one row per token slot, heads contiguous); a head's row is
//      a whole number of the type's blocks (head_dim_k % 32 == 0 for the 32-element types)
//   v: [n_head_kv * head_dim_v, n_slots] of a cache type, which may differ from k's
// Slot s of block b is row b * block_size + s.
struct KvLayer {
  Tensor k, v;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0, head_dim_v = 0;
  int32_t block_size = 0;
  // Sliding window (local attention layers, gemma3): a token at position p sees positions (p - window, p] of its
  // sequence only, i.e. [kv_len - window, kv_len); positions outside it are skipped, not masked. 0: the whole
  // causal prefix. A backend honours it when supports(Op::kAttentionWindow, k type, v type) says so.
  int32_t window = 0;
  // Attention sinks (gpt-oss): optional F32 [n_head], one logit per query head that joins each softmax's
  // denominator and adds no value: out = sum_j exp(s_j - m) v_j / (exp(sink - m) + sum_j exp(s_j - m)), m the max
  // of the scores and the sink (the sink is not scaled). A backend honours it when supports(Op::kAttentionSinks,
  // k type, v type) says so.
  Tensor sinks;
};

// Per-step attention metadata (all I32 tensors in backend memory, written by the step plan upload).
//   block_tables: [max_blocks, n_tables]  row r = physical block ids of sequence slot r, logical order (rows stay
//                                         in backend memory across steps; only changed rows are rewritten)
//   tok_table:    [n_tok]                 which row of block_tables token t reads
//   kv_len:       [n_tok]                 token t attends to its sequence's positions [0, kv_len[t])
//                                         (causal prefill/decode: pos + 1; the batch's own K/V are stored first;
//                                         0 for a padded token: zero output)
//   Per sequence of the step (n_seq entries; tokens of one sequence are consecutive in the batch):
//   seq_row:      [n_seq]   its block-table row
//   seq_q_start:  [n_seq]   first token of the sequence in the batch
//   seq_q_len:    [n_seq]   its token count in this step (query tile of a tiled prefill)
//   seq_kv_len:   [n_seq]   positions it holds after this step (= kv_len of its last token; split-KV decode)
//   seq_reset:    [n_seq]   1: the sequence starts in this step (position 0): recurrent ops start from a zero
//                           state instead of reading its row (hybrid models; attention ignores it)
struct AttnBatch {
  Tensor block_tables, tok_table, kv_len;
  Tensor seq_row, seq_q_start, seq_q_len, seq_kv_len, seq_reset;
  int32_t n_seq = 0;       // sequences in the step (a bucket: padded entries have q_len 0, kv_len 0)
  int32_t max_kv_len = 0;  // upper bound of kv_len: a bucket (the plan rounds it up), sizes split-KV grids
  int32_t max_q_len = 0;   // upper bound of seq_q_len
};

// What supports() is asked about. `a` is the main operand's type (the weight for kMatmul/kGetRows, the K cache for
// kKvStore/kAttention/kAttentionWindow, the source for kCopy), `b` the second where one exists (the V cache for the
// cache ops: ask with both; the destination for kCopy).
// The ops after kCopy (Qwen3.5 / Gemma 3, mixture-of-experts models) have defaults that return kUnsupported;
// kAttentionWindow asks whether attention honours KvLayer::window for K/V cache types a/b; kMoeFfn whether moe_ffn reads
// expert weights of type `a`. The encoder ops (bert): kLayerNorm, kGelu, and kAttentionNonCausal, whether attention
// lets a token read positions past its own (kv_len beyond pos + 1: the bidirectional attention of an encoder) with
// cache type `a`. kRopeYarn: whether rope honours RopeParams' YaRN fields; kAttentionSinks: whether attention
// honours KvLayer::sinks for K/V cache types a/b. kArgmaxMasked: whether argmax_masked runs (logits of type `a`).
enum class Op { kGetRows, kRmsNorm, kMatmul, kRope, kKvStore, kAttention, kSwiglu, kAdd, kMul, kScale, kSoftmax,
                kArgmax, kCopy, kGeglu, kSigmoidMul, kAttentionWindow, kConv1dSilu, kDeltaNet, kMoeFfn, kLayerNorm,
                kGelu, kAttentionNonCausal, kRopeYarn, kAttentionSinks, kArgmaxMasked };

// How moe_ffn turns router logits into expert weights (llama.cpp's gating functions; only those kiln's
// architectures use).
enum class MoeGating {
  kSoftmax,        // p = softmax over all experts of the router logits; the top k of p are chosen and weighted by p
  kSoftmaxWeight,  // the top k router logits are chosen; their weights are the softmax over those k logits (gpt-oss)
};
// The expert's gated activation h = act(g, u), g = gate x (+ gate bias), u = up x (+ up bias).
enum class MoeActivation {
  kSwiglu,     // silu(g) * u
  kSwigluOai,  // gpt-oss: x = min(g, limit), y = clamp(u, -limit, limit), h = x / (1 + exp(-alpha x)) * (y + 1)
};
const char* op_name(Op op);

class Backend {
 public:
  virtual ~Backend() = default;
  // Device id as --device spells it: "cpu", "cuda:0".
  virtual const char* name() const = 0;
  // Whether tensor data is host memory the caller may dereference (the CPU backend): lets a placement boundary
  // copy with one read()/write() instead of a bounce through staging.
  virtual bool host_memory() const { return false; }
  // Whether this backend runs op `op` with these types (see Op). The ops return kUnsupported exactly when this
  // says false for their operands' types.
  virtual bool supports(Op op, DType a, DType b = DType::F32) const = 0;

  // ---- memory ----
  // Bytes this backend can still allocate (device: free memory; CPU: the host's available memory, within the
  // process's address-space limit), for checks before large allocations. 0: unknown.
  virtual uint64_t memory_available() const { return 0; }
  // Uninitialized memory of `bytes` (64-byte aligned at least). Errors: kOutOfRange when the device is full.
  virtual Result<std::unique_ptr<Buffer>> alloc(size_t bytes) = 0;
  // Host memory the device reads fast (pinned on CUDA; plain memory on the CPU): upload staging. The buffer's
  // data() is a host pointer.
  virtual Result<std::unique_ptr<Buffer>> alloc_host(size_t bytes) { return alloc(bytes); }
  // Host bytes -> tensor memory at byte `offset` of dst.data, and back (see the reuse rule above).
  virtual Status write(const Tensor& dst, size_t offset, const void* src, size_t n) = 0;
  virtual Status read(const Tensor& src, size_t offset, void* dst, size_t n) = 0;
  // A weight of GGUF type `t`, shape ne, whose bytes are `host` (must outlive the model: the mapping).
  virtual Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) = 0;
  // Waits for all queued work.
  virtual Status synchronize() { return Status::ok(); }

  // ---- ops ----
  // dst[:, t] = row ids[t] of w, converted to f32.   w: [d, n_rows] any dequantizable type; ids: I32 [n];
  // dst: F32 [d, n]. Ids must be in [0, n_rows): the planner checks them (see the top of this file).
  virtual Status get_rows(const Tensor& w, const Tensor& ids, const Tensor& dst) = 0;

  // dst[:, r] = x[:, r] / sqrt(mean(x[:, r]^2) + eps) * w   (w optional: invalid tensor = no multiply).
  // x, dst: F32 [d, n]; w: F32 [d]. Also the qwen3 per-head q/k norm: view x as [head_dim, n_tok * n_head].
  virtual Status rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& dst) = 0;

  // dst[:, t] = W x[:, t] (+ bias).   w: [n_in, n_out] any matmul type (GGUF layout); x: F32 [n_in, n_tok];
  // bias: F32 [n_out] or invalid; dst: F32 [n_out, n_tok] (must not alias x).
  virtual Status matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& dst) = 0;

  // Several matmuls of one input: dst_i = W_i x (+ bias_i) for i < n, each as matmul (same results bit for bit).
  // The dst_i must not overlap each other or x. A backend may run them as one launch / parallel region and convert
  // x once (the CPU backend quantizes it once per activation type); the default runs matmul on each.
  struct MatmulOut {
    Tensor w, bias, dst;
  };
  virtual Status matmul_group(const Tensor& x, const MatmulOut* outs, int n) {
    for (int i = 0; i < n; ++i) KILN_TRY(matmul(outs[i].w, x, outs[i].bias, outs[i].dst));
    return Status::ok();
  }

  // Rotary embedding in place per head.   x: F32 [head_dim, n_head, n_tok] (rows of heads may be strided:
  // nb[2] >= n_head * nb[1]); pos: I32 [n_tok].
  virtual Status rope(const Tensor& x, const Tensor& pos, const RopeParams& p) = 0;

  // Writes k and v rows into the cache slots.   k: F32 [n_head_kv * head_dim_k, n_tok], v likewise;
  // slots: I32 [n_tok] (physical slot = block * block_size + offset). Converts each to its cache's dtype (the
  // quantized types through quant/reference.h's quantize_row, row by row: the bytes are the spec's).
  virtual Status kv_store(const Tensor& k, const Tensor& v, const KvLayer& cache, const Tensor& slots) = 0;

  // Causal paged attention, flash-style (online softmax, never materializing the score matrix).
  //   q:   F32 [head_dim_k, n_head, n_tok]; dst: F32 [head_dim_v, n_head, n_tok] (contiguous).
  //   Head h reads kv head h / (n_head / n_head_kv) (GQA). scores = scale * q.k over positions [0, kv_len[t]).
  virtual Status attention(const Tensor& q, const KvLayer& cache, const AttnBatch& meta, float scale,
                           const Tensor& dst) = 0;

  // dst = silu(gate) * up, elementwise.   all F32, same shape [d, n].
  virtual Status swiglu(const Tensor& gate, const Tensor& up, const Tensor& dst) = 0;
  // dst = a + b / a * b; b broadcasts over rows when b has one row. F32.
  virtual Status add(const Tensor& a, const Tensor& b, const Tensor& dst) = 0;
  virtual Status mul(const Tensor& a, const Tensor& b, const Tensor& dst) = 0;
  // dst = x * s. F32.
  virtual Status scale(const Tensor& x, float s, const Tensor& dst) = 0;
  // Row-wise softmax. F32 [d, n].
  virtual Status softmax(const Tensor& x, const Tensor& dst) = 0;
  // dst[r] = index of the first maximum of row r.   x: F32 [d, n]; dst: I32 [n].
  // NaN rule (every backend, every path): NaN compares below every number, so a NaN is never chosen while the row
  // holds a number; a row of only NaN gives 0. (+inf is a number here.)
  virtual Status argmax(const Tensor& x, const Tensor& dst) = 0;
  // argmax over the allowed entries of each row (grammar-constrained greedy decoding without fetching the row).
  //   x: F32 [d, n]; mask: I64 [ceil(d / 64), n], bit (i % 64) of word i / 64 of row r set = x[i, r] may be chosen
  //   (the layout of TokenMaskProvider::allowed's mask; bits past d are ignored); dst: I32 [n].
  // dst[r] = the first allowed index of the maximum of the allowed entries of row r, with argmax's NaN rule among
  // them (allowed entries of only NaN give the first allowed index); a row that allows no entry gives -1. With
  // every bit set it is argmax. Default: kUnsupported (supports(Op::kArgmaxMasked, F32) answers).
  virtual Status argmax_masked(const Tensor& x, const Tensor& mask, const Tensor& dst) {
    (void)x, (void)mask, (void)dst;
    return make_error(ErrorCode::kUnsupported, "argmax_masked: not implemented by backend %s", name());
  }
  // Elementwise convert between F32, F16 and BF16, or a byte copy of any type to itself (same shape; rows may be
  // strided on both sides). dst must not overlap src. Both tensors on this backend (across backends:
  // copy_between below).
  virtual Status copy(const Tensor& src, const Tensor& dst) = 0;

  // ---- ops of hybrid / sliding-window models (defaults: kUnsupported; supports() answers for them) ----
  // dst = gelu(gate) * up with the tanh GELU: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  // All F32 [d, n] (rows may be strided).
  virtual Status geglu(const Tensor& gate, const Tensor& up, const Tensor& dst) {
    (void)gate, (void)up, (void)dst;
    return make_error(ErrorCode::kUnsupported, "geglu: not implemented by backend %s", name());
  }
  // dst = x * sigmoid(gate) = x / (1 + exp(-gate)). All F32 [d, n] (rows may be strided: the gate of a qwen35
  // attention head is a view into the query projection).
  virtual Status sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& dst) {
    (void)x, (void)gate, (void)dst;
    return make_error(ErrorCode::kUnsupported, "sigmoid_mul: not implemented by backend %s", name());
  }
  // Causal depthwise conv1d with a per-sequence state, then SiLU (the Gated DeltaNet / Mamba input conv).
  //   x: F32 [C, n_tok] (tokens of a sequence consecutive, as the step plan lays them out); w: F32 [K, C] (the K
  //   taps of channel c contiguous, tap K-1 = the current token); state: F32 [(K-1) * C, n_slots], row r = the
  //   last K-1 inputs of sequence slot r, oldest first (element j * C + c); dst: F32 [C, n_tok], must not alias x.
  //   For each sequence s of meta (seq_row, seq_q_start, seq_q_len, seq_reset; n_seq entries), token i of it:
  //   dst[c, i] = silu(sum_j w[j, c] * in(i - (K-1) + j)[c]) where in(<0) comes from the state row (zeros when
  //   seq_reset), and the row is updated to the sequence's last K-1 inputs. Tokens of no sequence are not written.
  virtual Status conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& state, const AttnBatch& meta,
                             const Tensor& dst) {
    (void)x, (void)w, (void)state, (void)meta, (void)dst;
    return make_error(ErrorCode::kUnsupported, "conv1d_silu: not implemented by backend %s", name());
  }
  // The gated delta rule (Gated DeltaNet linear attention), per sequence of meta and per value head h:
  //   q, k normalized in the op: x / sqrt(sum x^2 + l2_eps); V head h reads q/k head h mod H_k (tiled);
  //   g = A[h] * softplus(alpha + dt_bias[h]) (softplus(x) = x > 20 ? x : log(1 + exp(x))); b = sigmoid(beta);
  //   S <- exp(g) S;  d = b (v - S^T k);  S <- S + k d^T;  o = scale * S^T q     (S: [S_k, S_v] per head)
  // The state row of sequence slot r holds H_v matrices stored transposed: element (h * S_v + j) * S_k + i =
  // S[i][j]; seq_reset starts it from zero. A backend may evaluate a prefill in chunks (the within-chunk
  // triangular solve, the state carried between chunks) and must agree with the token-by-token recurrence
  // within f32 rounding.
  struct DeltaNetArgs {
    Tensor q, k;          // F32 [S_k, H_k, n_tok] (heads contiguous, tokens strided: views into the conv output)
    Tensor v;             // F32 [S_v, H_v, n_tok], H_v a multiple of H_k
    Tensor alpha, beta;   // F32 [H_v, n_tok] (rows may be strided)
    Tensor A, dt_bias;    // F32 [H_v]
    Tensor state;         // F32 [S_v * S_k * H_v, n_slots]
    float scale = 1.0f;   // output scale (qwen35: 1 / sqrt(S_k))
    float l2_eps = 1e-6f;
  };
  //   dst: F32 [S_v, H_v, n_tok] contiguous (must not alias the inputs). Tokens of no sequence are not written.
  virtual Status gated_delta_net(const DeltaNetArgs& a, const AttnBatch& meta, const Tensor& dst) {
    (void)a, (void)meta, (void)dst;
    return make_error(ErrorCode::kUnsupported, "gated_delta_net: not implemented by backend %s", name());
  }

  // ---- encoder ops (bert; defaults: kUnsupported, supports() answers) ----
  // Layer norm of each row: dst[:, r] = (x[:, r] - mean) / sqrt(var + eps) * w + b, mean and variance over the row
  // (the variance of the centred values), w and b optional (invalid: 1 and 0). x, dst: F32 [d, n]; w, b: F32 [d].
  virtual Status layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& dst) {
    (void)x, (void)w, (void)b, (void)eps, (void)dst;
    return make_error(ErrorCode::kUnsupported, "layer_norm: not implemented by backend %s", name());
  }
  // dst = gelu(x), the tanh GELU of geglu. F32 [d, n].
  virtual Status gelu(const Tensor& x, const Tensor& dst) {
    (void)x, (void)dst;
    return make_error(ErrorCode::kUnsupported, "gelu: not implemented by backend %s", name());
  }

  // ---- mixture-of-experts FFN (default: kUnsupported; supports(Op::kMoeFfn, expert type) answers) ----
  // A routed SwiGLU FFN added to the residual stream, in llama.cpp's order of operations (build_moe_ffn):
  //   l = router x_t (+ router_bias)                  (as matmul: [n_expert] logits per token)
  //   p = softmax(l)                                  (MoeGating::kSoftmax; kSoftmaxWeight: p = l)
  //   e_0..e_{k-1} = the k experts of largest p, in decreasing order of p (ties: the lower index first)
  //   w_j = p[e_j] (kSoftmaxWeight: w = softmax(w_0..w_{k-1})); with norm_topk: s = max(sum_j w_j, 2^-14),
  //   w_j = w_j / s   (the sum exact, rounded once)
  //   y_j = down_{e_j} act(gate_{e_j} x_t + gb_{e_j}, up_{e_j} x_t + ub_{e_j}) + db_{e_j}
  //                                                   (each product as matmul; biases optional, f32, added after it)
  //   o = y_0 w_0; o = o + y_j w_j for j = 1..k-1     (f32: each product rounded, then summed in slot order)
  //   acc_t = acc_t + o
  struct MoeFfnArgs {
    Tensor x;         // F32 [n_embd, n_tok]: the normed input (must not alias acc)
    Tensor router;    // [n_embd, n_expert], a matmul weight type (ffn_gate_inp: F32 in llama.cpp's files)
    Tensor gate, up;  // [n_embd, n_ff, n_expert]: expert e's matrix is plane e (GGUF layout, rows of n_embd)
    Tensor down;      // [n_ff, n_embd, n_expert]
    int32_t k = 0;    // experts per token, in [1, n_expert]
    MoeGating gating = MoeGating::kSoftmax;
    bool norm_topk = false;
    // Optional F32 biases (gpt-oss): router [n_expert], gate and up [n_ff, n_expert], down [n_embd, n_expert].
    Tensor router_bias, gate_bias, up_bias, down_bias;
    MoeActivation act = MoeActivation::kSwiglu;
    float oai_alpha = 1.702f, oai_limit = 7.0f;  // kSwigluOai's constants (llama.cpp's)
  };
  //   acc: F32 [n_embd, n_tok]. The expert matrices may differ in type from each other (a _M mix); each must be
  //   one supports(Op::kMoeFfn, t) accepts.
  virtual Status moe_ffn(const MoeFfnArgs& a, const Tensor& acc) {
    (void)a, (void)acc;
    return make_error(ErrorCode::kUnsupported, "moe_ffn: not implemented by backend %s", name());
  }

  // ---- fused ops ----
  // Each has a default decomposition into the ops above; a backend overrides the ones that pay on it (one launch,
  // one pass over the activations). Results must match the decomposition within that backend's op tolerances.

  // acc += W x (+ bias).  acc: F32 [n_out, n_tok]; tmp: F32 [n_out, n_tok] scratch the default uses for W x
  // (must not alias acc or x). The residual adds after attention-out and FFN-down.
  virtual Status matmul_add(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& tmp,
                            const Tensor& acc) {
    KILN_TRY(matmul(w, x, bias, tmp));
    return add(acc, tmp, acc);
  }
  // g = silu(W_gate x) * (W_up x).  g, u: F32 [n_ff, n_tok]; u is scratch (the default's W_up x).
  virtual Status matmul_swiglu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, const Tensor& g,
                               const Tensor& u) {
    const MatmulOut outs[] = {{w_gate, Tensor{}, g}, {w_up, Tensor{}, u}};
    KILN_TRY(matmul_group(x, outs, 2));
    return swiglu(g, u, g);
  }
  // RoPE on q and k in place (as rope), then k and v into the cache (as kv_store).
  virtual Status rope_kv_store(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos,
                               const RopeParams& p, const KvLayer& cache, const Tensor& slots) {
    KILN_TRY(rope(q, pos, p));
    KILN_TRY(rope(k, pos, p));
    return kv_store(k.reshape(k.ne[0] * k.ne[1], k.ne[2]), v, cache, slots);
  }
  // rms_norm whose output feeds matmuls of weight type `next` (invalid: unknown). A backend whose matmul quantizes
  // its activations (q8_1 on CUDA) may quantize here once, in the same pass, and let the following matmuls of that
  // type on dst reuse it; dst still holds the f32 result. The default (and the CPU backend, whose matmul_group
  // already quantizes a shared input once) is rms_norm.
  virtual Status rms_norm_for_matmul(const Tensor& x, const Tensor& w, float eps, const Tensor& dst, DType next) {
    (void)next;
    return rms_norm(x, w, eps, dst);
  }

  // ---- step graphs (optional) ----
  // A backend that can record the ops of a step and replay them (CUDA graphs) overrides these; ModelState::execute
  // calls them around the ops of a step whose placement is this one backend, with `key` = the step's host-side
  // shape (token/output buckets, n_seq, max_kv_len, max_q_len): every op argument that is not in backend memory is
  // a function of it. graph_replay(key): enqueues the recorded step and returns true, or false when none is
  // recorded (the caller then runs the ops between graph_begin and graph_end). graph_begin may start a recording
  // (or not: e.g. only once a key has run eagerly); graph_end finishes it and runs what was recorded. graph_end is
  // called even when an op failed in between. Defaults: no graphs.
  virtual bool graph_replay(uint64_t key) {
    (void)key;
    return false;
  }
  virtual Status graph_begin(uint64_t key) {
    (void)key;
    return Status::ok();
  }
  virtual Status graph_end(uint64_t key) {
    (void)key;
    return Status::ok();
  }
};

// Copies src to dst when they live on different backends (a placement boundary), or on the same one (copy()).
// Same dtype and shape, both contiguous. `bounce` is host staging of at least src.n_bytes() for the case where
// neither side is host memory (device to device of two backends without a direct path); it may be invalid
// otherwise. Waits for src's backend (the data must be complete) before a cross-backend transfer.
Status copy_between(const Tensor& src, const Tensor& dst, void* bounce, size_t bounce_bytes);

// The cache types `be` stores as K and as V alike, in kKvCacheTypes' order, for error messages: "f32, f16 or q8_0".
std::string stored_cache_types(const Backend& be);

// The CPU backend (backend/cpu). reference = scalar single-threaded reference ops (the executable spec that every
// fast path and every other backend is tested against). Callers above the backend layer get backends from the
// registry (backend/registry.h), not from here.
struct CpuBackendOptions {
  int n_threads = 0;  // 0: all cores
  bool reference = false;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts);

}  // namespace kiln

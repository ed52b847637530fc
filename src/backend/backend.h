// The backend op interface (DESIGN.md section 2). The forward pass (model/) is written once against this class and
// runs unchanged on every backend. Rules every implementation follows:
//   - Tensors (backend/tensor.h) are views into this backend's memory; all memory the model uses at run time
//     (activations, scratch, KV cache) comes from alloc(), host bytes go in and out through write()/read().
//   - Weights enter through import_weight(): the CPU backend returns a zero-copy view of the host bytes (the GGUF
//     mapping), a device backend uploads them once. Weights keep their GGUF block layout everywhere.
//   - Every op checks dtypes and shapes first and returns an error (kUnsupported / kInvalidArgument naming the
//     operand) for a combination it does not handle; it never crashes on one.
//   - Ops are stream-ordered: a device backend may return before the work is done; read() and synchronize()
//     wait. Index tensors (ids, positions, slots, block tables) live in backend memory too, so a device backend
//     can capture a whole decode step in a graph and replay it with new indices.
//   - Unless stated, an op's dst may alias its first input (in-place), never partially overlap.
// Shapes below use ggml order, innermost first: "[d, n]" = n rows of d elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

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
};

// One layer of the paged KV cache as the attention ops see it.
//   k: [n_head_kv * head_dim_k, n_slots] of dtype F16 / F32 / Q8_0 (one row per token slot, heads contiguous)
//   v: [n_head_kv * head_dim_v, n_slots] same dtype
// Slot s of block b is row b * block_size + s.
struct KvLayer {
  Tensor k, v;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0, head_dim_v = 0;
  int32_t block_size = 0;
};

// Per-batch attention metadata (all I32 tensors in backend memory).
//   block_tables: [max_blocks, n_tables]  row r = physical block ids of one sequence, logical order
//   tok_table:    [n_tok]                 which row of block_tables token t reads
//   kv_len:       [n_tok]                 token t attends to its sequence's positions [0, kv_len[t])
//                                         (causal prefill/decode: pos + 1; the batch's own K/V are stored first)
struct AttnBatch {
  Tensor block_tables, tok_table, kv_len;
  int32_t max_kv_len = 0;  // upper bound of kv_len (host-known; sizes split-KV work on devices)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory ----
  // Uninitialized memory of `bytes` (64-byte aligned at least). Errors: kOutOfRange when the device is full.
  virtual Result<std::unique_ptr<Buffer>> alloc(size_t bytes) = 0;
  // Host bytes -> tensor memory at byte `offset` of dst.data, and back.
  virtual Status write(const Tensor& dst, size_t offset, const void* src, size_t n) = 0;
  virtual Status read(const Tensor& src, size_t offset, void* dst, size_t n) = 0;
  // A weight of GGUF type `t`, shape ne, whose bytes are `host` (must outlive the model: the mapping).
  virtual Result<Tensor> import_weight(DType t, const int64_t ne[4], const void* host, size_t nbytes) = 0;
  // Waits for all queued work.
  virtual Status synchronize() { return Status::ok(); }

  // ---- ops ----
  // dst[:, t] = row ids[t] of w, converted to f32.   w: [d, n_rows] any dequantizable type; ids: I32 [n];
  // dst: F32 [d, n]. An id outside [0, n_rows) is kInvalidArgument naming the index and id.
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
  // slots: I32 [n_tok] (physical slot = block * block_size + offset). Converts to the cache dtype.
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
  virtual Status argmax(const Tensor& x, const Tensor& dst) = 0;
  // Elementwise convert between F32, F16 and BF16, or a byte copy of any type to itself (same shape; rows may be
  // strided on both sides). dst must not overlap src.
  virtual Status copy(const Tensor& src, const Tensor& dst) = 0;
};

// The CPU backend (backend/cpu). reference = scalar single-threaded reference ops (the executable spec that every
// fast path and every other backend is tested against).
struct CpuBackendOptions {
  int n_threads = 0;  // 0: all cores
  bool reference = false;
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opts);

}  // namespace kiln

// The middle tier of every CUDA op: launchers. The backend's op entries (cuda_backend.cu) check operands and unpack
// tensors into these parameter structs; each launcher picks its configuration from a constexpr table in its .cu
// file, enqueues on the given stream and returns a Status (launch errors checked with file and line).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"
#include "util/status.h"

namespace kiln::cuda {

// ---- getrows.cu ------------------------------------------------------------------------------------------------
struct GetRowsParams {
  DType type;
  const uint8_t* w;
  size_t w_row_bytes;
  int64_t d;  // elements per row
  const int32_t* ids;
  int64_t n;
  float* dst;
  size_t dst_stride;  // floats
};
Status launch_get_rows(const GetRowsParams& p, cudaStream_t s);

// ---- norm.cu ---------------------------------------------------------------------------------------------------
struct RmsNormParams {
  const float* x;
  size_t x_stride;
  const float* w;  // may be null
  float eps;
  float* dst;
  size_t dst_stride;
  int64_t d, n;
};
Status launch_rms_norm(const RmsNormParams& p, cudaStream_t s);
// layer_norm (Backend::layer_norm): r's rows, eps and weight (may be null), plus the bias b (may be null).
struct LayerNormParams {
  RmsNormParams r;
  const float* b;
};
Status launch_layer_norm(const LayerNormParams& p, cudaStream_t s);

// ---- rope.cu ---------------------------------------------------------------------------------------------------
struct RopeLaunch {
  float* x;
  size_t head_stride, tok_stride;  // floats
  int64_t head_dim, n_head, n_tok;
  const int32_t* pos;
  const float* freq_factors;  // may be null
  int n_rot;
  bool neox;
  float theta_scale, freq_scale;
  // YaRN (RopeParams, yarn_terms): ext_factor 0 skips the ramp; cos and sin are multiplied by mscale (1: plain RoPE).
  float ext_factor = 0.0f, corr_lo = 0.0f, corr_hi = 0.0f, mscale = 1.0f;
};
Status launch_rope(const RopeLaunch& p, cudaStream_t s);
// The fused rope_kv_store (Backend::rope_kv_store): q and k roped as launch_rope does, then k (roped) and v into
// their cache slots as kv_store does, in one launch. F16 / F32 caches.
struct RopeKvStoreParams {
  DType type;
  const float* v;
  size_t v_stride;     // floats per token
  int64_t hd_v;        // v head dim (k's is RopeLaunch::head_dim)
  uint8_t* ck;
  size_t ck_row, k_head_bytes;  // bytes per slot, per head
  uint8_t* cv;
  size_t cv_row, v_head_bytes;
  const int32_t* slots;
};
Status launch_rope_kv_store(const RopeLaunch& q, const RopeLaunch& k, const RopeKvStoreParams& c, cudaStream_t s);

// ---- elementwise.cu --------------------------------------------------------------------------------------------
// kGeglu: dst = gelu_tanh(a) * b (a = gate, b = up); kSigmoidMul: dst = a / (1 + e^-b) (a = x, b = gate);
// kGelu: dst = gelu_tanh(a) (b unused).
enum class EwOp { kAdd, kMul, kSwiglu, kScale, kGeglu, kSigmoidMul, kGelu };
struct EwParams {
  EwOp op;
  const float* a;
  size_t a_stride;
  const float* b;  // null for kScale and kGelu
  size_t b_stride;  // 0: b broadcasts (one row)
  float* dst;
  size_t dst_stride;
  int64_t d, n;
  float s;
};
Status launch_elementwise(const EwParams& p, cudaStream_t s);

struct ConvertParams {
  DType src_type, dst_type;  // F32 / F16 / BF16
  const uint8_t* src;
  size_t src_stride;  // bytes
  uint8_t* dst;
  size_t dst_stride;
  int64_t d, n;
};
Status launch_convert(const ConvertParams& p, cudaStream_t s);

// ---- softmax.cu ------------------------------------------------------------------------------------------------
struct RowParams {
  const float* x;
  size_t x_stride;
  float* dst;  // softmax
  size_t dst_stride;
  int32_t* ids;  // argmax
  int64_t d, n;
  const uint64_t* mask = nullptr;  // argmax_masked: [n] rows of mask_stride words, bit i % 64 of word i / 64
  size_t mask_stride = 0;
};
Status launch_softmax(const RowParams& p, cudaStream_t s);
Status launch_argmax(const RowParams& p, cudaStream_t s);  // masked when p.mask is set

// ---- ssm.cu: the Gated DeltaNet layer ops ------------------------------------------------------------------------
// The per-sequence arrays of AttnBatch (device I32, n_seq entries): seq_row, seq_q_start, seq_q_len, seq_reset.
struct SeqArrays {
  const int32_t *row, *q_start, *q_len, *reset;
  int n_seq;
};
// conv1d_silu (backend.h): x, dst [C, n_tok] (row strides in floats), w [K, C] (w_stride floats per channel),
// state [(K-1) * C, n_slots] (state_stride floats per slot). K <= kConvMaxK.
constexpr int kConvMaxK = 8;
struct Conv1dParams {
  const float* x;
  size_t x_stride;
  const float* w;
  size_t w_stride;
  float* state;
  size_t state_stride;
  float* dst;
  size_t dst_stride;
  int64_t C;
  int K;
  SeqArrays seq;
};
// max_q_len: host bound of seq_q_len (sizes the token-tile grid; 0 or too small is still correct, only slower).
Status launch_conv1d_silu(const Conv1dParams& p, int max_q_len, cudaStream_t s);
// gated_delta_net (backend.h). Strides in floats. q/k [S_k, H_k, n] (head strides q_head / k_head, token strides
// q_tok / k_tok), v [S_v, H_v, n], alpha/beta [H_v, n] (row strides), A/dt_bias [H_v], state rows
// [H_v * S_v * S_k] (transposed per head), dst [S_v, H_v, n] contiguous.
struct DeltaNetParams {
  const float *q, *k, *v, *alpha, *beta, *A, *dt_bias;
  size_t q_head, q_tok, k_head, k_tok, v_head, v_tok, alpha_stride, beta_stride;
  float* state;
  size_t state_stride;
  float* dst;
  int S_k, S_v, H_k, H_v;
  float scale, l2_eps;
  SeqArrays seq;
};
// Head sizes the kernel is built for: S_k in {32, 64, 128, 256}, any S_v (qwen35: 128 / 128).
bool delta_net_supports(int S_k, int S_v);
Status launch_gated_delta_net(const DeltaNetParams& p, cudaStream_t s);

// ---- kvstore.cu ------------------------------------------------------------------------------------------------
struct KvStoreParams {
  DType type;  // F16 / F32 / Q8_0
  const float* k;
  size_t k_stride;
  const float* v;
  size_t v_stride;
  uint8_t* ck;
  size_t ck_row;  // bytes per slot
  uint8_t* cv;
  size_t cv_row;
  int64_t dk, dv, n;
  const int32_t* slots;
};
Status launch_kv_store(const KvStoreParams& p, cudaStream_t s);

// ---- matmul: quantize.cu, mmvq.cu, mmvf.cu, gemm.cu, mmq.cu -------------------------------------------------------
// q8_1-style activations, kiln's own layout: per token, int8 qs[n_in] (16-byte aligned rows) and per 32-element
// block a float4 {d, d*sum(q[0..16)), d*sum(q[16..32)), 0} (f32 scale: amax/127).
struct ActQ {
  int8_t* qs;
  float4* ds;
  int64_t n_in, n_tok;
  size_t qs_stride;  // bytes per token (n_in rounded up to 16)
  size_t ds_stride;  // float4 per token (n_in / 32)
};
Status launch_quantize_act(const float* x, size_t x_stride, const ActQ& a, cudaStream_t s);
// rms_norm (norm.cu) that also writes the q8_1 activations of its result into `a` (rows with d % 32 == 0 and
// 16-byte alignment: rms_norm_quant_usable).
struct RmsNormParams;
bool rms_norm_quant_usable(const RmsNormParams& p);
Status launch_rms_norm_quant(const RmsNormParams& p, const ActQ& a, cudaStream_t s);

// The mmq split-K workspace (CudaBackend owns one, kMmqSplitBytes): per output tile, S partial tiles (f32, the
// fragments in thread order) and an arrival counter; counters start at 0 and the last block of a tile resets its own,
// so the buffer is reusable by the next launch on the stream without a memset.
constexpr size_t kMmqSplitBytes = size_t{32} << 20;
constexpr int kMmqSplitSems = 16384;  // tiles per launch that may split (a split grid has at most ~4 waves of tiles)
struct MmqSplitWs {
  unsigned* sem = nullptr;  // [kMmqSplitSems]
  float* part = nullptr;
  size_t part_floats = 0;
};
// A grouped product (the experts of moe_ffn, cuda_moe.cu): x's and y's rows are grouped by expert, rows
// [first[e], first[e + 1]) going through expert e's weights (w + e * expert_bytes, bias + e * n_out); n_rows rows in
// all (MatmulParams::n_tok). tiles holds one section per token-tile width BN = 16, 32, 64, 128 (mmq_group_off): the
// (expert, first row) of each BN-row tile of each expert in expert order, then (-1, 0) up to the section's
// capacity mmq_group_cap (launch_moe_group writes them). mmq alone runs grouped products (launch_mmq with a group):
// one block per section entry and weight-row tile, K never split. p.w / p.bias are expert 0's.
struct MatmulGroup {
  const int32_t* first = nullptr;  // [n_expert + 1] on the device; null: an ordinary product
  const int2* tiles = nullptr;
  int64_t n_rows = 0;
  int n_expert = 0;
  size_t expert_bytes = 0;
};
__host__ __device__ constexpr int64_t mmq_group_cap(int64_t n_rows, int n_expert, int bn) {
  return (n_rows + bn - 1) / bn + n_expert;  // sum over experts of ceil(rows_e / bn) <= this
}
__host__ __device__ constexpr int64_t mmq_group_off(int64_t n_rows, int n_expert, int bn) {
  int64_t off = 0;
  for (int b = 16; b < bn; b *= 2) off += mmq_group_cap(n_rows, n_expert, b);
  return off;
}
constexpr int kMmqGroupBnMax = 128;  // sections 16, 32, 64, 128
__host__ __device__ constexpr int64_t mmq_group_entries(int64_t n_rows, int n_expert) {
  return mmq_group_off(n_rows, n_expert, 2 * kMmqGroupBnMax);
}
struct MatmulParams {
  DType type;
  const uint8_t* w;
  size_t w_row_bytes;
  int64_t n_in, n_out, n_tok;
  const float* x;  // f32 activations (mmvf, gemm)
  size_t x_stride;
  const float* bias;  // may be null
  float* y;
  size_t y_stride;
  bool accumulate;  // y += W x (+ bias)
  // GEMV kernels: load the first weights before pdl_wait (weights are never written during a step, so they need not
  // wait for the previous kernel; false only in measurements of that overlap).
  bool prefetch = true;
  // mmq split-K (mmq_common.cuh mmq_finish): the caller's workspace (null: never split) and, set by the launcher
  // (mmq.cuh mmq_split_count), k_split = S: blockIdx.z takes K stages [z*n/S, (z+1)*n/S).
  MmqSplitWs split{};
  int k_split = 1;
};
// Integer GEMV for n_tok <= kGemvMaxTok tokens of quantized weights, activations from launch_quantize_act: one
// launch per kMmvqMaxTok tokens (the weights are read once per pass). The selector (select_matmul) takes the GEMVs
// (mmvq, mmvq group, mmvf) up to kGemvMaxTok tokens.
// H200, llama3-8b q4_k_m, P sequences decoding together (kiln bench -np P -d 128), GEMV / mmq for 17..P tokens:
// P 32 1153 / 841 t/s (mmq's grid is one token tile wide and latency-bound), P 64 1143 / 1482.
constexpr int kMmvqMaxTok = 16, kGemvMaxTok = 32;
// Rows [t0, t0 + n) of quantized activations.
ActQ act_rows(const ActQ& a, int64_t t0, int64_t n);
bool mmvq_supports(DType t);
Status launch_mmvq(const MatmulParams& p, const ActQ& a, cudaStream_t s);
// The bandwidth GEMV (mmvq_fast.cuh) for Q4_K / Q6_K: up to 3 products of one input in one launch (q/k/v,
// gate/up), or with swiglu: seg[0] = gate, seg[1] = up (same n_out), seg[0].y = silu(gate x) * (up x).
bool mmvq_fast_supports(DType t);
struct MmvqSeg {
  const uint8_t* w;
  size_t w_row_bytes;
  int64_t n_out;
  const float* bias;  // may be null
  float* y;
  size_t y_stride;
  bool accumulate;
};
struct MmvqGroup {
  MmvqSeg seg[3];
  int n_seg;
  unsigned blk_end[3];  // filled by the launcher
  int64_t n_in, n_tok;
  bool swiglu;
  bool prefetch = true;  // as MatmulParams::prefetch
};
Status launch_mmvq_group(DType t, const MmvqGroup& g, const ActQ& a, cudaStream_t s);
// Float-weight GEMV (F32/F16/BF16) for n_tok <= kGemvMaxTok (passes of kMmvqMaxTok); needs n_in % 8 == 0 and
// 16-byte aligned rows.
bool mmvf_supports(DType t);
bool mmvf_usable(const MatmulParams& p);
Status launch_mmvf(const MatmulParams& p, cudaStream_t s);
// Tiled GEMM, any token count, every matmul type; quantized weights read the activations from `a` (quantized x),
// float weights read p.x.
bool gemm_supports(DType t);
Status launch_gemm(const MatmulParams& p, const ActQ& a, cudaStream_t s);

// Tensor-core GEMM (mmq.cuh, mmq.cu; taken for many tokens where the selector does not take blas:
// matmul_select.cu): quantized weights (all 10 types) on int8 MMA with the ActQ
// activations (the GEMV's numerics up to f32 summation order), F16 / BF16 on f16 / bf16 MMA (activations rounded to
// the weight type, f32 accumulation). mmq_usable: the type, an sm_80+ device (else the f32 GEMM) and the alignment
// the kernels need (F16/BF16: n_in % 8 == 0, 16-byte aligned w rows and x).
bool mmq_supports(DType t);
// Whether the current device runs the int8 tensor-core kernels (mmq, mmvq_mma): compute capability >= 8.0 and
// code built for compute_80 or newer (mma.cuh).
bool int8_mma_ok();
// Whether 3..32-token products of Q4_K / Q6_K take the tensor-core GEMV (mmvq_mma.cuh): int8_mma_ok(); else the
// dp4a GEMV in passes of 16 tokens.
bool mmvq_mma_on();
bool mmq_usable(const MatmulParams& p);
Status launch_mmq(const MatmulParams& p, const ActQ& a, cudaStream_t s, const MatmulGroup* group = nullptr);

// Dequantize + cuBLAS for many tokens (gemm_blas.cu): quantized weights dequantized to f16 rows (in chunks of at
// most kBlasChunkBytes), F16 / BF16 weights read as they are, activations rounded to f16 (bf16 for BF16 weights),
// f32 accumulation and output. `cc`: the device's compute capability (major * 10 + minor).
constexpr size_t kBlasChunkBytes = size_t{128} << 20;
struct BlasScratch {
  void* handle;  // from blas_create (a cublasHandle_t)
  void* w;       // >= blas_weight_scratch_bytes(p)
  size_t w_bytes;
  void* x;  // >= blas_act_scratch_bytes(p)
  size_t x_bytes;
};
bool blas_usable(const MatmulParams& p, int cc);
size_t blas_weight_scratch_bytes(const MatmulParams& p);
size_t blas_act_scratch_bytes(const MatmulParams& p);
// A cuBLAS handle working in `workspace` (kept by the caller for the handle's lifetime), and its release.
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
Status blas_create(void** handle, void* workspace, size_t ws_bytes);
void blas_destroy(void* handle);
Status launch_blas(const MatmulParams& p, const BlasScratch& sc, cudaStream_t s);

// The one matmul selector (matmul_select.cu): the kernel for product p on a device of compute capability cc;
// kNone when no kernel takes the weight type. matmul_set_override forces a kernel where it can run (tests, A/B
// runs; also KILN_CUDA_MATMUL=<name>); nullptr or "" restores the rule.
// ---- mmf.cu: the weight-streaming f16 GEMM (mmf.cuh) ---------------------------------------------------------------
// One launch's segments: up to three weights of one type over the same activations (q/k/v, gate/up), their 16-row
// tiles numbered one after another (tile0: the segment's first, set by launch_mmf).
struct MmfSeg {
  const uint8_t* w;
  size_t row_bytes;
  int64_t n_out;
  int64_t tile0;
  float* y;  // [n_tok][y_stride]
  size_t y_stride;
  const float* bias;  // may be null
};
struct MmfGroup {
  DType type;
  MmfSeg seg[3];
  int n_seg;
  const void* x;  // f16 activations [n_tok][x_stride], 16-byte aligned rows
  size_t x_stride;  // elements
  int64_t n_in, n_tok;
  bool accumulate;  // y += W x (+ bias)
};
// mmf_usable: the type (Q4_K), an sm_80+ device, n_in % 256 == 0 and 16-byte aligned weight rows.
bool mmf_supports(DType t);
bool mmf_usable(const MatmulParams& p);
size_t mmf_act_scratch_bytes(int64_t n_in, int64_t n_tok);
// Splits K through the mmq split-K workspace (its counters are left at zero, as mmq leaves them).
Status launch_mmf(const MmfGroup& g, const MmqSplitWs& ws, cudaStream_t s);
// Whether mmf may take its wgmma kernels (compute capability 9.0, sm_90a builds; on by default). Tests turn it off to
// run the mma.sync kernels on the same device.
void mmf_set_wgmma(bool allowed);

enum class MatmulKernel { kNone, kMmvq, kMmvf, kMmf, kMmq, kGemm, kBlas };
const char* matmul_kernel_name(MatmulKernel k);
MatmulKernel select_matmul(const MatmulParams& p, int cc);
void matmul_set_override(const char* name);
// The selector's kernel name for a contiguous, aligned n_out x n_in product of n_tok tokens on the current device
// (tests: which numerics model applies).
const char* matmul_kernel_for(DType t, int64_t n_in, int64_t n_out, int64_t n_tok);

// ---- attention.cu ----------------------------------------------------------------------------------------------
struct AttnParams {
  const float* q;
  size_t q_tok_stride, q_head_stride;  // floats
  float* dst;                          // [hd_v, n_head, n_tok] contiguous
  const uint8_t* k;
  const uint8_t* v;
  size_t k_slot_bytes, v_slot_bytes, k_head_bytes, v_head_bytes;
  DType kv_type;
  int n_tok, n_head, n_head_kv, hd_k, hd_v, block_size;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* tok_table;
  const int32_t* kv_len;
  float scale;
  int max_kv_len;  // host-known bound (0: unknown -> no split)
  int n_sm;
  int window = 0;  // sliding window (KvLayer::window): token with kv_len L sees [max(0, L - window), L); 0: all
  // Attention sinks (KvLayer::sinks): [n_head] f32 logits, each joining its head's softmax denominator; null: none.
  const float* sinks = nullptr;
  // Per-sequence metadata (AttnBatch; the prefill kernel fattn_mma.cu tiles queries per sequence). May be null
  // for attention.cu, which works per token.
  const int32_t* seq_row = nullptr;
  const int32_t* seq_q_start = nullptr;
  const int32_t* seq_q_len = nullptr;
  int n_seq = 0, max_q_len = 0;
};
// Partial results of split-KV: floats needed for this launch (0 when it does not split).
size_t attention_scratch_floats(const AttnParams& p);
Status launch_attention(const AttnParams& p, float* scratch, cudaStream_t s);
// The split-KV second pass alone (dev/cuda benchmarks of other first passes): part holds, per (token, head) and
// split, attention_part_row(hd_v) floats (the unnormalized output, then its max and sum).
Status launch_attention_combine(const AttnParams& p, int n_split, const float* part, cudaStream_t s);
int attention_part_row(int dv);
// Tests and benchmarks: the decode kernel f16 caches run (0 attn_vec_kernel, 1 attn_krow_kernel with 4 blocks per
// SM, 2 with 1; 1 and 2 at head dims 64 / 128 only); -1: attention.cu's selector.
void attention_force_decode(int kernel);
// Dynamic shared memory the attention kernel needs (checked against the device limit by the entry).
size_t attention_smem_bytes(const AttnParams& p);
Status attention_init(size_t max_smem);  // also sets up fattn_mma.cu's kernels

// ---- fattn_mma.cu: the tensor-core flash-attention prefill kernel (f16 cache, head dims 64/128/256, sm_80+) ----
// The one selector (CudaBackend::attention dispatches with it): true when fattn_mma runs this launch, i.e. f16
// cache, hd_k == hd_v in {64, 128, 256}, compute capability `cc` (major * 10 + minor) >= 80, the sequence metadata
// present, max_q_len >= kFattnMinQ (decode and short steps stay on attention.cu's split-KV kernel), aligned K/V rows
// and the kernel's shared memory within `smem_optin`.
constexpr int kFattnMinQ = 16;
bool fattn_mma_selected(const AttnParams& p, int cc, size_t smem_optin);
size_t fattn_mma_smem_bytes(int head_dim);
Status fattn_mma_init(size_t max_smem);
Status launch_fattn_mma(const AttnParams& p, cudaStream_t s);
// Whether a selected launch runs the wgmma kernel (sm90a/fattn_wgmma.cu: 9.0 devices, head dims 64 / 128, when the
// build has it) rather than the mma.sync one; fattn_set_wgmma(false) keeps every launch on mma.sync (tests compare
// the two; default true).
bool fattn_wg_selected(const AttnParams& p);
void fattn_set_wgmma(bool allowed);
// Tests: the wgmma variant a selected launch runs (an index into fattn_mma.cuh kFaWgVariants; -1: fa_wg_variant).
void fattn_force_wg_variant(int index);

// ---- moe.cu: the device pieces of the mixture-of-experts FFN (CudaBackend::moe_ffn, cuda_moe.cu) ----------------
struct MoeRouteParams {
  float* logits;       // [n_tok][n_expert] router logits (bias not yet added); overwritten (probabilities)
  const float* bias;   // [n_expert] or null
  int64_t n_tok;
  int n_expert, k;
  bool softmax_all;     // MoeGating::kSoftmax: softmax over all experts first
  bool softmax_chosen;  // MoeGating::kSoftmaxWeight: softmax over the k chosen logits
  bool norm;            // renormalise the k weights by their sum
  int32_t* sel;         // [n_tok][k] experts, decreasing probability
  float* w;             // [n_tok][k] weights
};
Status launch_moe_route(const MoeRouteParams& p, cudaStream_t s);
// xg row r (d floats) = x row tok[r]
Status launch_moe_gather(const float* x, size_t x_stride, const int32_t* tok, int64_t n_rows, int64_t d, float* xg,
                         cudaStream_t s);
// gpt-oss's clamped SwiGLU over n values, in place on g (MoeActivation::kSwigluOai)
Status launch_swiglu_oai(float* g, const float* u, int64_t n, float alpha, float limit, cudaStream_t s);
struct MoeCombineParams {
  const float* y;      // [rows][d]: each slot's down product (and bias)
  const int32_t* row;  // [n_tok][k]: the slot's row of y; null: slot s = t k + j is row s
  const float* w;      // [n_tok][k]
  float* acc;          // [n_tok] rows of acc_stride floats
  size_t acc_stride;
  int64_t n_tok, d;
  int k;
};
Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t s);
// The slots grouped by expert on the device (one block): sel [n_slot] (slot s = token s / k) -> first [n_expert + 1],
// row [n_slot] (slot s's row among the grouped rows: expert 0's first, slots in increasing order within an expert),
// tok [n_slot] (grouped row r's token) and the tile sections of MatmulGroup (tiles: mmq_group_entries(n_slot,
// n_expert) int2). Needs n_expert <= kMoeGroupMaxExperts.
constexpr int kMoeGroupMaxExperts = 1024;
struct MoeGroupParams {
  const int32_t* sel;
  int64_t n_slot;
  int n_expert, k;
  int32_t *first, *row, *tok;
  int2* tiles;
};
Status launch_moe_group(const MoeGroupParams& p, cudaStream_t s);
// The experts' GEMV (moe_gemv.cu), for steps whose expert products are all GEMVs: y row s = W_{ids[s]} x_{s / x_div}
// (+ bias row ids[s]) for the n_slot slots, the experts read on the device (no host round trip, so the step can be a
// CUDA graph). mmvq's kernel and numerics (mmvq.cuh: one warp per row, q8_1 activations), one slot per grid row;
// the types mmvq_supports.
struct MmvqIdParams {
  DType type;
  const uint8_t* w;     // expert 0's plane; expert e's at w + e * expert_bytes
  size_t expert_bytes, w_row_bytes;
  int64_t n_in, n_out, n_slot;
  const int32_t* ids;   // [n_slot] experts
  int x_div;            // slot s reads activation row s / x_div (gate/up: the token, k slots each; down: 1)
  const float* bias;    // [n_expert][n_out] or null
  float* y;             // row s of y_stride floats
  size_t y_stride;
};
Status launch_mmvq_id(const MmvqIdParams& p, const ActQ& a, cudaStream_t s);
// The decode step's fused forms of the same products, in launch_mmvq_id's arithmetic and the separate kernels' steps:
//   launch_mmvq_id_glu: gate and up of every slot in one launch, the activation applied (h row s = act(gate row s,
//     up row s), written to gate.y; up.y unused), as launch_mmvq_id twice and then the activation's kernel do.
//   launch_mmvq_id_sum: the down products summed into the accumulator in slot order, acc_t += o with o = y_0 w_0,
//     o = o + y_j w_j (j < k), y_j = down row of slot t k + j: launch_mmvq_id then launch_moe_combine; needs
//     down.x_div 1.
enum class MoeGlu { kSwiglu, kSwigluOai };
struct MmvqIdGluParams {
  MmvqIdParams gate, up;  // the same type, n_in, n_out, n_slot, ids and x_div
  MoeGlu act;
  float alpha, limit;     // kSwigluOai's
};
Status launch_mmvq_id_glu(const MmvqIdGluParams& p, const ActQ& a, cudaStream_t s);
struct MmvqIdSumParams {
  MmvqIdParams down;  // n_slot = n_tok k; its y unused
  const float* w;     // [n_tok][k]
  int k;
  float* acc;         // [n_tok] rows of acc_stride floats
  size_t acc_stride;
};
Status launch_mmvq_id_sum(const MmvqIdSumParams& p, const ActQ& a, cudaStream_t s);

}  // namespace kiln::cuda

// The recurrent-layer ops of hybrid models (Qwen3.5's Gated DeltaNet layers): conv1d_silu (the causal depthwise
// input conv with a per-sequence state) and gated_delta_net (the gated delta rule). Contracts: backend/backend.h.
//   entries: CudaBackend::{conv1d_silu, gated_delta_net} (cuda_backend.cu: operand checks, unpacking)
//     -> launch_conv1d_silu / launch_gated_delta_net (launch.h: grid from the host-known n_seq / max_q_len)
//     -> kernels below.
// Both read the step's per-sequence arrays (seq_row, seq_q_start, seq_q_len, seq_reset) from device memory, so a
// CUDA graph replay with a new plan runs the new sequences: the grids depend only on n_seq and max_q_len (part of
// the step key). A sequence with q_len <= 0 (a padded entry) touches nothing: no output, its state row unchanged.
//
// gated_delta_net is evaluated token by token (the one-step recurrence, for decode and prefill alike), with the
// state resident in registers across the tokens of a sequence: read once at the start, written once at the end.
// The chunked form of the CPU backend (chunks of 64, the within-chunk triangular solve) is not on the GPU yet.
// Why the sequential form first: per token a warp's critical path is ~3 + 1 butterfly reductions and a few
// expf/logf (~450 cycles, ~0.25 us), with n_seq x H_v x ceil(S_v / 16) independent blocks (qwen3.5-9b: 256 blocks
// for one sequence), i.e. ~60 ms per layer for a 250K-token prompt. A chunked kernel from shared memory with plain
// FMAs (the CPU's algorithm: KK / QK Gram matrices, S0^T K and S0^T Q, the solve, the state update) moves ~2.4M
// shared-memory loads per 64-token chunk per block, ~0.6 us per token: no faster. It pays only with the chunk
// products on tensor cores (mma over 64 x 128 tiles), which is the next step for long prompts.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

// ---- conv1d_silu ----------------------------------------------------------------------------------------------
// Two kernels, ordered on the stream, so no thread overwrites a state row another thread still has to read:
//   conv1d_out_kernel<K>: grid (ceil(C / 128), token tiles, n_seq); thread = (channel c, a tile of kConvTile
//     consecutive tokens of sequence s; tiles grid-strided over the sequence). in(u) = x[q_start + u][c] for
//     u >= 0, else state[row][(K-1+u) * C + c] (0 when reset). dst[c, t] = silu(sum_j w[c][j] in(t-(K-1)+j)),
//     summed in ascending j as the CPU op (f32; silu = a / (1 + expf(-a))). Reads the state, never writes it.
//   conv1d_state_kernel<K>: grid (ceil(C / 128), n_seq); thread = (c, s): row element j * C + c = in(len-(K-1)+j)
//     for j ascending (an element at or after j: not yet overwritten by this same thread).
// ptxas -v (CUDA 13.0, K = 4): out kernel sm_90 40 registers (sm_75 39, sm_80 40, sm_86/89 44), state kernel 22; no
// smem, 0 spills. (Without the min-blocks hint of 8 ptxas picked 32 registers and spilled 8 bytes on sm_90.)
constexpr int kConvThreads = 128;
constexpr int kConvTile = 16;
constexpr int kConvMaxTiles = 4096;  // grid.y cap; the kernel strides over further tiles

template <int K>
__global__ void __launch_bounds__(kConvThreads, 8) conv1d_out_kernel(Conv1dParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int s = blockIdx.z;
  if (c >= p.C) return;
  const int len = p.seq.q_len[s];
  if (len <= 0) return;
  const int64_t t0 = p.seq.q_start[s];
  const float* st = p.state + static_cast<size_t>(p.seq.row[s]) * p.state_stride;
  const bool zero = p.seq.reset[s] != 0;
  float w[K];
#pragma unroll
  for (int j = 0; j < K; ++j) w[j] = p.w[c * p.w_stride + j];
  for (int tile = blockIdx.y; tile * kConvTile < len; tile += gridDim.y) {
    const int tb = tile * kConvTile, te = min(len, tb + kConvTile);
    // win[j] = in(t - (K-1) + j) for the current t.
    float win[K];
#pragma unroll
    for (int j = 0; j < K - 1; ++j) {
      const int u = tb - (K - 1) + j;
      win[j] = u >= 0 ? p.x[(t0 + u) * p.x_stride + c] : (zero ? 0.0f : st[(K - 1 + u) * p.C + c]);
    }
#pragma unroll 4
    for (int t = tb; t < te; ++t) {
      win[K - 1] = p.x[(t0 + t) * p.x_stride + c];
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < K; ++j) acc += w[j] * win[j];
      p.dst[(t0 + t) * p.dst_stride + c] = acc / (1.0f + expf(-acc));
#pragma unroll
      for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
    }
  }
}

template <int K>
__global__ void __launch_bounds__(kConvThreads) conv1d_state_kernel(Conv1dParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kConvThreads + threadIdx.x;
  const int s = blockIdx.y;
  if (c >= p.C) return;
  const int len = p.seq.q_len[s];
  if (len <= 0) return;
  const int64_t t0 = p.seq.q_start[s];
  float* st = p.state + static_cast<size_t>(p.seq.row[s]) * p.state_stride;
  const bool zero = p.seq.reset[s] != 0;
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int u = len - (K - 1) + j;
    st[j * p.C + c] = u >= 0 ? p.x[(t0 + u) * p.x_stride + c] : (zero ? 0.0f : st[(K - 1 + u) * p.C + c]);
  }
}

template <int K>
Status run_conv(const Conv1dParams& p, int max_q_len, cudaStream_t s) {
  const unsigned gx = static_cast<unsigned>((p.C + kConvThreads - 1) / kConvThreads);
  const int tiles = std::clamp((max_q_len + kConvTile - 1) / kConvTile, 1, kConvMaxTiles);
  conv1d_out_kernel<K><<<dim3(gx, static_cast<unsigned>(tiles), static_cast<unsigned>(p.seq.n_seq)), kConvThreads,
                         0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  if constexpr (K > 1) {
    conv1d_state_kernel<K><<<dim3(gx, static_cast<unsigned>(p.seq.n_seq)), kConvThreads, 0, s>>>(p);
    KILN_CUDA_LAUNCH_CHECK();
  }
  return Status::ok();
}

// ---- gated_delta_net ------------------------------------------------------------------------------------------
// Block = (sequence s, value head h, a group of kDnRows = kDnWarps * kDnRpw state rows); each warp owns kDnRpw rows
// j of the head's transposed state M (M[j][i] = S[i][j], row j = S_k contiguous floats in the state row) in
// registers: lane holds M[j][lane + 32 m] for m < E = S_k / 32. The warps are independent: each loads the token's
// q/k head (h mod H_k) itself and normalizes it with warp reductions, so a token needs no block barrier.
// Per token (one-step recurrence, f32), with qn, kn the L2-normalized q, k and kq = kn . qn:
//   pk_j = M[j] . kn, pq_j = M[j] . qn            (old state; butterfly warp sums)
//   d_j  = b (v_j - e pk_j)                       (= b (v_j - (e M[j]) . kn): the decayed state's product)
//   o_j  = scale (e pq_j + d_j kq)                (= scale M'[j] . qn with M'[j] = e M[j] + d_j kn)
//   M[j] = e M[j] + d_j kn
// which is the contract's S <- e^g S; d = b (v - S^T k); S <- S + k d^T; o = scale S^T q, regrouped (the two dots
// of a row come from the old state, so a row needs one pass and one reduction round). e = expf(g), g = A[h] *
// softplus(alpha + dt_bias[h]), b = 1 / (1 + expf(-beta)), norms 1 / sqrtf(sum x^2 + eps) (IEEE sqrt/div), as the
// CPU op in f32. The inputs of token t+1 are loaded while token t computes.
// Differences from the CPU reference: summation order of the 128-long dots (warp tree vs sequential) and the
// regrouping of o_t; both O(u log S_k) relative per token, damped by the decay e <= 1.
// ptxas -v (CUDA 13.0, sm_75..sm_90 alike, +-1 register): E=4 (S_k 128) 80 registers, E=2 64, E=1 56, E=8
// 126; no smem, 0 spills, no barriers.
constexpr int kDnWarps = 4;
constexpr int kDnRpw = 4;
constexpr int kDnRows = kDnWarps * kDnRpw;

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <int E>
struct DnTok {  // one token's inputs as one lane holds them
  float q[E], k[E], v[kDnRpw], alpha, beta;
};

template <int E>
__device__ __forceinline__ void dn_load(const DeltaNetParams& p, int64_t t, int h, int j0, int lane, DnTok<E>& x) {
  const int hk = h % p.H_k;
  const float* q = p.q + t * p.q_tok + hk * p.q_head;
  const float* k = p.k + t * p.k_tok + hk * p.k_head;
#pragma unroll
  for (int m = 0; m < E; ++m) x.q[m] = q[lane + 32 * m], x.k[m] = k[lane + 32 * m];
  const float* v = p.v + t * p.v_tok + h * p.v_head;
#pragma unroll
  for (int r = 0; r < kDnRpw; ++r) x.v[r] = j0 + r < p.S_v ? v[j0 + r] : 0.0f;  // same address in every lane
  x.alpha = p.alpha[t * p.alpha_stride + h];
  x.beta = p.beta[t * p.beta_stride + h];
}

template <int E>
__global__ void __launch_bounds__(kDnWarps * 32) delta_net_kernel(DeltaNetParams p) {
  const int s = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = blockIdx.z * kDnRows + warp * kDnRpw;  // this warp's first row
  if (j0 >= p.S_v) return;                             // (whole warp: no shuffle partner missing)
  const int len = p.seq.q_len[s];
  if (len <= 0) return;
  const int64_t t0 = p.seq.q_start[s];
  float* st = p.state + static_cast<size_t>(p.seq.row[s]) * p.state_stride + static_cast<size_t>(h) * p.S_v * p.S_k;
  const bool zero = p.seq.reset[s] != 0;
  float M[kDnRpw][E];
#pragma unroll
  for (int r = 0; r < kDnRpw; ++r)
#pragma unroll
    for (int m = 0; m < E; ++m)
      M[r][m] = zero || j0 + r >= p.S_v ? 0.0f : st[static_cast<size_t>(j0 + r) * p.S_k + lane + 32 * m];
  const float A = p.A[h], dt = p.dt_bias[h];
  DnTok<E> cur, nxt;
  dn_load<E>(p, t0, h, j0, lane, cur);
  for (int t = 0; t < len; ++t) {
    if (t + 1 < len) dn_load<E>(p, t0 + t + 1, h, j0, lane, nxt);
    float sq = 0.0f, sk = 0.0f, qk = 0.0f;
#pragma unroll
    for (int m = 0; m < E; ++m) sq += cur.q[m] * cur.q[m], sk += cur.k[m] * cur.k[m], qk += cur.q[m] * cur.k[m];
    sq = warp_sum(sq), sk = warp_sum(sk), qk = warp_sum(qk);
    const float nq = 1.0f / sqrtf(sq + p.l2_eps), nk = 1.0f / sqrtf(sk + p.l2_eps);
    float qn[E], kn[E];
#pragma unroll
    for (int m = 0; m < E; ++m) qn[m] = cur.q[m] * nq, kn[m] = cur.k[m] * nk;
    const float kq = qk * nq * nk;
    const float x = cur.alpha + dt;
    const float g = A * (x > 20.0f ? x : logf(1.0f + expf(x)));
    const float e = expf(g), b = 1.0f / (1.0f + expf(-cur.beta));
    float pk[kDnRpw], pq[kDnRpw];
#pragma unroll
    for (int r = 0; r < kDnRpw; ++r) {
      pk[r] = 0.0f, pq[r] = 0.0f;
#pragma unroll
      for (int m = 0; m < E; ++m) pk[r] += M[r][m] * kn[m], pq[r] += M[r][m] * qn[m];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int r = 0; r < kDnRpw; ++r) {
        pk[r] += __shfl_xor_sync(0xffffffffu, pk[r], o);
        pq[r] += __shfl_xor_sync(0xffffffffu, pq[r], o);
      }
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < kDnRpw; ++r) {
      const float d = b * (cur.v[r] - e * pk[r]);
      const float out = p.scale * (e * pq[r] + d * kq);
      if (lane == r) mine = out;
#pragma unroll
      for (int m = 0; m < E; ++m) M[r][m] = e * M[r][m] + d * kn[m];
    }
    if (lane < kDnRpw && j0 + lane < p.S_v) p.dst[((t0 + t) * p.H_v + h) * p.S_v + j0 + lane] = mine;
    if (t + 1 < len) cur = nxt;
  }
#pragma unroll
  for (int r = 0; r < kDnRpw; ++r)
    if (j0 + r < p.S_v)
#pragma unroll
      for (int m = 0; m < E; ++m) st[static_cast<size_t>(j0 + r) * p.S_k + lane + 32 * m] = M[r][m];
}

template <int E>
Status run_dn(const DeltaNetParams& p, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(p.seq.n_seq), static_cast<unsigned>(p.H_v),
                  static_cast<unsigned>((p.S_v + kDnRows - 1) / kDnRows));
  delta_net_kernel<E><<<grid, kDnWarps * 32, 0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace

Status launch_conv1d_silu(const Conv1dParams& p, int max_q_len, cudaStream_t s) {
  if (p.seq.n_seq == 0 || p.C == 0) return Status::ok();
  if (p.seq.n_seq > 65535)
    return make_error(ErrorCode::kUnsupported, "conv1d_silu: %d sequences in one step (at most 65535)", p.seq.n_seq);
  switch (p.K) {
    case 1: return run_conv<1>(p, max_q_len, s);
    case 2: return run_conv<2>(p, max_q_len, s);
    case 3: return run_conv<3>(p, max_q_len, s);
    case 4: return run_conv<4>(p, max_q_len, s);
    case 5: return run_conv<5>(p, max_q_len, s);
    case 6: return run_conv<6>(p, max_q_len, s);
    case 7: return run_conv<7>(p, max_q_len, s);
    case 8: return run_conv<8>(p, max_q_len, s);
  }
  return make_error(ErrorCode::kUnsupported, "conv1d_silu: kernel size %d (the CUDA kernels take 1..%d)", p.K,
                    kConvMaxK);
}

bool delta_net_supports(int S_k, int S_v) {
  return S_v >= 1 && (S_k == 32 || S_k == 64 || S_k == 128 || S_k == 256);
}

Status launch_gated_delta_net(const DeltaNetParams& p, cudaStream_t s) {
  if (p.seq.n_seq == 0 || p.S_v == 0) return Status::ok();
  if (p.seq.n_seq > INT32_MAX || p.H_v > 65535 || (p.S_v + kDnRows - 1) / kDnRows > 65535)
    return make_error(ErrorCode::kUnsupported, "gated_delta_net: grid of %d x %d x %d blocks", p.seq.n_seq, p.H_v,
                      (p.S_v + kDnRows - 1) / kDnRows);
  switch (p.S_k) {
    case 32: return run_dn<1>(p, s);
    case 64: return run_dn<2>(p, s);
    case 128: return run_dn<4>(p, s);
    case 256: return run_dn<8>(p, s);
  }
  return make_error(ErrorCode::kUnsupported, "gated_delta_net: key head size %d (the CUDA kernel takes 32, 64, 128, "
                    "256)", p.S_k);
}

}  // namespace kiln::cuda

// Batched decode GEMV on the tensor cores, 3..32 tokens, for the k-quants of the q4_k_m mix (Q4_K, Q6_K): int8
// mma.sync fed straight from the weight bytes in global memory (each weight byte is used by one warp only, so
// there is nothing to stage in shared memory) with the q8_1 activations as the B operand.
//   entry: launch_mmvq / launch_mmvq_group (mmvq.cu)  ->  mmvq_group_run<T> (instances/, when mmvq_mma_on() and
//   n_tok > 2)  ->  mmvq_mma_nc<T, SW>  ->  mmvq_mma_kernel<T, NT, SW>
// Why: the dp4a GEMV (mmvq_fast.cuh) costs ~20 instructions per 32 weights per token and row; at 8-16 tokens the
// decode step was instruction- and latency-bound (H200, 8B q4_k_m, 8 sequences: 8.7 ms per step against 2.7 ms
// at one). One m16n8k32 MMA does 16 rows x 8 tokens x 32 weights.
// Geometry: a block of kMmaWarps (8) warps owns 16 weight rows (SwiGLU: 16 gate and the same 16 up rows, two
// m-tiles) and NT tokens (8, 16 or 32: NT / 8 n-tiles); the warps split K in units of 64 weights (unit u goes to
// warp u % 8), each accumulating its 16 x NT (x 2) outputs in C fragments; the warps' partial sums meet in shared
// memory at the end. Fragments (mma.cuh: g = lane / 4, c = lane % 4), per unit and m-tile, rows g and g + 8:
//   Q4_K: bytes [4c, 4c + 4) and [16 + 4c, 20 + 4c) of the unit's 32 quant bytes of each row: low nibbles are the
//         A fragment (a0..a3) of sub-block 2j, high nibbles of sub-block 2j + 1: two m16n8k32 MMAs; the 16-byte
//         super-block header (d, dmin, 6-bit scales and mins) per row;
//   Q6_K: per 16-weight group gi (one scale each) the 4 quants at l = 16 gi + 4c of ql and qh (210-byte blocks,
//         2-byte aligned: 16-bit loads), 6-bit values minus 32: one m16n8k16 MMA per group;
//   B: 4 bytes of token 8 nt + g's q8_1 quants at k 4c (and 16 + 4c); the token's float4 scale of the sub-block
//   for the columns 2c, 2c + 1 of the C fragment. Tokens >= n_tok read token n_tok - 1 and are not written.
// Numerics: the GEMV's. Per 32-weight sub-block (Q6_K: 16-weight group) the exact int32 dot of int8 weights and
// activations (the MMA accumulator, started at kMmqMagic: one FADD converts it), scaled in f32: Q4_K
// d_a (d sc) isum - dmin m (d_a sum q_a), Q6_K (d sc) d_a isum; only the f32 summation order differs from the
// dp4a kernels, so a token's outputs do not depend on how many tokens share the launch beyond f32 rounding.
// The first unit's weights are loaded before pdl_wait (weights are never written during a step: common.cuh).
// Ledger: per thread the weights of the unit and the next (Q4_K 6, Q6_K 8 registers per row and m-tile), the
// decoded fragments and scales (16 per m-tile), acc M x NT / 8 x 4 floats; shared memory kMmaWarps x 16 M x
// (NT + 1) floats (M = 2 with SwiGLU): 4.5 / 8.7 / 16.9 KB, SwiGLU 9 / 17.4 / 33.8 KB. -Xptxas -v (sm_90, no
// spills, no stack; __launch_bounds__(256, 1): at the default register target ptxas spilled 4-16 bytes), NT 8 / 16
// / 32: Q4_K 82 / 124 / 186 registers, SwiGLU 114 / 159 / 230; Q6_K 96 / 119 / 159, SwiGLU 138 / 167 / 214.
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant.cuh"

namespace kiln::cuda {

constexpr int kMmaWarps = 8, kMmaThreads = kMmaWarps * kWarp, kMmaUnit = 64;

template <DType T> struct MmaK;

template <> struct MmaK<DType::Q4_K> {
  struct W {  // one row's share of a unit
    uint32_t x0, x1;  // quant bytes [4c, 4c + 4) and [16 + 4c, 20 + 4c) of the unit
    uint4 hdr;        // d | dmin << 16, the 12 bytes of scales and mins
  };
  static __device__ __forceinline__ W load(const uint8_t* row, int u, int c) {
    const uint8_t* sb = row + static_cast<size_t>(u >> 2) * 144;
    const uint8_t* q = sb + 16 + 32 * (u & 3);
    W w;
    w.x0 = __ldg(reinterpret_cast<const uint32_t*>(q + 4 * c));
    w.x1 = __ldg(reinterpret_cast<const uint32_t*>(q + 16 + 4 * c));
    w.hdr = __ldg(reinterpret_cast<const uint4*>(sb));
    return w;
  }
  // The A fragments and scales of a unit for rows g / g + 8 (w[0] / w[1]), decoded once for all n-tiles.
  struct P {
    uint32_t a[2][4];      // sub-block 2j + h: low (h 0) or high (h 1) nibbles
    float dsc[2][2], dmm[2][2];  // [h][row]: d * sc, dmin * m
  };
  static __device__ __forceinline__ P prep(const W (&w)[2], int u) {
    const int j = u & 3;
    const uint32_t m = 0x0F0F0F0Fu;
    P p;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      p.a[h][0] = (w[0].x0 >> (4 * h)) & m, p.a[h][1] = (w[1].x0 >> (4 * h)) & m;
      p.a[h][2] = (w[0].x1 >> (4 * h)) & m, p.a[h][3] = (w[1].x1 >> (4 * h)) & m;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        int sc, mn;
        kq_scale_min(2 * j + h, w[r].hdr.y, w[r].hdr.z, w[r].hdr.w, &sc, &mn);
        p.dsc[h][r] = h2f(static_cast<uint16_t>(w[r].hdr.x)) * static_cast<float>(sc);
        p.dmm[h][r] = h2f(static_cast<uint16_t>(w[r].hdr.x >> 16)) * static_cast<float>(mn);
      }
    }
    return p;
  }
  // acc[k] += the unit's products for C entry k (k >> 1: row g + 8; k & 1: token 2c + 1) of one n-tile; b[h] and
  // ds[h] are the n-tile's activation quants and scales of sub-block 2u + h.
  static __device__ __forceinline__ void mma(const P& p, const uint32_t (&b)[2][2], const float4 (&ds)[2][2],
                                             float (&acc)[4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int c[4];
      mma_s8_k32(c, p.a[h], b[h][0], b[h][1]);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 d = ds[h][k & 1];
        acc[k] += d.x * p.dsc[h][k >> 1] * mmq_i2f(c[k]) - p.dmm[h][k >> 1] * (d.y + d.z);
      }
    }
  }
};

template <> struct MmaK<DType::Q6_K> {
  struct W {
    uint32_t ql[4], qh[2];  // ql at l = 16 gi + 4c (gi 0..3); qh at l % 32 = 4c, 16 + 4c (groups gi, gi + 2 share)
    uint32_t sc;            // the unit's 4 int8 scales
    float d;
  };
  static __device__ __forceinline__ W load(const uint8_t* row, int u, int c) {
    const uint8_t* sb = row + static_cast<size_t>(u >> 2) * 210;
    const int q = u & 3, hh = q >> 1;
    W w;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) w.ql[gi] = ld_u32_a2(sb + 64 * hh + 16 * gi + 4 * c);
#pragma unroll
    for (int k = 0; k < 2; ++k) w.qh[k] = ld_u32_a2(sb + 128 + 32 * hh + 16 * k + 4 * c);
    w.sc = ld_u32_a2(sb + 192 + 4 * q);
    w.d = h2f(ld_u16(sb + 208));
    return w;
  }
  static __device__ __forceinline__ uint32_t quants(const W& w, int odd, int gi) {
    const uint32_t nib = odd ? (w.ql[gi] >> 4) & 0x0F0F0F0Fu : w.ql[gi] & 0x0F0F0F0Fu;
    const uint32_t hb = (w.qh[gi & 1] >> (4 * odd + 2 * (gi >> 1))) & 0x03030303u;
    return __vsub4(nib | (hb << 4), 0x20202020u);
  }
  struct P {
    uint32_t a[4][2];  // group gi: rows g, g + 8
    float dsc[4][2];   // d * sc
  };
  static __device__ __forceinline__ P prep(const W (&w)[2], int u) {
    const int odd = u & 1;  // unit (u & 3): half (u & 3) >> 1, low (even) or high (odd) nibbles of ql
    P p;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        p.a[gi][r] = quants(w[r], odd, gi);
        p.dsc[gi][r] = w[r].d * static_cast<float>(static_cast<int8_t>(w[r].sc >> (8 * gi)));
      }
    return p;
  }
  // Group gi's activation quants are b[gi >> 1][gi & 1] (sub-block 2u + (gi >> 1), k 16 (gi & 1) + 4c..).
  static __device__ __forceinline__ void mma(const P& p, const uint32_t (&b)[2][2], const float4 (&ds)[2][2],
                                             float (&acc)[4]) {
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
      int c[4];
      mma_s8_k16(c, p.a[gi][0], p.a[gi][1], b[gi >> 1][gi & 1]);
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[k] += p.dsc[gi][k >> 1] * ds[gi >> 1][k & 1].x * mmq_i2f(c[k]);
    }
  }
};

// NT tokens (8, 16, 32); SW: two m-tiles (gate rows of seg 0, up rows of seg 1) and silu(gate) * up out.
template <DType T, int NT, bool SW>
__global__ void __launch_bounds__(kMmaThreads, 1) mmvq_mma_kernel(MmvqGroup g, ActQ a) {
  using K = MmaK<T>;
  constexpr int NB = NT / 8, MT = SW ? 2 : 1;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, gq = lane >> 2, c = lane & 3;
  int s = 0;
  if (!SW)
    while (s + 1 < g.n_seg && blockIdx.x >= g.blk_end[s]) ++s;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - (s ? g.blk_end[s - 1] : 0)) * 16;
  const uint8_t* wr[MT][2];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // rows past the end read row 0 (in bounds) and are not written
      const MmvqSeg& sg = g.seg[SW ? t : s];
      const int64_t row = row0 + gq + 8 * r;
      wr[t][r] = sg.w + static_cast<size_t>(row < sg.n_out ? row : 0) * sg.w_row_bytes;
    }
  const int n_units = static_cast<int>(g.n_in / kMmaUnit);
  typename K::W w[MT][2];
  const auto load_w = [&](typename K::W (&dst)[MT][2], int u) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) dst[t][r] = K::load(wr[t][r], u, c);
  };
  if (g.prefetch && warp < n_units) load_w(w, warp);
  pdl_enter();  // launched with launch_pdl (common.cuh)
  if (!g.prefetch && warp < n_units) load_w(w, warp);
  // Activation rows of the B fragments (token 8 nt + gq) and of the C columns (tokens 8 nt + 2c, + 1).
  const int last = static_cast<int>(g.n_tok) - 1;
  const int8_t* bq[NB];
  const float4* bd[NB][2];
#pragma unroll
  for (int nt = 0; nt < NB; ++nt) {
    bq[nt] = a.qs + static_cast<size_t>(min(8 * nt + gq, last)) * a.qs_stride + 4 * c;
#pragma unroll
    for (int e = 0; e < 2; ++e) bd[nt][e] = a.ds + static_cast<size_t>(min(8 * nt + 2 * c + e, last)) * a.ds_stride;
  }
  float acc[MT][NB][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[t][nt][k] = 0.0f;
  for (int u = warp; u < n_units; u += kMmaWarps) {
    typename K::P pw[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) pw[t] = K::prep(w[t], u);
    typename K::W wn[MT][2];
    if (u + kMmaWarps < n_units) load_w(wn, u + kMmaWarps);
#pragma unroll
    for (int nt = 0; nt < NB; ++nt) {
      uint32_t b[2][2];
      float4 ds[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // sub-block 2u + h of the token
        const int8_t* q = bq[nt] + kMmaUnit * u + 32 * h;
        b[h][0] = *reinterpret_cast<const uint32_t*>(q);
        b[h][1] = *reinterpret_cast<const uint32_t*>(q + 16);
#pragma unroll
        for (int e = 0; e < 2; ++e) ds[h][e] = bd[nt][e][2 * u + h];
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) K::mma(pw[t], b, ds, acc[t][nt]);
    }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) w[t][r] = wn[t][r];
  }
  // Across the warps: red[warp][16 * t + row][token].
  __shared__ float red[kMmaWarps][16 * MT][NT + 1];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int nt = 0; nt < NB; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) red[warp][16 * t + gq + 8 * (k >> 1)][8 * nt + 2 * c + (k & 1)] = acc[t][nt][k];
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * NT; i += kMmaThreads) {
    const int r = i / NT, tok = i % NT;
    const int64_t row = row0 + r;
    if (tok >= g.n_tok || row >= g.seg[SW ? 0 : s].n_out) continue;
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kMmaWarps; ++k) v += red[k][r][tok];
    if constexpr (SW) {
      float up = 0.0f;
#pragma unroll
      for (int k = 0; k < kMmaWarps; ++k) up += red[k][16 + r][tok];
      g.seg[0].y[tok * g.seg[0].y_stride + row] = v / (1.0f + expf(-v)) * up;
    } else {
      const MmvqSeg& sg = g.seg[s];
      float* y = sg.y + tok * sg.y_stride + row;
      *y = (sg.accumulate ? *y : 0.0f) + v + (sg.bias ? sg.bias[row] : 0.0f);
    }
  }
}

template <DType T, int NT, bool SW>
Status mmvq_mma_launch(MmvqGroup g, const ActQ& a, cudaStream_t s) {
  unsigned blocks = 0;
  for (int i = 0; i < (SW ? 1 : g.n_seg); ++i) {
    blocks += static_cast<unsigned>((g.seg[i].n_out + 15) / 16);
    g.blk_end[i] = blocks;
  }
  if (blocks == 0) return Status::ok();
  KILN_TRY(launch_pdl(mmvq_mma_kernel<T, NT, SW>, dim3(blocks), dim3(kMmaThreads), 0, s, g, a));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

// Tokens -> NT: 3..8 -> 8, 9..16 -> 16, 17..32 -> 32 (padding columns read the last token and are not written).
template <DType T, bool SW>
Status mmvq_mma_nc(const MmvqGroup& g, const ActQ& a, cudaStream_t s) {
  if (g.n_tok <= 8) return mmvq_mma_launch<T, 8, SW>(g, a, s);
  if (g.n_tok <= 16) return mmvq_mma_launch<T, 16, SW>(g, a, s);
  return mmvq_mma_launch<T, 32, SW>(g, a, s);
}

}  // namespace kiln::cuda

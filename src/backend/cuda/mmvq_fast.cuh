// Decode GEMV for the k-quants of the q4_k_m mix (Q4_K, Q6_K): the bandwidth path of mmvq (mmvq.cuh keeps the
// warp-per-row kernel for the other types).
//   entries: launch_mmvq (one matmul), launch_mmvq_group (q/k/v or gate/up of one input in one launch, and the
//   gate/up + SwiGLU fusion)  ->  mmvq_group_run<T> (instances/)  ->  mmvq_fast_kernel<T, NC, RR, SW>
// Layout: a 128-thread block owns RR weight rows (2 at 1 and 2 tokens, 4 at 4..16; SwiGLU: RR/2 gate rows and the
// same up rows) and all 128 threads split the K dimension: thread c of the row takes "chunks" c, c + 128, ...;
// a chunk is one 16-byte load of Q4_K quants (32 weights: 16 of sub-block 2j, 16 of 2j+1; 8 chunks per 256-value
// super-block, consecutive threads on consecutive 16 bytes) or, for Q6_K (2-byte aligned 210-byte blocks), 4+4+4
// bytes of ql/ql/qh (16 weights; 16 chunks per super-block). A chunk's weights are decoded once (FastK::prep) and
// its activations loaded once for all RR rows; partial sums are reduced by warp shuffles, then across the 4 warps
// in shared memory. At 3..32 tokens on sm_80+ mmvq_mma.cuh takes over (this kernel stays for KILN_CUDA_MMVQ_MMA=0
// and sm_75).
// Numerics: unchanged (q8_1 int8 activations, exact integer dp4a sums per 16 weights, scaled in f32:
// d_a * (d_w * sc) * sum(q_w q_a) - dmin * m * d_a * sum(q_a)); only the f32 summation order differs from the
// warp-per-row kernel.
// -Xptxas -v (sm_90, no spills, no stack; registers by NC,RR): Q4_K 1,1: 39  1,2: 62  1,4: 96  2,2: 72  4,4: 128
// 8,4: 148  16,4: 205 (the former 1-row instances: 4,1: 54  8,1: 58  16,1: 68); SwiGLU 1,2: 62  1,4: 96  2,4: 118
// 4,4: 130  8,4: 151  16,4: 184. Q6_K 1,1: 32  1,2: 40  1,4: 80  2,2: 56  4,4: 128  8,4: 128  16,4: 168; SwiGLU
// 1,2: 40  1,4: 63  2,4: 95  4,4: 96  8,4: 128  16,4: 164. Shared memory 64-1024 bytes. H200, 8B q4_k_m (ncu, one
// token): gate/up+SwiGLU 2.63 TB/s, down Q6_K 1.85 TB/s, 4096-row Q4_K products 1.54 TB/s (docs/BENCHMARKS.md).
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/mmvq_mma.cuh"
#include "backend/cuda/quant.cuh"

namespace kiln::cuda {

constexpr int kMmvqFastThreads = 128;

template <DType T> struct FastK;

template <> struct FastK<DType::Q4_K> {
  static constexpr int kCps = 8;  // chunks per super-block
  struct W {
    uint4 hdr, qs;
  };
  struct A {
    int4 a0, a1;
    float4 d0, d1;
  };
  static __device__ __forceinline__ W load(const uint8_t* sb, int u) {
    W w;
    w.hdr = __ldg(reinterpret_cast<const uint4*>(sb));
    w.qs = __ldg(reinterpret_cast<const uint4*>(sb + 16 + 16 * u));
    return w;
  }
  static __device__ __forceinline__ A load_act(const int8_t* qs, const float4* ds, int64_t sb, int u) {
    const int j = u >> 1, h = u & 1;
    const int8_t* q = qs + 256 * sb + 64 * j + 16 * h;
    A a;
    a.a0 = *reinterpret_cast<const int4*>(q);
    a.a1 = *reinterpret_cast<const int4*>(q + 32);
    a.d0 = ds[8 * sb + 2 * j];
    a.d1 = ds[8 * sb + 2 * j + 1];
    return a;
  }
  // The weight side of a chunk decoded once for all tokens: nibbles of sub-blocks 2j (q0) and 2j+1 (q1), d * sc,
  // dmin and the two mins.
  struct P {
    int q0[4], q1[4];
    float dsc0, dsc1, dmin, m0, m1;
  };
  static __device__ __forceinline__ P prep(const W& w, int u) {
    const int j = u >> 1;
    int sc0, m0, sc1, m1;
    kq_scale_min(2 * j, w.hdr.y, w.hdr.z, w.hdr.w, &sc0, &m0);
    kq_scale_min(2 * j + 1, w.hdr.y, w.hdr.z, w.hdr.w, &sc1, &m1);
    const float d = h2f(static_cast<uint16_t>(w.hdr.x));
    const uint32_t m = 0x0F0F0F0Fu, q[4] = {w.qs.x, w.qs.y, w.qs.z, w.qs.w};
    P p;
#pragma unroll
    for (int k = 0; k < 4; ++k) p.q0[k] = static_cast<int>(q[k] & m), p.q1[k] = static_cast<int>((q[k] >> 4) & m);
    p.dsc0 = d * static_cast<float>(sc0), p.dsc1 = d * static_cast<float>(sc1);
    p.dmin = h2f(static_cast<uint16_t>(w.hdr.x >> 16)), p.m0 = static_cast<float>(m0), p.m1 = static_cast<float>(m1);
    return p;
  }
  static __device__ __forceinline__ float dot(const P& w, const A& a, int u) {
    const int h = u & 1;
    int s0 = __dp4a(w.q0[0], a.a0.x, 0);
    s0 = __dp4a(w.q0[1], a.a0.y, s0);
    s0 = __dp4a(w.q0[2], a.a0.z, s0);
    s0 = __dp4a(w.q0[3], a.a0.w, s0);
    int s1 = __dp4a(w.q1[0], a.a1.x, 0);
    s1 = __dp4a(w.q1[1], a.a1.y, s1);
    s1 = __dp4a(w.q1[2], a.a1.z, s1);
    s1 = __dp4a(w.q1[3], a.a1.w, s1);
    const float S0 = h ? a.d0.z : a.d0.y, S1 = h ? a.d1.z : a.d1.y;
    return a.d0.x * w.dsc0 * static_cast<float>(s0) + a.d1.x * w.dsc1 * static_cast<float>(s1) -
           w.dmin * (w.m0 * S0 + w.m1 * S1);
  }
};

template <> struct FastK<DType::Q6_K> {
  static constexpr int kCps = 16;
  struct W {
    uint32_t qla, qlb, qh, sc;  // sc: the 4 int8 scales of the chunk's 4 groups
    float d;
  };
  struct A {
    int q[4];
    float d[4];
  };
  static __device__ __forceinline__ W load(const uint8_t* b, int u) {
    const int h = u >> 3, l0 = 4 * (u & 7);
    W w;
    w.qla = ld_u32_a2(b + 64 * h + l0);
    w.qlb = ld_u32_a2(b + 64 * h + 32 + l0);
    w.qh = ld_u32_a2(b + 128 + 32 * h + l0);
    const uint8_t* sp = b + 192 + 8 * h + (l0 >= 16);
    w.sc = static_cast<uint32_t>(sp[0]) | static_cast<uint32_t>(sp[2]) << 8 | static_cast<uint32_t>(sp[4]) << 16 |
           static_cast<uint32_t>(sp[6]) << 24;
    w.d = h2f(ld_u16(b + 208));
    return w;
  }
  static __device__ __forceinline__ A load_act(const int8_t* qs, const float4* ds, int64_t sb, int u) {
    const int h = u >> 3, l0 = 4 * (u & 7);
    const int8_t* q = qs + 256 * sb + 128 * h + l0;
    const float* d = reinterpret_cast<const float*>(ds + 8 * sb + 4 * h);
    A a;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      a.q[k] = *reinterpret_cast<const int*>(q + 32 * k);
      a.d[k] = d[4 * k];
    }
    return a;
  }
  // The weight side decoded once for all tokens: the 4 groups' signed 6-bit quants, their scales, d.
  struct P {
    int q[4];
    float sc[4], d;
  };
  static __device__ __forceinline__ P prep(const W& w, int) {
    const uint32_t m = 0x0F0F0F0Fu, m2 = 0x03030303u;
    P p;
    p.q[0] = static_cast<int>(__vsub4((w.qla & m) | ((w.qh & m2) << 4), 0x20202020u));
    p.q[1] = static_cast<int>(__vsub4((w.qlb & m) | (((w.qh >> 2) & m2) << 4), 0x20202020u));
    p.q[2] = static_cast<int>(__vsub4(((w.qla >> 4) & m) | (((w.qh >> 4) & m2) << 4), 0x20202020u));
    p.q[3] = static_cast<int>(__vsub4(((w.qlb >> 4) & m) | (((w.qh >> 6) & m2) << 4), 0x20202020u));
#pragma unroll
    for (int k = 0; k < 4; ++k) p.sc[k] = static_cast<float>(static_cast<int8_t>(w.sc >> (8 * k)));
    p.d = w.d;
    return p;
  }
  static __device__ __forceinline__ float dot(const P& w, const A& a, int) {
    return w.d * (a.d[0] * w.sc[0] * static_cast<float>(__dp4a(w.q[0], a.q[0], 0)) +
                  a.d[1] * w.sc[1] * static_cast<float>(__dp4a(w.q[1], a.q[1], 0)) +
                  a.d[2] * w.sc[2] * static_cast<float>(__dp4a(w.q[2], a.q[2], 0)) +
                  a.d[3] * w.sc[3] * static_cast<float>(__dp4a(w.q[3], a.q[3], 0)));
  }
};

template <DType T, int NC, int RR, bool SW>
__global__ void __launch_bounds__(kMmvqFastThreads) mmvq_fast_kernel(MmvqGroup g, ActQ a) {
  using K = FastK<T>;
  constexpr int RH = SW ? RR / 2 : RR, kW = kMmvqFastThreads / kWarp;
  static_assert(!SW || RR % 2 == 0, "SwiGLU pairs gate and up rows");
  int s = 0;
  if (!SW)
    while (s + 1 < g.n_seg && blockIdx.x >= g.blk_end[s]) ++s;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x - (s ? g.blk_end[s - 1] : 0)) * RH;
  const uint8_t* wr[RR];
#pragma unroll
  for (int i = 0; i < RR; ++i) {  // rows past the end read row 0 (in bounds) and are not written
    const MmvqSeg& sg = g.seg[SW ? (i < RH ? 0 : 1) : s];
    const int64_t r = row0 + (SW ? i % RH : i);
    wr[i] = sg.w + static_cast<size_t>(r < sg.n_out ? r : 0) * sg.w_row_bytes;
  }
  const int n_sb = static_cast<int>(g.n_in / 256), n_chunk = n_sb * K::kCps;
  float acc[RR][NC];
#pragma unroll
  for (int i = 0; i < RR; ++i)
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[i][c] = 0.0f;
  // Software pipeline over the thread's chunks: the weights of chunk ch + 128 are in flight while chunk ch is
  // dotted. The first chunk's weights are loaded BEFORE pdl_wait: weights are never written during a step, so
  // under programmatic dependent launch a block that becomes resident while the previous kernel drains already has
  // its first loads (at n_in 4096 all of its weight bytes: 128 chunks, one per thread) in flight. Activations (the
  // previous kernel's output) are read only after pdl_wait.
  const auto load_w = [&](typename K::W (&w)[RR], int ch) {
    const int sb = ch / K::kCps, u = ch % K::kCps;
#pragma unroll
    for (int i = 0; i < RR; ++i) w[i] = K::load(wr[i] + static_cast<size_t>(sb) * QTraits<T>::kBytes, u);
  };
  typename K::W w[RR];
  if (g.prefetch && threadIdx.x < n_chunk) load_w(w, threadIdx.x);
  pdl_enter();  // launched with launch_pdl (common.cuh)
  if (!g.prefetch && threadIdx.x < n_chunk) load_w(w, threadIdx.x);
  for (int ch = threadIdx.x; ch < n_chunk; ch += kMmvqFastThreads) {
    const int sb = ch / K::kCps, u = ch % K::kCps;
    typename K::P pw[RR];  // decoded once, used by every token
#pragma unroll
    for (int i = 0; i < RR; ++i) pw[i] = K::prep(w[i], u);
    typename K::W wn[RR];
    if (ch + kMmvqFastThreads < n_chunk) load_w(wn, ch + kMmvqFastThreads);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (NC > 1 && c >= g.n_tok) break;
      const typename K::A x = K::load_act(a.qs + c * a.qs_stride, a.ds + c * a.ds_stride, sb, u);
#pragma unroll
      for (int i = 0; i < RR; ++i) acc[i][c] += K::dot(pw[i], x, u);
    }
#pragma unroll
    for (int i = 0; i < RR; ++i) w[i] = wn[i];
  }
  __shared__ float red[kW][RR * NC];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < RR; ++i)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float v = warp_sum(acc[i][c]);
      if (lane == 0) red[warp][i * NC + c] = v;
    }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= RH * NC) return;
  const int i = t / NC, c = t % NC;
  const int64_t r = row0 + i;
  if (c >= g.n_tok || r >= g.seg[SW ? 0 : s].n_out) return;
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < kW; ++k) v += red[k][t];
  if constexpr (SW) {
    float u = 0.0f;
#pragma unroll
    for (int k = 0; k < kW; ++k) u += red[k][(i + RH) * NC + c];
    g.seg[0].y[c * g.seg[0].y_stride + r] = v / (1.0f + expf(-v)) * u;
  } else {
    const MmvqSeg& sg = g.seg[s];
    float* y = sg.y + c * sg.y_stride + r;
    *y = (sg.accumulate ? *y : 0.0f) + v + (sg.bias ? sg.bias[r] : 0.0f);
  }
}

template <DType T, int NC, bool SW, int RR>
Status mmvq_fast_launch(MmvqGroup g, const ActQ& a, cudaStream_t s) {
  constexpr int RH = SW ? RR / 2 : RR;
  unsigned blocks = 0;
  for (int i = 0; i < (SW ? 1 : g.n_seg); ++i) {
    blocks += static_cast<unsigned>((g.seg[i].n_out + RH - 1) / RH);
    g.blk_end[i] = blocks;
  }
  if (blocks == 0) return Status::ok();
  auto* const kernel = mmvq_fast_kernel<T, NC, RR, SW>;
  KILN_TRY(launch_pdl(kernel, dim3(blocks), dim3(kMmvqFastThreads), 0, s, g, a));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

// Rows per block (RR) by token count: 1 token: 2 (H200, llama3-8b q4_k_m tg128, 2 rounds each: RR 4 226.8/226.3,
// RR 2 228.6/228.4, RR 1 213.5/211.9 t/s; RR 2 at 56 registers (SwiGLU 64) keeps 8-9 blocks per SM resident
// against 6 at RR 4); 2 tokens: 2 (SwiGLU 4: a gate and an up row each twice); 4..16 tokens: 4 (SwiGLU 4 = 2 gate
// + 2 up rows: each activation load serves 4 rows; at 1 row per block the 8-token q/k/v product read 16 times its
// weight bytes of activations through L1 and ran at 0.48 TB/s).
template <DType T, bool SW>
Status mmvq_fast_nc(const MmvqGroup& g, const ActQ& a, cudaStream_t s) {
  if (g.n_tok <= 1) return mmvq_fast_launch<T, 1, SW, 2>(g, a, s);
  if (g.n_tok <= 2) return mmvq_fast_launch<T, 2, SW, SW ? 4 : 2>(g, a, s);
  if (g.n_tok <= 4) return mmvq_fast_launch<T, 4, SW, 4>(g, a, s);
  if (g.n_tok <= 8) return mmvq_fast_launch<T, 8, SW, 4>(g, a, s);
  return mmvq_fast_launch<T, 16, SW, 4>(g, a, s);
}

// 1..2 tokens: the dp4a GEMV above; 3..32 (mmvq_mma_on()): the tensor-core GEMV (mmvq_mma.cuh); else dp4a.
template <DType T>
Status mmvq_group_run(const MmvqGroup& g, const ActQ& a, cudaStream_t s) {
  if (g.n_tok > 2 && mmvq_mma_on())
    return g.swiglu ? mmvq_mma_nc<T, true>(g, a, s) : mmvq_mma_nc<T, false>(g, a, s);
  return g.swiglu ? mmvq_fast_nc<T, true>(g, a, s) : mmvq_fast_nc<T, false>(g, a, s);
}

extern template Status mmvq_group_run<DType::Q4_K>(const MmvqGroup&, const ActQ&, cudaStream_t);
extern template Status mmvq_group_run<DType::Q6_K>(const MmvqGroup&, const ActQ&, cudaStream_t);

}  // namespace kiln::cuda

// mmq_p_kernel: Q4_K / Q5_K on a cp.async pipeline of raw weight blocks (mmq.cuh: design notes, ledger).
#pragma once

#include "backend/cuda/mmq_common.cuh"

namespace kiln::cuda {

// ---- quantized weights, pipelined (Q4_K, Q5_K) -------------------------------------------------------------------
// mmq_p_kernel: the same function as mmq_q_kernel (one scale per 32, acc += (d_w * d_a) * isum + m_w * (ds.y + ds.z)
// with the same f32 operations per output) on a cp.async pipeline of RAW weight blocks: a stage is KS = 64 or 128 K
// elements (a quarter / half super-block), SL slots (SL - 1 stages in flight: the one computed and SL - 2 ahead
// of it), one __syncthreads per stage, no weights held in registers. Per stage and row the compact raw bytes (Q4_K:
// d/dmin/scales 16 B + the stage's KS/2 qs bytes; Q5_K: + the 32 qh bytes) are copied with 16-byte cp.async; the
// int8 A fragments are built from them with 4-byte smem loads and a shift/mask (no ldmatrix, no decoded copy); the
// (d, m) of each (row, sub-block) are decoded once per block one stage ahead into a small float2 table. Activations:
// ActQ qs (rows padded to KS + 16 bytes: conflict-free ldmatrix) and ds per stage by cp.async, as in mmq_q_kernel.
// Row pitches of 16 * (odd chunk count) bytes keep the A-word loads (8 rows x 4 words per warp) conflict-free.
template <DType T> struct MmqPRaw;
template <> struct MmqPRaw<DType::Q4_K> {
  static constexpr int kHdr = 1, kQsSrc = 16;  // compact row: d/dmin/scales (1 chunk), then the stage's qs bytes
};
template <> struct MmqPRaw<DType::Q5_K> {
  static constexpr int kHdr = 3, kQsSrc = 48;  // + qh (2 chunks), then the stage's qs bytes
};
template <DType T> constexpr bool mmq_p_supported() { return T == DType::Q4_K || T == DType::Q5_K; }

// KS: K elements per stage (64: a quarter super-block, or 128: a half), SL: stages in flight + 1.
template <DType T, int BM, int BN, int KS, int SL>
struct MmqPSmem {
  static constexpr int kChunks = MmqPRaw<T>::kHdr + KS / 32;  // odd: rows of 16*kChunks bytes, conflict-free
  static constexpr int kXPitch = KS + 16;
  uint8_t w[SL][BM][16 * kChunks];
  int8_t x[SL][BN][kXPitch];
  float4 xd[SL][BN][KS / 32];
  float2 dm[2][BM][KS / 32];  // (d, m) per row and sub-block of the stage
};

// Issue the copies of stage `st` (if it exists) into slot st % SL; always commits one group.
template <DType T, int NTH, int BM, int BN, int KS, int SL>
__device__ __forceinline__ void mmq_p_issue(MmqPSmem<T, BM, BN, KS, SL>& sm, const MatmulParams& p, const ActQ& a,
                                            int64_t r0, int64_t t0, int st, int n_stage) {
  using S = MmqPSmem<T, BM, BN, KS, SL>;
  using R = MmqPRaw<T>;
  constexpr int kParts = 256 / KS, kC = S::kChunks;
  if (st < n_stage) {
    const int slot = st % SL, tid = mmq_tid_opaque(), kb = st / kParts, part = st % kParts;
#pragma unroll
    for (int i = 0; i < (BM * kC + NTH - 1) / NTH; ++i) {
      const int idx = tid + NTH * i;
      if (BM * kC % NTH == 0 || idx < BM * kC) {
        const int r = idx / kC, c = idx % kC;
        const int src = c < R::kHdr ? 16 * c : R::kQsSrc + part * (KS / 2) + 16 * (c - R::kHdr);
        const int64_t row = r0 + r;
        const bool ok = row < p.n_out;
        mmq_cp16(&sm.w[slot][r][16 * c],
                 ok ? p.w + static_cast<size_t>(row) * p.w_row_bytes + static_cast<size_t>(kb) * QTraits<T>::kBytes + src
                    : p.w,
                 ok);
      }
    }
    constexpr int kXC = KS / 16, kD = KS / 32;
    static_assert(kXC * BN % NTH == 0);
#pragma unroll
    for (int i = 0; i < kXC * BN / NTH; ++i) {
      const int idx = tid + NTH * i, n = idx / kXC, c = idx % kXC;
      const int64_t t = t0 + n;
      const bool ok = t < a.n_tok;
      mmq_cp16(&sm.x[slot][n][16 * c], ok ? a.qs + t * a.qs_stride + static_cast<int64_t>(st) * KS + 16 * c : a.qs, ok);
    }
#pragma unroll
    for (int i = 0; i < (kD * BN + NTH - 1) / NTH; ++i) {  // the 16-token tile: fewer ds chunks than threads
      const int idx = tid + NTH * i, n = idx / kD, j = idx % kD;
      if (kD * BN % NTH != 0 && idx >= kD * BN) break;
      const int64_t t = t0 + n;
      const bool ok = t < a.n_tok;
      mmq_cp16(&sm.xd[slot][n][j], ok ? a.ds + t * a.ds_stride + kD * st + j : a.ds, ok);
    }
  }
  mmq_cp_commit();
}

// (d, m) of stage st's sub-blocks per row, from the raw header in smem (decode32's arithmetic exactly).
template <DType T, int NTH, int BM, int BN, int KS, int SL>
__device__ __forceinline__ void mmq_p_scales(MmqPSmem<T, BM, BN, KS, SL>& sm, int st) {
  constexpr int kD = KS / 32;
  const int slot = st % SL, part = st % (256 / KS);
  static_assert(kD * BM % NTH == 0);
#pragma unroll
  for (int i = 0; i < kD * BM / NTH; ++i) {
    const int idx = threadIdx.x + NTH * i, r = idx / kD, j = idx % kD;
    const uint4 hdr = mmq_lds_u128(&sm.w[slot][r][0]);
    int sc, mn;
    kq_scale_min(kD * part + j, hdr.y, hdr.z, hdr.w, &sc, &mn);
    const float dd = h2f(static_cast<uint16_t>(hdr.x)), dmin = h2f(static_cast<uint16_t>(hdr.x >> 16));
    sm.dm[st & 1][r][j] = make_float2(dd * static_cast<float>(sc), -(dmin * static_cast<float>(mn)));
  }
}

// A-fragment word (4 int8 of row r, bytes 4*wi.. of sub-block j of the stage; s: its index in the super-block)
// from the raw bytes.
template <DType T, int BM, int BN, int KS, int SL>
__device__ __forceinline__ uint32_t mmq_p_aword(const MmqPSmem<T, BM, BN, KS, SL>& sm, int slot, int r, int j, int wi,
                                               int s) {
  using R = MmqPRaw<T>;
  const uint32_t w = mmq_lds_u32(&sm.w[slot][r][16 * R::kHdr + 32 * (j >> 1) + 4 * wi]);
  uint32_t q = (w >> (4 * (j & 1))) & 0x0F0F0F0Fu;
  if constexpr (T == DType::Q5_K) {
    const uint32_t hb = mmq_lds_u32(&sm.w[slot][r][16 + 4 * wi]);
    q |= ((hb >> s) & 0x01010101u) << 4;
  }
  return q;
}

template <DType T, int MT, int NT, bool UNR, int BM, int BN, int KS, int SL>
__device__ __forceinline__ void mmq_p_sub(const MmqPSmem<T, BM, BN, KS, SL>& sm, int st, int j,
                                          float (&acc)[MT][NT][4], int wm, int wn, int lane) {
  const int g = lane >> 2, tig = lane & 3, slot = st % SL, db = st & 1;
  const int s = (KS / 32) * (st % (256 / KS)) + j;
  const int rb = wm * 16 * MT, nb = wn * 8 * NT;
  uint32_t A[MT][4];
  float dw[MT][2], mw[MT][2];  // [mt][row g / g+8]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r = rb + mt * 16 + g;
    A[mt][0] = mmq_p_aword<T>(sm, slot, r, j, tig, s);
    A[mt][1] = mmq_p_aword<T>(sm, slot, r + 8, j, tig, s);
    A[mt][2] = mmq_p_aword<T>(sm, slot, r, j, 4 + tig, s);
    A[mt][3] = mmq_p_aword<T>(sm, slot, r + 8, j, 4 + tig, s);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float2 v = mmq_lds64(&sm.dm[db][r + 8 * hh][j]);
      dw[mt][hh] = v.x, mw[mt][hh] = v.y;
    }
  }
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t B[4];
    mmq_ldsm4(B, &sm.x[slot][nb + np * 16 + (lane & 7) + 8 * (lane >> 4)][32 * j + 16 * ((lane >> 3) & 1)]);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int nt = 2 * np + u;
      float xa[2], xy[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float4 xs = mmq_lds128(&sm.xd[slot][nb + nt * 8 + 2 * tig + e][j]);
        xa[e] = xs.x, xy[e] = xs.y + xs.z;
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        int c[4];
        mma_s8_k32(c, A[mt], B[2 * u], B[2 * u + 1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int hh = i >> 1, e = i & 1;
          float v = fmaf(dw[mt][hh], xa[e] * mmq_i2f(c[i]), acc[mt][nt][i]);
          acc[mt][nt][i] = fmaf(mw[mt][hh], xy[e], v);
        }
      }
    }
  }
}

// UNR: the stage's sub-blocks unrolled by 2 (loads of the next interleaved with the MMAs and scaling of this one;
// unrolled by 4 spilled 28-48 bytes).
template <DType T, int MT, int NT, bool UNR, int BM, int BN, int KS, int SL>
__device__ __forceinline__ void mmq_p_compute(const MmqPSmem<T, BM, BN, KS, SL>& sm, int st, float (&acc)[MT][NT][4],
                                              int wm, int wn, int lane) {
  if constexpr (UNR) {
#pragma unroll 2
    for (int j = 0; j < KS / 32; ++j) mmq_p_sub<T, MT, NT, UNR>(sm, st, j, acc, wm, wn, lane);
  } else {
#pragma unroll 1
    for (int j = 0; j < KS / 32; ++j) mmq_p_sub<T, MT, NT, UNR>(sm, st, j, acc, wm, wn, lane);
  }
}

template <DType T, int MT, int NT, int WC, int KS, int SL, int MINB, bool UNR>
__global__ void __launch_bounds__(64 * WC, MINB) mmq_p_kernel(MatmulParams p, ActQ a) {
  pdl_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int NTH = 64 * WC, BM = 32 * MT, BN = 8 * WC * NT;
  static_assert(SL >= 3);
  using S = MmqPSmem<T, BM, BN, KS, SL>;
  extern __shared__ __align__(16) unsigned char mmq_smem[];
  S& sm = *reinterpret_cast<S*>(mmq_smem);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tig = lane & 3;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * BN, r0 = static_cast<int64_t>(blockIdx.y) * BM;
  const MmqKRange kr = mmq_k_range(p, static_cast<int>(p.n_in / KS));  // this block's stages (split-K)
  const int n_stage = kr.end;
  float acc[MT][NT][4];
  mmq_zero_acc(acc);
  // prologue: stages begin .. begin + SL - 2 in flight; the first stage's scales
#pragma unroll
  for (int s = 0; s < SL - 1; ++s) mmq_p_issue<T, NTH>(sm, p, a, r0, t0, kr.begin + s, n_stage);
  mmq_cp_wait_group<SL - 3>();
  __syncthreads();
  mmq_p_scales<T, NTH>(sm, kr.begin);
  for (int st = kr.begin; st < n_stage; ++st) {
    // stage st + 1 landed (this thread's copies; the barrier: everyone's), stage st's scales visible, and every
    // warp is done with stage st - 1 (its slot and scale buffer are free)
    mmq_cp_wait_group<SL - 3>();
    __syncthreads();
    mmq_p_issue<T, NTH>(sm, p, a, r0, t0, st + SL - 1, n_stage);
    if (st + 1 < n_stage) mmq_p_scales<T, NTH>(sm, st + 1);
    mmq_p_compute<T, MT, NT, UNR>(sm, st, acc, wm, wn, lane);
  }
  mmq_cp_wait_group<0>();
  mmq_finish<NTH>(p, acc, r0, t0, wm, wn, g, tig);
#endif
}

}  // namespace kiln::cuda

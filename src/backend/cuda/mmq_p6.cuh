// mmq_p6_kernel: Q6_K / Q8_0 (and Q4_K as PDS / PDL) on a cp.async pipeline of 16-byte-aligned spans around
// unaligned weight blocks (mmq.cuh: design notes, ledger).
#pragma once

#include "backend/cuda/mmq_common.cuh"

namespace kiln::cuda {

// ---- Q6_K, pipelined ---------------------------------------------------------------------------------------------
// mmq_p6_kernel: mmq_q_kernel's per-16 function for Q6_K (acc += d_a * (d_w0 * isum0 + d_w1 * isum1), the same f32
// operations) on a 3-slot cp.async pipeline of raw blocks, 128 K per stage. A Q6_K block is 210 bytes (2-byte
// aligned), so a stage copies per row the 16-byte-aligned spans around the half-block's ql (5 chunks), qh (3) and
// scales + d (2): 160 bytes, the data at the stage's uniform offset o = (210 * block) % 16. One stage ahead, each
// (row, sub-block) is decoded once (funnel-shifted 4-byte smem loads, decode32's arithmetic) into a double-buffered
// int8 tile (144-byte rows: conflict-free ldmatrix) and d per 16; the MMAs read it as mmq_q_kernel does. One
// __syncthreads per stage.
constexpr int kMmqP6Slots = 3, kMmqP6Raw = 160;
template <int BM, int BN>
struct MmqP6Smem {
  uint8_t w[kMmqP6Slots][BM][kMmqP6Raw];
  int8_t x[kMmqP6Slots][BN][kMmqPXPitch];
  float4 xd[kMmqP6Slots][BN][kMmqPK / 32];
  int8_t q[2][BM][kMmqPXPitch];  // decoded int8, 128 K + 16 bytes of padding
  float d[2][BM][kMmqPK / 16];   // d per 16 elements
};

// Activations of stage st (128 K: ActQ qs and the 4 ds of each token) into x / xd (one slot's arrays).
template <int NTH, int BN>
__device__ __forceinline__ void mmq_p_issue_x(int8_t (&x)[BN][kMmqPXPitch], float4 (&xd)[BN][kMmqPK / 32],
                                              const ActQ& a, int64_t t0, int st) {
  const int tid = mmq_tid_opaque();
  static_assert(8 * BN % NTH == 0 && 4 * BN % NTH == 0);
#pragma unroll
  for (int i = 0; i < 8 * BN / NTH; ++i) {
    const int idx = tid + NTH * i, n = idx / 8, c = idx % 8;
    const int64_t t = t0 + n;
    const bool ok = t < a.n_tok;
    mmq_cp16(&x[n][16 * c], ok ? a.qs + t * a.qs_stride + static_cast<int64_t>(st) * kMmqPK + 16 * c : a.qs, ok);
  }
#pragma unroll
  for (int i = 0; i < 4 * BN / NTH; ++i) {
    const int idx = tid + NTH * i, n = idx / 4, j = idx % 4;
    const int64_t t = t0 + n;
    const bool ok = t < a.n_tok;
    mmq_cp16(&xd[n][j], ok ? a.ds + t * a.ds_stride + 4 * st + j : a.ds, ok);
  }
}

// Byte offset in the row of stage st's first block (Q6_K: the half-block's block; Q8_0: 4 blocks of 34 bytes).
template <DType T> __device__ __forceinline__ int mmq_pd_boff(int st) {
  return T == DType::Q6_K   ? (st >> 1) * QTraits<DType::Q6_K>::kBytes
         : T == DType::Q4_K ? (st >> 1) * QTraits<DType::Q4_K>::kBytes
                            : st * 4 * QTraits<DType::Q8_0>::kBytes;
}
template <DType T, int NTH, int BM, int BN>
__device__ __forceinline__ void mmq_p6_issue(MmqP6Smem<BM, BN>& sm, const MatmulParams& p, const ActQ& a,
                                             int64_t r0, int64_t t0, int st, int n_stage) {
  if (st < n_stage) {
    // Q6_K: ql (5 chunks), qh (3), scales + d (2) of the half-block; Q8_0: the 136 bytes of 4 blocks (9 chunks);
    // Q4_K: the header and the half-block's 64 qs bytes (5 chunks, 16-byte aligned)
    constexpr int kC = T == DType::Q6_K ? kMmqP6Raw / 16 : T == DType::Q4_K ? 5 : 9;
    const int slot = st % kMmqP6Slots, tid = mmq_tid_opaque(), h = st & 1;
    const int boff = mmq_pd_boff<T>(st), b0 = boff & ~15;
#pragma unroll
    for (int i = 0; i < (BM * kC + NTH - 1) / NTH; ++i) {
      const int idx = tid + NTH * i;
      if (BM * kC % NTH == 0 || idx < BM * kC) {
        const int r = idx / kC, c = idx % kC;
        const int src = T == DType::Q8_0   ? 16 * c
                        : T == DType::Q4_K ? (c == 0 ? 0 : 16 + 64 * h + 16 * (c - 1))
                        : c < 5            ? 64 * h + 16 * c
                        : c < 8          ? 128 + 32 * h + 16 * (c - 5)
                                         : 192 + 16 * (c - 8);
        const int64_t row = r0 + r;
        const bool ok = row < p.n_out;
        mmq_cp16(&sm.w[slot][r][16 * c], ok ? p.w + static_cast<size_t>(row) * p.w_row_bytes + b0 + src : p.w, ok);
      }
    }
    mmq_p_issue_x<NTH, BN>(sm.x[slot], sm.xd[slot], a, t0, st);
  }
  mmq_cp_commit();
}

// 8 words of 4 bytes from smem byte offset `off` of `base` (2-byte aligned: funnel shifts of aligned words).
__device__ __forceinline__ void mmq_lds_words8(uint32_t (&v)[8], const uint8_t* base, int off) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(base + (off & ~3));
  const int sh = 8 * (off & 3);
  uint32_t a[9];
#pragma unroll
  for (int i = 0; i < 9; ++i) a[i] = w[i];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __funnelshift_r(a[i], a[i + 1], sh);
}

template <DType T, int NTH, int BM, int BN>
__device__ __forceinline__ void mmq_p6_decode(MmqP6Smem<BM, BN>& sm, int st) {
  const int slot = st % kMmqP6Slots, h = st & 1, buf = st & 1;
  const int o = mmq_pd_boff<T>(st) & 15;
  static_assert(4 * BM % NTH == 0);
#pragma unroll 1
  for (int it = 0; it < 4 * BM / NTH; ++it) {
    const int idx = threadIdx.x + NTH * it, r = idx / 4, j = idx % 4;
    const uint8_t* raw = &sm.w[slot][r][0];
    if constexpr (T == DType::Q4_K) {  // nibbles of the half's qs, (d, m) as decode32: d[2j], m[2j + 1]
      const uint4 hdr = mmq_lds_u128(raw);
      int q[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        q[i] = static_cast<int>((mmq_lds_u32(raw + 16 + 32 * (j >> 1) + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu);
      int4* dst = reinterpret_cast<int4*>(&sm.q[buf][r][32 * j]);
      dst[0] = make_int4(q[0], q[1], q[2], q[3]);
      dst[1] = make_int4(q[4], q[5], q[6], q[7]);
      int sc, mn;
      kq_scale_min(4 * h + j, hdr.y, hdr.z, hdr.w, &sc, &mn);
      const float dd = h2f(static_cast<uint16_t>(hdr.x)), dmin = h2f(static_cast<uint16_t>(hdr.x >> 16));
      *reinterpret_cast<float2*>(&sm.d[buf][r][2 * j]) =
          make_float2(dd * static_cast<float>(sc), -(dmin * static_cast<float>(mn)));
    } else if constexpr (T == DType::Q8_0) {  // block j of the stage at o + 34 j: d (f16), then 32 int8
      uint32_t q[8];
      mmq_lds_words8(q, raw, o + 34 * j + 2);
      int4* dst = reinterpret_cast<int4*>(&sm.q[buf][r][32 * j]);
      dst[0] = make_int4(q[0], q[1], q[2], q[3]);
      dst[1] = make_int4(q[4], q[5], q[6], q[7]);
      sm.d[buf][r][2 * j] = h2f(*reinterpret_cast<const uint16_t*>(raw + o + 34 * j));
    } else {
      uint32_t ql[8], qh[8];
      mmq_lds_words8(ql, raw, o + 32 * (j & 1));
      mmq_lds_words8(qh, raw, 80 + o);
      const int lsh = 4 * (j >> 1);
      int q[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t lo = (ql[i] >> lsh) & 0x0F0F0F0Fu;
        const uint32_t hi = ((qh[i] >> (2 * j)) & 0x03030303u) << 4;
        q[i] = static_cast<int>(__vsub4(lo | hi, 0x20202020u));
      }
      int4* dst = reinterpret_cast<int4*>(&sm.q[buf][r][32 * j]);
      dst[0] = make_int4(q[0], q[1], q[2], q[3]);
      dst[1] = make_int4(q[4], q[5], q[6], q[7]);
      const float dd = h2f(*reinterpret_cast<const uint16_t*>(raw + 128 + o + 16));
      const int8_t* sc = reinterpret_cast<const int8_t*>(raw + 128 + o + 8 * h + 2 * j);
      *reinterpret_cast<float2*>(&sm.d[buf][r][2 * j]) =
          make_float2(dd * static_cast<float>(sc[0]), dd * static_cast<float>(sc[1]));
    }
  }
}

template <DType T, int MT, int NT, int BM, int BN>
__device__ __forceinline__ void mmq_p6_compute(const MmqP6Smem<BM, BN>& sm, int st, float (&acc)[MT][NT][4], int wm,
                                               int wn, int lane) {
  const int g = lane >> 2, tig = lane & 3, slot = st % kMmqP6Slots, buf = st & 1;
  const int rb = wm * 16 * MT, nb = wn * 8 * NT;
#pragma unroll 1
  for (int j = 0; j < kMmqPK / 32; ++j) {
    // the B fragments and activation scales of the sub-block first, then one m-tile at a time (A and its scales)
    uint32_t B[NT / 2][4];
    float xa[NT][2], xy[NT][2];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np)
      mmq_ldsm4(B[np], &sm.x[slot][nb + np * 16 + (lane & 7) + 8 * (lane >> 4)][32 * j + 16 * ((lane >> 3) & 1)]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if constexpr (T == DType::Q4_K) {
          const float4 xs = mmq_lds128(&sm.xd[slot][nb + nt * 8 + 2 * tig + e][j]);
          xa[nt][e] = xs.x, xy[nt][e] = xs.y + xs.z;
        } else {
          xa[nt][e] = mmq_lds32(&sm.xd[slot][nb + nt * 8 + 2 * tig + e][j]);
          xy[nt][e] = 0.0f;
        }
      }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      uint32_t A[4];
      float dw[2][2];  // [row g / g+8][half]
      mmq_ldsm4(A, &sm.q[buf][rb + mt * 16 + (lane & 15)][32 * j + 16 * (lane >> 4)]);
      if constexpr (T == DType::Q8_0 || T == DType::Q4_K) {
        // one scale per 32: acc += d_w * (d_a * isum) [+ m_w * (ds.y + ds.z)], as mmq_q_compute
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          if constexpr (T == DType::Q4_K) {
            const float2 dm = mmq_lds64(&sm.d[buf][rb + mt * 16 + g + 8 * hh][2 * j]);
            dw[hh][0] = dm.x, dw[hh][1] = dm.y;
          } else {
            dw[hh][0] = mmq_lds32(&sm.d[buf][rb + mt * 16 + g + 8 * hh][2 * j]);
          }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          int c[4];
          mma_s8_k32(c, A, B[nt / 2][2 * (nt & 1)], B[nt / 2][2 * (nt & 1) + 1]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int hh = i >> 1, e = i & 1;
            const float v = fmaf(dw[hh][0], xa[nt][e] * mmq_i2f(c[i]), acc[mt][nt][i]);
            if constexpr (T == DType::Q4_K) acc[mt][nt][i] = fmaf(dw[hh][1], xy[nt][e], v);
            else acc[mt][nt][i] = v;
          }
        }
      } else {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float2 dd = mmq_lds64(&sm.d[buf][rb + mt * 16 + g + 8 * hh][2 * j]);
          dw[hh][0] = dd.x, dw[hh][1] = dd.y;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          int c0[4], c1[4];
          mma_s8_k16(c0, A[0], A[1], B[nt / 2][2 * (nt & 1)]);
          mma_s8_k16(c1, A[2], A[3], B[nt / 2][2 * (nt & 1) + 1]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int hh = i >> 1, e = i & 1;
            const float v = dw[hh][0] * mmq_i2f(c0[i]) + dw[hh][1] * mmq_i2f(c1[i]);
            acc[mt][nt][i] = fmaf(xa[nt][e], v, acc[mt][nt][i]);
          }
        }
      }
    }
  }
}

template <DType T, int MT, int NT, int WC>
__global__ void __launch_bounds__(64 * WC, WC == 4 ? 1 : 2) mmq_p6_kernel(MatmulParams p, ActQ a) {
  pdl_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int NTH = 64 * WC, BM = 32 * MT, BN = 8 * WC * NT;
  extern __shared__ __align__(16) unsigned char mmq_smem[];
  MmqP6Smem<BM, BN>& sm = *reinterpret_cast<MmqP6Smem<BM, BN>*>(mmq_smem);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tig = lane & 3;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * BN, r0 = static_cast<int64_t>(blockIdx.y) * BM;
  const MmqKRange kr = mmq_k_range(p, static_cast<int>(p.n_in / kMmqPK));  // this block's stages (split-K)
  const int n_stage = kr.end;
  float acc[MT][NT][4];
  mmq_zero_acc(acc);
  mmq_p6_issue<T, NTH>(sm, p, a, r0, t0, kr.begin, n_stage);
  mmq_p6_issue<T, NTH>(sm, p, a, r0, t0, kr.begin + 1, n_stage);
  mmq_cp_wait_group<1>();
  __syncthreads();
  mmq_p6_decode<T, NTH>(sm, kr.begin);
  for (int st = kr.begin; st < n_stage; ++st) {
    // stage st + 1 landed, stage st decoded (visible after the barrier), every warp done with stage st - 1
    mmq_cp_wait_group<0>();
    __syncthreads();
    mmq_p6_issue<T, NTH>(sm, p, a, r0, t0, st + 2, n_stage);
    if (st + 1 < n_stage) mmq_p6_decode<T, NTH>(sm, st + 1);
    mmq_p6_compute<T, MT, NT>(sm, st, acc, wm, wn, lane);
  }
  mmq_finish<NTH>(p, acc, r0, t0, wm, wn, g, tig);
#endif
}

}  // namespace kiln::cuda

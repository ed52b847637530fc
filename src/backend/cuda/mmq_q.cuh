// mmq_q_kernel: quantized weights decoded per stage into int8 shared memory (mmq.cuh: design notes, ledger).
#pragma once

#include "backend/cuda/mmq_common.cuh"

namespace kiln::cuda {

// ---- quantized weights -----------------------------------------------------------------------------------------
// Tile configurations (warps as 2 (rows) x WC (tokens); warp tile 16*MT rows x 8*NT tokens). The limiting resource
// of every one is registers (ledger at the top); the kernel is bound by load latency at 8-16 warps per SM (ncu:
// above), not by the MMAs, so the bigger tiles win only 5-40% and only where their grid still fills the GPU:
//   kMmqTileS  WC 2 MT 2 NT 4:  64 rows x  64 tokens, 128 threads (n_tok < 128, small grids, Q4_K/Q5_K gate/up)
//   kMmqTileN  WC 2 MT 2 NT 8:  64 rows x 128 tokens, 128 threads (the 32-element types: decode reused 128 times)
//   kMmqTileM  WC 2 MT 4 NT 4: 128 rows x  64 tokens, 128 threads (Q4_K/Q5_K, 1-4 waves)
//   kMmqTileL  WC 4 MT 4 NT 4: 128 rows x 128 tokens, 256 threads (Q3_K/Q6_K)
// mmq_pick_tile (mmq.cu) chooses per call (the measured table is there); the per-16 types have only S and L.
// Tiles 5-14 are the pipelined kernels' configurations (the table at mmq_run_pipelined; the rule, with the measured
// figures, at mmq_pick_tile in mmq.cu); where one cannot run (alignment, n_in % 128, the device's shared memory)
// mmq_fallback_tile picks mmq_q_kernel's tile (or, forced, its twin).
enum MmqTile : int {
  kMmqTileS = 1, kMmqTileN = 2, kMmqTileM = 3, kMmqTileL = 4, kMmqTilePS = 5, kMmqTilePM = 6, kMmqTilePL = 7,
  kMmqTileP2S = 8, kMmqTileP2M = 9, kMmqTilePUM = 10, kMmqTilePDS = 11, kMmqTilePDL = 12, kMmqTileP16 = 13,
  kMmqTileP32 = 14
};
int mmq_pick_tile(const MatmulParams& p);
int mmq_fallback_tile(const MatmulParams& p, int tile);  // for a pipelined tile that cannot run (mmq.cu)
size_t mmq_smem_optin();  // the current device's opt-in shared memory per block (cached per device)
void mmq_set_tile_override(int tile);  // 0: mmq_pick_tile's rule; else that MmqTile (tests, benchmarks)

// Blocks per SM the register budget is set for (__launch_bounds__ min blocks), per tile: 128 x 128 (8 warps): 1
// (255 registers); 64 x 128 / 128 x 64: 2 (255); 64 x 64: 4 (128 registers) where ptxas fits that without spills
// on every arch (Q4_0 Q5_0 Q8_0 Q4_K Q5_K), else 3 (168: Q4_1/Q5_1 spill 4 bytes at 128, Q2_K/Q3_K/Q6_K 8-72).
template <DType T, int MT, int NT, int WC> constexpr int mmq_q_min_blocks() {
  if constexpr (WC == 4) return 1;
  else if constexpr (MT * NT > 8) return 2;
  else if constexpr (T == DType::Q4_0 || T == DType::Q5_0 || T == DType::Q8_0 || T == DType::Q4_K || T == DType::Q5_K)
    return 4;
  else return 3;
}

template <int BM, int BN>
struct MmqQSmem {
  int8_t w[2][BM][kMmqPitch];
  int8_t x[2][BN][kMmqPitch];
  float wd[2][BM][4];  // d per (row, 16-half of the stage)
  float wm[2][BM][4];  // m (offset types only)
  float4 xd[2][BN][2];  // the ActQ ds of the stage's two sub-blocks
};

// One stage's weights decoded into registers (BM rows x 2 sub-blocks = BM / 64 decodes per thread): fetched (global
// loads + decode32) before the current stage's MMAs, stored to smem after them, so the load latency overlaps.
template <int BM, int NTH>
struct MmqWRegs {
  static constexpr int kN = 2 * BM / NTH;
  static_assert(kN >= 1 && 2 * BM % NTH == 0);
  int q[kN][8];
  float d[kN][2], m[kN][2];
};

template <DType T, int BM, int NTH>
__device__ __forceinline__ void mmq_q_fetch_w(MmqWRegs<BM, NTH>& wr, const MatmulParams& p, int64_t r0, int stage,
                                              int n_sub) {
  constexpr int kSubs = QTraits<T>::kElems / 32, kBytes = QTraits<T>::kBytes;
  const int sb0 = stage * (kMmqBKQ / 32);
#pragma unroll
  for (int i = 0; i < MmqWRegs<BM, NTH>::kN; ++i) {
    const int idx = threadIdx.x + NTH * i, r = idx / 2, j = idx % 2, s = sb0 + j;
    const int64_t row = r0 + r;
#pragma unroll
    for (int k = 0; k < 8; ++k) wr.q[i][k] = 0;
    wr.d[i][0] = wr.d[i][1] = wr.m[i][0] = wr.m[i][1] = 0.0f;
    if (row < p.n_out && s < n_sub)
      decode32<T>(p.w + static_cast<size_t>(row) * p.w_row_bytes + static_cast<size_t>(s / kSubs) * kBytes, s % kSubs,
                  wr.q[i], wr.d[i], wr.m[i]);
  }
}
template <DType T, int BM, int BN, int NTH>
__device__ __forceinline__ void mmq_q_put_w(MmqQSmem<BM, BN>& sm, int buf, const MmqWRegs<BM, NTH>& wr) {
#pragma unroll
  for (int i = 0; i < MmqWRegs<BM, NTH>::kN; ++i) {
    const int idx = threadIdx.x + NTH * i, r = idx / 2, j = idx % 2;
    int4* dst = reinterpret_cast<int4*>(&sm.w[buf][r][32 * j]);
    dst[0] = make_int4(wr.q[i][0], wr.q[i][1], wr.q[i][2], wr.q[i][3]);
    dst[1] = make_int4(wr.q[i][4], wr.q[i][5], wr.q[i][6], wr.q[i][7]);
    *reinterpret_cast<float2*>(&sm.wd[buf][r][2 * j]) = make_float2(wr.d[i][0], wr.d[i][1]);
    if constexpr (mmq_has_m<T>())
      *reinterpret_cast<float2*>(&sm.wm[buf][r][2 * j]) = make_float2(wr.m[i][0], wr.m[i][1]);
  }
}
// Activations of a stage: BN tokens x 4 chunks of 16 bytes (BN / 32 per thread), ds: BN tokens x 2 float4.
template <int NTH, int BM, int BN>
__device__ __forceinline__ void mmq_q_load_x(MmqQSmem<BM, BN>& sm, int buf, const ActQ& a, int64_t t0, int stage,
                                             int n_sub) {
  const int tid = threadIdx.x;
  const int sb0 = stage * (kMmqBKQ / 32);
  static_assert(4 * BN % NTH == 0 && 2 * BN % NTH == 0);
#pragma unroll
  for (int i = 0; i < 4 * BN / NTH; ++i) {
    const int idx = tid + NTH * i, n = idx / 4, c = idx % 4;
    const int64_t t = t0 + n;
    const int64_t kk = static_cast<int64_t>(sb0) * 32 + 16 * c;
    const bool ok = t < a.n_tok && kk < a.n_in;
    mmq_cp16(&sm.x[buf][n][16 * c], ok ? a.qs + t * a.qs_stride + kk : a.qs, ok);
  }
#pragma unroll
  for (int i = 0; i < 2 * BN / NTH; ++i) {
    const int idx = tid + NTH * i, n = idx / 2, j = idx % 2;
    const int64_t t = t0 + n;
    const bool ok = t < a.n_tok && sb0 + j < n_sub;
    mmq_cp16(&sm.xd[buf][n][j], ok ? a.ds + t * a.ds_stride + sb0 + j : a.ds, ok);
  }
}

// Per output and 32-element sub-block (f32; the same function as before, FMAs contracted differently):
//   one scale per 32:  acc += (d_w * d_a) * isum                  [+ m_w * (ds.y + ds.z): m_w is one per 32 here]
//   per-16 scales:     acc += d_a * (d_w0 * isum0 + d_w1 * isum1) [+ m_w0 * ds.y + m_w1 * ds.z for Q2_K]
template <DType T, int MT, int NT, int BM, int BN>
__device__ __forceinline__ void mmq_q_compute(const MmqQSmem<BM, BN>& sm, int buf, float (&acc)[MT][NT][4], int wm,
                                              int wn, int lane, int subs_left) {
  const int g = lane >> 2, tig = lane & 3;
  const int rb = wm * 16 * MT, nb = wn * 8 * NT;
#pragma unroll 1
  for (int j = 0; j < kMmqBKQ / 32; ++j) {
    if (j >= subs_left) break;  // n_in % 64 == 32: the stage's second sub-block is past the end
    uint32_t A[MT][4];
    float dw[MT][2][2], mw[MT][2][2];  // [mt][row g / g+8][half]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mmq_ldsm4(A[mt], &sm.w[buf][rb + mt * 16 + (lane & 15)][32 * j + 16 * (lane >> 4)]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = rb + mt * 16 + g + 8 * h;
        if constexpr (mmq_half16<T>()) {  // two scales (and for Q2_K offsets) per sub-block
          const float2 dd = mmq_lds64(&sm.wd[buf][r][2 * j]);
          dw[mt][h][0] = dd.x, dw[mt][h][1] = dd.y;
          if constexpr (mmq_has_m<T>()) {
            const float2 mm = mmq_lds64(&sm.wm[buf][r][2 * j]);
            mw[mt][h][0] = mm.x, mw[mt][h][1] = mm.y;
          }
        } else {  // one per sub-block (decode32 writes d[0] == d[1], m[0] == m[1])
          dw[mt][h][0] = dw[mt][h][1] = mmq_lds32(&sm.wd[buf][r][2 * j]);
          if constexpr (mmq_has_m<T>()) mw[mt][h][0] = mw[mt][h][1] = mmq_lds32(&sm.wm[buf][r][2 * j]);
        }
      }
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t B[4];  // {b0, b1} of n-tile 2*np, then of 2*np + 1
      mmq_ldsm4(B, &sm.x[buf][nb + np * 16 + (lane & 7) + 8 * (lane >> 4)][32 * j + 16 * ((lane >> 3) & 1)]);
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int nt = 2 * np + u;
        float xa[2], xy[2], xz[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float4 xs = mmq_lds128(&sm.xd[buf][nb + nt * 8 + 2 * tig + e][j]);
          xa[e] = xs.x;
          if constexpr (T == DType::Q2_K) xy[e] = xs.y, xz[e] = xs.z;
          else xy[e] = xs.y + xs.z, xz[e] = 0.0f;
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (mmq_half16<T>()) {
            int c0[4], c1[4];
            mma_s8_k16(c0, A[mt][0], A[mt][1], B[2 * u]);
            mma_s8_k16(c1, A[mt][2], A[mt][3], B[2 * u + 1]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1, e = i & 1;
              const float v = dw[mt][h][0] * mmq_i2f(c0[i]) + dw[mt][h][1] * mmq_i2f(c1[i]);
              float a = fmaf(xa[e], v, acc[mt][nt][i]);
              if constexpr (mmq_has_m<T>()) a = fmaf(mw[mt][h][0], xy[e], fmaf(mw[mt][h][1], xz[e], a));
              acc[mt][nt][i] = a;
            }
          } else {
            int c[4];
            mma_s8_k32(c, A[mt], B[2 * u], B[2 * u + 1]);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1, e = i & 1;
              float a = fmaf(dw[mt][h][0], xa[e] * mmq_i2f(c[i]), acc[mt][nt][i]);
              if constexpr (mmq_has_m<T>()) a = fmaf(mw[mt][h][0], xy[e], a);
              acc[mt][nt][i] = a;
            }
          }
        }
      }
    }
  }
}

// One block's tile: weight rows from blockIdx.y, tokens [t0, t0 + BN) of p / a.
template <DType T, int MT, int NT, int WC>
__device__ __forceinline__ void mmq_q_block(const MatmulParams& p, const ActQ& a, const int64_t t0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int NTH = 64 * WC, BM = 32 * MT, BN = 8 * WC * NT;
  // decoded weights held in registers across the MMAs (mmq_q_fetch_w) on the big tiles; stored right away on 64 x 64
  // (it keeps 4 blocks / 128 registers there: the first measurement with prefetch at 3 blocks was 10-30% slower)
  // and for the per-16 types on 128 x 128 (the ~10 registers would spill)
  constexpr bool kPrefetch = !(mmq_half16<T>() && WC == 4) && !(MT * NT <= 8);
  extern __shared__ __align__(16) unsigned char mmq_smem[];
  MmqQSmem<BM, BN>& sm = *reinterpret_cast<MmqQSmem<BM, BN>*>(mmq_smem);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tig = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int n_sub = static_cast<int>(p.n_in / 32);
  const MmqKRange kr = mmq_k_range(p, (n_sub + kMmqBKQ / 32 - 1) / (kMmqBKQ / 32));  // split-K
  const int n_stage = kr.end;
  float acc[MT][NT][4];
  mmq_zero_acc(acc);
  MmqWRegs<BM, NTH> wr;
  mmq_q_load_x<NTH>(sm, 0, a, t0, kr.begin, n_sub);
  mmq_q_fetch_w<T>(wr, p, r0, kr.begin, n_sub);
  mmq_q_put_w<T>(sm, 0, wr);
  mmq_cp_wait();
  __syncthreads();
  for (int st = kr.begin; st < n_stage; ++st) {
    const int buf = (st - kr.begin) & 1;
    const bool more = st + 1 < n_stage;
    if (more) {
      mmq_q_load_x<NTH>(sm, buf ^ 1, a, t0, st + 1, n_sub);
      mmq_q_fetch_w<T>(wr, p, r0, st + 1, n_sub);
      if constexpr (!kPrefetch) mmq_q_put_w<T>(sm, buf ^ 1, wr);
    }
    mmq_q_compute<T, MT, NT>(sm, buf, acc, wm, wn, lane, n_sub - st * (kMmqBKQ / 32));
    if constexpr (kPrefetch)
      if (more) mmq_q_put_w<T>(sm, buf ^ 1, wr);
    mmq_cp_wait();
    __syncthreads();
  }
  mmq_finish<NTH>(p, acc, r0, t0, wm, wn, g, tig);
#endif
}

template <DType T, int MT, int NT, int WC>
__global__ void __launch_bounds__(64 * WC, mmq_q_min_blocks<T, MT, NT, WC>()) mmq_q_kernel(MatmulParams p, ActQ a) {
  pdl_enter();
  mmq_q_block<T, MT, NT, WC>(p, a, static_cast<int64_t>(blockIdx.x) * (8 * WC * NT));
}
// A grouped launch (mmq_group_enter), 64 x 64 tiles.
template <DType T>
__global__ void __launch_bounds__(128, mmq_q_min_blocks<T, 2, 4, 2>()) mmq_q_group_kernel(MatmulParams p, ActQ a,
                                                                                         MatmulGroup grp) {
  pdl_enter();
  int64_t t0 = 0;
  if (!mmq_group_enter<64>(grp, p, t0, &a)) return;
  mmq_q_block<T, 2, 4, 2>(p, a, t0);
}

}  // namespace kiln::cuda

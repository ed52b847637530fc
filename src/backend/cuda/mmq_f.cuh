// mmq_fp_kernel and mmq_f_kernel: F16 / BF16 weights, activations rounded to the weight type, f32 accumulation
// (mmq.cuh: design notes, ledger).
#pragma once

#include "backend/cuda/mmq_common.cuh"

namespace kiln::cuda {

// ---- F16 / BF16 weights, pipelined -------------------------------------------------------------------------------
// mmq_fp_kernel: mmq_f_kernel's function (x rounded to nearest f16 / bf16, mma m16n8k16, f32 accumulation in the
// same k order) on a 4-slot cp.async pipeline: 32 K per stage, weights (f16 rows, 80-byte pitch, ldmatrix A) and the
// f32 activations (160-byte pitch) both copied raw; B fragments are 8-byte smem loads converted with cvt.rn.f16x2 /
// bf16x2 (the same rounding as f2h / f2bf). One __syncthreads per stage, nothing held in registers across it.
constexpr int kMmqFPWPitch = 40, kMmqFPXPitch = 40;  // pitches in elements (80 B / 160 B)
template <int BM, int BN, int SL>
struct MmqFPSmem {
  uint16_t w[SL][BM][kMmqFPWPitch];
  float x[SL][BN][kMmqFPXPitch];
};

template <int NTH, int BM, int BN, int SL>
__device__ __forceinline__ void mmq_fp_issue(MmqFPSmem<BM, BN, SL>& sm, const MatmulParams& p, int64_t r0, int64_t t0,
                                             int st, int n_stage) {
  if (st < n_stage) {
    const int slot = st % SL, tid = mmq_tid_opaque();
    static_assert(4 * BM % NTH == 0 && 8 * BN % NTH == 0);
#pragma unroll
    for (int i = 0; i < 4 * BM / NTH; ++i) {
      const int idx = tid + NTH * i, r = idx / 4, c = idx % 4;
      const int64_t row = r0 + r, kk = static_cast<int64_t>(st) * kMmqBKF + 8 * c;
      const bool ok = row < p.n_out && kk < p.n_in;
      mmq_cp16(&sm.w[slot][r][8 * c], ok ? p.w + static_cast<size_t>(row) * p.w_row_bytes + 2 * kk : p.w, ok);
    }
#pragma unroll
    for (int i = 0; i < 8 * BN / NTH; ++i) {
      const int idx = tid + NTH * i, n = idx / 8, c = idx % 8;
      const int64_t t = t0 + n, kk = static_cast<int64_t>(st) * kMmqBKF + 4 * c;
      const bool ok = t < p.n_tok && kk < p.n_in;
      mmq_cp16(&sm.x[slot][n][4 * c], ok ? p.x + t * p.x_stride + kk : p.x, ok);
    }
  }
  mmq_cp_commit();
}

template <bool kBf16>
__device__ __forceinline__ uint32_t mmq_cvt2(float2 v) {  // lo = v.x, hi = v.y, rounded to nearest
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(v.y), "f"(v.x));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(v.y), "f"(v.x));
#endif
  return r;
}

template <DType T, int MT, int NT, int WC, int SL, int MINB>
__global__ void __launch_bounds__(64 * WC, MINB) mmq_fp_kernel(MatmulParams p) {
  pdl_enter();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool kBf16 = T == DType::BF16;
  constexpr int NTH = 64 * WC, BM = 32 * MT, BN = 8 * WC * NT;
  extern __shared__ __align__(16) unsigned char mmq_smem[];
  MmqFPSmem<BM, BN, SL>& sm = *reinterpret_cast<MmqFPSmem<BM, BN, SL>*>(mmq_smem);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tig = lane & 3;
  const int rb = wm * 16 * MT, nb = wn * 8 * NT;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * BN, r0 = static_cast<int64_t>(blockIdx.y) * BM;
  const MmqKRange kr = mmq_k_range(p, static_cast<int>((p.n_in + kMmqBKF - 1) / kMmqBKF));  // split-K
  const int n_stage = kr.end;
  float acc[MT][NT][4];
  mmq_zero_acc(acc);
#pragma unroll
  for (int s = 0; s < SL - 1; ++s) mmq_fp_issue<NTH>(sm, p, r0, t0, kr.begin + s, n_stage);
  for (int st = kr.begin; st < n_stage; ++st) {
    mmq_cp_wait_group<SL - 2>();  // stage st landed
    __syncthreads();                        // ... for every thread; every warp done with stage st - 1
    mmq_fp_issue<NTH>(sm, p, r0, t0, st + SL - 1, n_stage);
    const int slot = st % SL;
#pragma unroll
    for (int kk = 0; kk < kMmqBKF; kk += 16) {
      uint32_t A[MT][4], B[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        mmq_ldsm4(A[mt], &sm.w[slot][rb + mt * 16 + (lane & 15)][kk + 8 * (lane >> 4)]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float* xr = &sm.x[slot][nb + nt * 8 + g][kk + 2 * tig];
        B[nt][0] = mmq_cvt2<kBf16>(*reinterpret_cast<const float2*>(xr));
        B[nt][1] = mmq_cvt2<kBf16>(*reinterpret_cast<const float2*>(xr + 8));
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_f_k16<kBf16>(acc[mt][nt], A[mt], B[nt]);
    }
  }
  mmq_finish<NTH>(p, acc, r0, t0, wm, wn, g, tig);
#endif
}

// ---- F16 / BF16 weights ----------------------------------------------------------------------------------------
struct MmqFSmem {
  uint16_t w[2][kMmqBM][kMmqPitch / 2];
  uint16_t x[2][kMmqBN][kMmqPitch / 2];
};

template <bool kBf16>
__device__ __forceinline__ uint32_t mmq_pack2(float lo, float hi) {
  if constexpr (kBf16) return static_cast<uint32_t>(f2bf(lo)) | (static_cast<uint32_t>(f2bf(hi)) << 16);
  else return static_cast<uint32_t>(f2h(lo)) | (static_cast<uint32_t>(f2h(hi)) << 16);
}

// Stage `stage` of the float kernel: weights by cp.async; activations (64 tokens x 32 floats, 4 float4 per thread)
// into registers, stored (rounded) after the compute of the other buffer.
__device__ __forceinline__ void mmq_f_load_w(MmqFSmem& sm, int buf, const MatmulParams& p, int64_t r0, int stage) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int idx = tid + kMmqThreads * i, r = idx / 4, c = idx % 4;
    const int64_t row = r0 + r, kk = static_cast<int64_t>(stage) * kMmqBKF + 8 * c;
    const bool ok = row < p.n_out && kk < p.n_in;
    mmq_cp16(&sm.w[buf][r][8 * c], ok ? p.w + static_cast<size_t>(row) * p.w_row_bytes + 2 * kk : p.w, ok);
  }
}
__device__ __forceinline__ void mmq_f_load_x(float4 (&xr)[4], const MatmulParams& p, int64_t t0, int stage) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + kMmqThreads * i, n = idx / 8, c = idx % 8;
    const int64_t t = t0 + n, kk = static_cast<int64_t>(stage) * kMmqBKF + 4 * c;
    xr[i] = t < p.n_tok && kk < p.n_in ? *reinterpret_cast<const float4*>(p.x + t * p.x_stride + kk)
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}
template <bool kBf16>
__device__ __forceinline__ void mmq_f_store_x(MmqFSmem& sm, int buf, const float4 (&xr)[4]) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = tid + kMmqThreads * i, n = idx / 8, c = idx % 8;
    *reinterpret_cast<uint2*>(&sm.x[buf][n][4 * c]) =
        make_uint2(mmq_pack2<kBf16>(xr[i].x, xr[i].y), mmq_pack2<kBf16>(xr[i].z, xr[i].w));
  }
}

// One block's tile: weight rows from blockIdx.y, tokens [t0, t0 + kMmqBN) of p.
template <DType T>
__device__ __forceinline__ void mmq_f_block(const MatmulParams& p, const int64_t t0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool kBf16 = T == DType::BF16;
  __shared__ __align__(16) MmqFSmem sm;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wm = warp & 1, wn = warp >> 1, g = lane >> 2, tig = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kMmqBM;
  const MmqKRange kr = mmq_k_range(p, static_cast<int>((p.n_in + kMmqBKF - 1) / kMmqBKF));  // split-K
  const int n_stage = kr.end;
  float acc[2][4][4];
  mmq_zero_acc(acc);
  float4 xr[4];
  mmq_f_load_w(sm, 0, p, r0, kr.begin);
  mmq_f_load_x(xr, p, t0, kr.begin);
  mmq_f_store_x<kBf16>(sm, 0, xr);
  mmq_cp_wait();
  __syncthreads();
  for (int st = kr.begin; st < n_stage; ++st) {
    const int buf = (st - kr.begin) & 1;
    const bool more = st + 1 < n_stage;
    if (more) {
      mmq_f_load_w(sm, buf ^ 1, p, r0, st + 1);
      mmq_f_load_x(xr, p, t0, st + 1);
    }
#pragma unroll
    for (int kk = 0; kk < kMmqBKF; kk += 16) {
      uint32_t A[2][4], B[4][2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm * 32 + mt * 16 + g;
        A[mt][0] = *reinterpret_cast<const uint32_t*>(&sm.w[buf][r][kk + 2 * tig]);
        A[mt][1] = *reinterpret_cast<const uint32_t*>(&sm.w[buf][r + 8][kk + 2 * tig]);
        A[mt][2] = *reinterpret_cast<const uint32_t*>(&sm.w[buf][r][kk + 8 + 2 * tig]);
        A[mt][3] = *reinterpret_cast<const uint32_t*>(&sm.w[buf][r + 8][kk + 8 + 2 * tig]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = wn * 32 + nt * 8 + g;
        B[nt][0] = *reinterpret_cast<const uint32_t*>(&sm.x[buf][n][kk + 2 * tig]);
        B[nt][1] = *reinterpret_cast<const uint32_t*>(&sm.x[buf][n][kk + 8 + 2 * tig]);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_f_k16<kBf16>(acc[mt][nt], A[mt], B[nt]);
    }
    if (more) mmq_f_store_x<kBf16>(sm, buf ^ 1, xr);
    mmq_cp_wait();
    __syncthreads();
  }
  mmq_finish<kMmqThreads>(p, acc, r0, t0, wm, wn, g, tig);
#endif
}

template <DType T>
__global__ void __launch_bounds__(kMmqThreads, mmq_min_blocks<T>()) mmq_f_kernel(MatmulParams p) {
  pdl_enter();
  mmq_f_block<T>(p, static_cast<int64_t>(blockIdx.x) * kMmqBN);
}
// A grouped launch (mmq_group_enter).
template <DType T>
__global__ void __launch_bounds__(kMmqThreads, mmq_min_blocks<T>()) mmq_f_group_kernel(MatmulParams p, MatmulGroup grp) {
  pdl_enter();
  int64_t t0 = 0;
  if (!mmq_group_enter<kMmqBN>(grp, p, t0, nullptr)) return;
  mmq_f_block<T>(p, t0);
}

}  // namespace kiln::cuda

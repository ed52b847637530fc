// The tensor-core GEMM family's shared pieces (mmq.cuh has the family's design notes and ledger): geometry
// constants, per-type traits, the cp.async / ldmatrix / MMA PTX wrappers (sm_80+).
#pragma once

#include "backend/cuda/launch.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant.cuh"

namespace kiln::cuda {

constexpr int kMmqThreads = 128, kMmqBM = 64, kMmqBN = 64, kMmqPitch = 80;  // pitch: bytes per smem row
constexpr int kMmqBKQ = 64, kMmqBKF = 32;                                   // K elements per stage
// Split-K (mmq_finish): at most kMmqSplitMax blocks per tile, each at least kMmqSplitMinStages stages long.
constexpr int kMmqSplitMax = 16, kMmqSplitMinStages = 4;
// Partial float4 loads in flight per thread in the split-K reduction (all of a fragment's splits at once).
constexpr int kMmqSplitLoads = 16;
// The split count of a launch of `tiles` output tiles of bm x bn whose kernel keeps per_sm blocks resident and runs
// n_stage K stages (mmq.cu).
int mmq_split_count(const MatmulParams& p, int64_t tiles, int per_sm, int n_stage, int bm, int bn);
// The pipelined kernels' default stage (mmq_p.cuh, mmq_p6.cuh): 128 K, 144-byte activation rows.
constexpr int kMmqPK = 128, kMmqPXPitch = 144;
template <DType T> constexpr bool mmq_half16() { return T == DType::Q2_K || T == DType::Q3_K || T == DType::Q6_K; }
template <DType T> constexpr bool mmq_has_m() {
  return T == DType::Q4_1 || T == DType::Q5_1 || T == DType::Q2_K || T == DType::Q4_K || T == DType::Q5_K;
}

// Blocks per SM the float kernel's register budget is set for (__launch_bounds__ min blocks: 4 = 128 registers;
// F16/BF16 fit in 126-128 without spills). The quantized kernel's budget is mmq_q_min_blocks (per tile, below).
template <DType T> constexpr int mmq_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
  if (mmq_half16<T>()) return 3;
#endif
  return T == DType::Q2_K ? 3 : 4;
}

// ---- PTX wrappers (sm_80+) -------------------------------------------------------------------------------------
__device__ __forceinline__ void mmq_cp16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
#endif
}
__device__ __forceinline__ void mmq_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// ldmatrix .x4 (four 8x8 b16 matrices = 8 rows x 16 bytes each; lane l gives the row address of matrix l / 8, and
// receives word l % 4 of row l / 4 of every matrix): the int8 m16 x k32 A fragment (matrices: rows 0-7 / 8-15 x
// bytes 0-15 / 16-31) and two n8 x k32 B fragments.
__device__ __forceinline__ void mmq_ldsm4(uint32_t (&r)[4], const void* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}
// Shared-memory loads as volatile asm: ordered with the (volatile) ldmatrix / mma, so ptxas cannot hoist a whole
// sub-block's scale loads above its MMAs (which cost ~100 registers on the 64 x 128 tile).
__device__ __forceinline__ float4 mmq_lds128(const void* p) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(s));
#endif
  return v;
}
__device__ __forceinline__ float2 mmq_lds64(const void* p) {
  float2 v = make_float2(0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(s));
#endif
  return v;
}
__device__ __forceinline__ float mmq_lds32(const void* p) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(s));
#endif
  return v;
}
template <bool kBf16>
__device__ __forceinline__ void mma_f_k16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBf16)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Output (row, token) of accumulator i of m-tile mt, n-tile nt (C fragment: c0,c1 row g, c2,c3 row g+8; columns
// 2*tig, 2*tig+1; warp (wm, wn) covers rows wm*16*MT.., tokens wn*8*NT..) and the epilogue: bias, accumulate, any
// y stride, row / token tails.
template <int MT, int NT>
__device__ __forceinline__ void mmq_store(const MatmulParams& p, const float (&acc)[MT][NT][4], int64_t r0,
                                          int64_t t0, int wm, int wn, int g, int tig) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + wm * 16 * MT + mt * 16 + g + 8 * h;
      if (row >= p.n_out) continue;
      const float b = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t t = t0 + wn * 8 * NT + nt * 8 + 2 * tig + e;
          if (t >= p.n_tok) continue;
          float* y = p.y + t * p.y_stride + row;
          *y = (p.accumulate ? *y : 0.0f) + acc[mt][nt][2 * h + e] + b;
        }
    }
}

// ---- grouped products (MatmulGroup, launch.h) ---------------------------------------------------------------------
// Block x of a grouped launch takes entry x of its BN section: expert e's rows [r0, min(r0 + BN, first[e + 1])). It
// then runs as an ordinary block over those rows alone (t0 = 0, n_tok = their count) with expert e's weights and
// bias, so the arithmetic per output is the ungrouped kernel's. false: an entry past the section's last tile (the
// grid covers the capacity). The grouped kernels (mmq_q_group_kernel, mmq_f_group_kernel) are wrappers of the
// ordinary kernels' block functions, so the ordinary instances keep their code.
template <int BN>
__device__ __forceinline__ bool mmq_group_enter(const MatmulGroup& g, MatmulParams& p, int64_t& t0, ActQ* a) {
  const int2 tl = g.tiles[mmq_group_off(g.n_rows, g.n_expert, BN) + blockIdx.x];
  if (tl.x < 0) return false;
  const int64_t r0 = tl.y, n = min(static_cast<int64_t>(BN), static_cast<int64_t>(g.first[tl.x + 1]) - r0);
  p.w += static_cast<size_t>(tl.x) * g.expert_bytes;
  if (p.bias) p.bias += static_cast<int64_t>(tl.x) * p.n_out;
  if (p.x) p.x += r0 * static_cast<int64_t>(p.x_stride);
  p.y += r0 * static_cast<int64_t>(p.y_stride);
  p.n_tok = n;
  p.k_split = 1;
  if (a) {
    a->qs += r0 * static_cast<int64_t>(a->qs_stride);
    a->ds += r0 * static_cast<int64_t>(a->ds_stride);
    a->n_tok = n;
  }
  t0 = 0;
  return true;
}

// ---- split-K ------------------------------------------------------------------------------------------------------
// Few output tiles (the decode-sized token counts: 33..256 tokens give 1-4 token tiles) leave most SMs idle, each
// block running the whole K loop. With p.k_split = S > 1 the grid has S blocks per tile (blockIdx.z); block z
// computes the stages [z*n/S, (z+1)*n/S) of its tile (mmq_k_range), writes its fragments to the workspace, and the
// last block to arrive at the tile's counter sums the S partials in the order z = 0, 1, .., S-1 (whichever block
// is last: the result does not depend on the arrival order) and runs the epilogue (bias, accumulate, tails).
// Numerics: the f32 sum of a split differs from the unsplit loop's only in the summation order.
struct MmqKRange {
  int begin, end;
};
__device__ __forceinline__ MmqKRange mmq_k_range(const MatmulParams& p, int n_stage) {
  const int z = static_cast<int>(blockIdx.z), S = p.k_split;
  return {static_cast<int>(static_cast<int64_t>(z) * n_stage / S),
          static_cast<int>(static_cast<int64_t>(z + 1) * n_stage / S)};
}

// The epilogue of every mmq kernel: mmq_store, after the split-K reduction when the grid is split. Partial layout:
// tile (blockIdx.y * gridDim.x + blockIdx.x), split z, fragment f = mt * NT + nt (one float4: its 4 accumulators),
// thread: float4 [tile][z][f][NTH] (a warp's 16-byte stores and loads are contiguous).
// The reduction is latency bound (one block reads S x BM x BN floats from L2): every split's float4 of a fragment is
// loaded kMmqSplitLoads at a time before any is added, then summed in the order z = 0..S-1.
template <int NTH, int MT, int NT>
__device__ __forceinline__ void mmq_finish(const MatmulParams& p, float (&acc)[MT][NT][4], int64_t r0, int64_t t0,
                                           int wm, int wn, int g, int tig) {
  if (p.k_split > 1) {
    constexpr int kF = MT * NT;
    __shared__ unsigned mmq_last;
    const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
    const int S = p.k_split, z = static_cast<int>(blockIdx.z), tid = static_cast<int>(threadIdx.x);
    float4* mine = reinterpret_cast<float4*>(p.split.part) + (static_cast<size_t>(tile) * S + z) * kF * NTH + tid;
#pragma unroll
    for (int f = 0; f < kF; ++f) {
      const float* a = acc[f / NT][f % NT];
      __stcg(mine + f * NTH, make_float4(a[0], a[1], a[2], a[3]));
    }
    __threadfence();  // this block's partial is visible device-wide before it counts itself in
    __syncthreads();
    if (tid == 0) {
      const unsigned prior = atomicAdd(&p.split.sem[tile], 1u);
      mmq_last = prior == static_cast<unsigned>(S - 1);
      if (mmq_last) p.split.sem[tile] = 0;  // every block of the tile has arrived: ready for the next launch
    }
    __syncthreads();
    if (!mmq_last) return;
    __threadfence();
    const float4* part = reinterpret_cast<const float4*>(p.split.part) + static_cast<size_t>(tile) * S * kF * NTH + tid;
#pragma unroll
    for (int f = 0; f < kF; ++f) {
      float* a = acc[f / NT][f % NT];
      a[0] = a[1] = a[2] = a[3] = 0.0f;
#pragma unroll 1
      for (int z0 = 0; z0 < S; z0 += kMmqSplitLoads) {
        float4 v[kMmqSplitLoads];
#pragma unroll
        for (int k = 0; k < kMmqSplitLoads; ++k)
          v[k] = z0 + k < S ? __ldcg(part + (static_cast<size_t>(z0 + k) * kF + f) * NTH) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < kMmqSplitLoads; ++k) a[0] += v[k].x, a[1] += v[k].y, a[2] += v[k].z, a[3] += v[k].w;
      }
    }
  }
  mmq_store<MT, NT>(p, acc, r0, t0, wm, wn, g, tig);
}

// The MMA accumulators of a warp tile (MT x NT m16n8 tiles, 4 floats each) set to 0.
template <int MT, int NT>
__device__ __forceinline__ void mmq_zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
}

// ---- the pipelined kernels' cp.async groups and shared-memory loads ---------------------------------------------
__device__ __forceinline__ void mmq_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void mmq_cp_wait_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ uint32_t mmq_lds_u32(const void* p) {
  uint32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(s));
#endif
  return v;
}
__device__ __forceinline__ uint4 mmq_lds_u128(const void* p) {
  uint4 v = make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s));
#endif
  return v;
}

// threadIdx.x through an empty asm: address arithmetic that depends on it is recomputed at each use instead of
// being hoisted out of the K loop (where ~40 loop-invariant copy addresses held across the MMAs spilled).
__device__ __forceinline__ int mmq_tid_opaque() {
  int t = static_cast<int>(threadIdx.x);
  asm volatile("" : "+r"(t));
  return t;
}

}  // namespace kiln::cuda

// Flash-attention prefill pieces shared by the mma.sync kernel (fattn_mma.cu) and the wgmma kernel
// (sm90a/fattn_wgmma.cu): the CTA geometry (64 query rows of one KV group), the row map and masks, the copy and
// ldmatrix helpers, the online softmax of one KV tile on accumulator fragments, and the output store. The layouts,
// masks and numerics are described once, in fattn_mma.cu's header.
#pragma once

#include <algorithm>
#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {

constexpr int kFaWarps = 4, kFaThreads = kFaWarps * kWarp, kFaRows = 16 * kFaWarps;  // rows per CTA

// rows: query rows per CTA (64 per 4 warps; the wgmma kernel may take 128).
struct FaGeo {
  int hpc, tpc, n_hchunk, q_tiles;
};

inline FaGeo fa_geo(const AttnParams& p, int rows = kFaRows) {
  FaGeo g;
  const int n_rep = p.n_head / p.n_head_kv;
  g.hpc = std::min(n_rep, rows);
  g.tpc = rows / g.hpc;
  g.n_hchunk = (n_rep + g.hpc - 1) / g.hpc;
  g.q_tiles = (std::max(p.max_q_len, 1) + g.tpc - 1) / g.tpc;
  return g;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // lo -> bits 0-15 (the lower column)
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One CTA's query tile: sequence, tile, KV group and head chunk, and the row map. Row r of the 64 is the pair
// (token q0 + r / hpc, query head g * n_rep + hc * hpc + r % hpc); tok() is -1 for a dead row.
struct FaCta {
  int seq, qt, g, hc, n_rep, q0, n_q;
  const int32_t* table;
  __device__ int tok(const FaGeo& geo, int r) const {
    const int i = r / geo.hpc, j = r % geo.hpc;
    return (i < n_q && hc * geo.hpc + j < n_rep) ? q0 + i : -1;
  }
  __device__ int head(const FaGeo& geo, int r) const { return g * n_rep + hc * geo.hpc + r % geo.hpc; }
};

// False when the whole CTA lies past its sequence (uniform across the CTA: return before any barrier).
__device__ __forceinline__ bool fa_cta(const AttnParams& p, const FaGeo& geo, FaCta& c) {
  c.seq = blockIdx.x / geo.q_tiles;
  c.qt = geo.q_tiles - 1 - static_cast<int>(blockIdx.x % geo.q_tiles);  // longest causal ranges first
  c.g = blockIdx.y / geo.n_hchunk, c.hc = blockIdx.y % geo.n_hchunk;
  c.n_rep = p.n_head / p.n_head_kv;
  const int q_len = p.seq_q_len[c.seq];
  if (c.qt * geo.tpc >= q_len) return false;
  c.q0 = p.seq_q_start[c.seq] + c.qt * geo.tpc;
  c.n_q = min(geo.tpc, q_len - c.qt * geo.tpc);
  c.table = p.tables + static_cast<int64_t>(p.seq_row[c.seq]) * p.table_stride;
  return true;
}

// Q -> f16 shared, row-major [ROWS][LD] (dead rows zero); the THREADS threads of the CTA.
template <int D, int LD, int ROWS = kFaRows, int THREADS = kFaThreads>
__device__ __forceinline__ void fa_stage_q(const AttnParams& p, const FaGeo& geo, const FaCta& c, __half* qs) {
  for (int i = threadIdx.x; i < ROWS * (D / 2); i += THREADS) {
    const int r = i / (D / 2), d = 2 * (i % (D / 2));
    const int t = c.tok(geo, r);
    float x0 = 0.0f, x1 = 0.0f;
    if (t >= 0) {
      const float* qr =
          p.q + static_cast<size_t>(t) * p.q_tok_stride + static_cast<size_t>(c.head(geo, r)) * p.q_head_stride;
      x0 = qr[d], x1 = qr[d + 1];
    }
    *reinterpret_cast<__half2*>(qs + r * LD + d) = __floats2half2_rn(x0, x1);
  }
}

// A lane's two rows (g, g + 8 of its warp's 16): [lo, hi); dead / kv_len-0 rows: hi = 0. The warp's bounds over its
// live rows: union [w_lo, w_hi), intersection [w_lo_max, w_hi_min) (w_lo_max INT_MAX when a row is dead or empty:
// such a warp never takes the mask-free path, the row must stay -inf and is written as 0).
struct FaRows {
  int lo[2], hi[2];
  int w_lo, w_hi, w_lo_max, w_hi_min;
  // Tile [base, base + bc): wholly outside every live row (skip it) / inside all of them (no mask).
  __device__ bool skip(int base, int bc) const { return base >= w_hi || base + bc <= w_lo; }
  __device__ bool full(int base, int bc) const { return base >= w_lo_max && base + bc <= w_hi_min; }
};

__device__ __forceinline__ FaRows fa_rows(const AttnParams& p, const FaGeo& geo, const FaCta& c, int warp, int lane) {
  FaRows w;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = c.tok(geo, warp * 16 + (lane >> 2) + 8 * h);
    const int L = t >= 0 ? p.kv_len[t] : 0;
    w.hi[h] = L;
    w.lo[h] = (p.window > 0 && L > p.window) ? L - p.window : 0;
  }
  w.w_lo = INT_MAX, w.w_hi = 0, w.w_lo_max = 0, w.w_hi_min = INT_MAX;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (w.hi[h] > 0)
      w.w_lo = min(w.w_lo, w.lo[h]), w.w_hi = max(w.w_hi, w.hi[h]), w.w_lo_max = max(w.w_lo_max, w.lo[h]),
      w.w_hi_min = min(w.w_hi_min, w.hi[h]);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {  // lanes of one row agree already (bits 0-1); reduce over g
    w.w_lo = min(w.w_lo, __shfl_xor_sync(0xffffffffu, w.w_lo, o));
    w.w_hi = max(w.w_hi, __shfl_xor_sync(0xffffffffu, w.w_hi, o));
    w.w_lo_max = max(w.w_lo_max, __shfl_xor_sync(0xffffffffu, w.w_lo_max, o));
    w.w_hi_min = min(w.w_hi_min, __shfl_xor_sync(0xffffffffu, w.w_hi_min, o));
  }
  if (__any_sync(0xffffffffu, w.hi[0] == 0 || w.hi[1] == 0)) w.w_lo_max = INT_MAX;
  return w;
}

// The CTA's KV range [kv_begin, kv_end): the union of its warps' ranges, through two shared ints. Contains
// __syncthreads (every thread of the CTA calls it); the barrier also publishes shared writes made before it.
__device__ __forceinline__ void fa_cta_range(const FaRows& w, int lane, int& kv_begin, int& kv_end) {
  __shared__ int s_lo, s_hi;
  if (threadIdx.x == 0) s_lo = INT_MAX, s_hi = 0;
  __syncthreads();
  if (lane == 0 && w.w_hi > 0) atomicMin(&s_lo, w.w_lo), atomicMax(&s_hi, w.w_hi);
  __syncthreads();
  kv_begin = s_lo, kv_end = s_hi;
}

// Online softmax of one tile on the S fragments (NS n8 tiles of positions base + 8n + 2t + e % 2, rows g + 8 (e / 2)):
// scale into the log2 domain, mask (unless full), row max over the 4 lanes of a row, p = exp2(s - m) in place,
// running max / lane-partial sum updated; returns the factors the output rows must be multiplied by.
template <int NS>
__device__ __forceinline__ void fa_softmax(float (&s)[NS][4], int base, bool full, const FaRows& w, float sl2,
                                           float (&m_run)[2], float (&l_run)[2], float (&alpha)[2], int lane) {
  const int gc = lane & 3;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = s[n][e] * sl2;
      if (!full) {
        const int pos = base + n * 8 + 2 * gc + (e & 1), h = e >> 1;
        if (pos < w.lo[h] || pos >= w.hi[h]) v = -INFINITY;
      }
      s[n][e] = v;
      mx[e >> 1] = fmaxf(mx[e >> 1], v);
    }
  float mu[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m_run[h], mx[h]);
    alpha[h] = m_new == -INFINITY ? 1.0f : exp2f(m_run[h] - m_new);  // m_run -inf, m_new finite: 0
    mu[h] = m_new == -INFINITY ? 0.0f : m_new;                        // no -inf - -inf
    m_run[h] = m_new;
  }
  float rs[2] = {0.0f, 0.0f};
#pragma unroll
  for (int n = 0; n < NS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = exp2f(s[n][e] - mu[e >> 1]);  // masked: exp2(-inf) = 0
      s[n][e] = pe;
      rs[e >> 1] += pe;
    }
  l_run[0] = l_run[0] * alpha[0] + rs[0];
  l_run[1] = l_run[1] * alpha[1] + rs[1];
}

// P's C fragments of n-tiles 2kk, 2kk + 1 (positions 16kk..16kk+15) as the f16 A fragment of k-step kk.
template <int NS>
__device__ __forceinline__ void fa_p_frag(const float (&s)[NS][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_h2(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_h2(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Output: O / l per row (full row sum: butterfly over the row's 4 lanes); dead rows are not written. Attention sinks
// (p.sinks) join each live row here, once, after its last tile: m_run (the same in the row's 4 lanes) and l_run are
// in the log2 domain of the scaled scores, so the sink s enters as s log2(e) (it is not scaled): m' = max(m, s'),
// O / l becomes O f / (l f + 2^(s' - m')), f = 2^(m - m'). Without sinks: O (1 / l), as before.
template <int D>
__device__ __forceinline__ void fa_store(const AttnParams& p, const FaGeo& geo, const FaCta& c, const FaRows& w,
                                         const float (&o)[D / 8][4], const float (&m_run)[2], float (&l_run)[2],
                                         int warp, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + (lane >> 2) + 8 * h;
    const int t = c.tok(geo, r);
    if (t < 0) continue;
    float inv = 0.0f;
    if (w.hi[h] > 0 && l_run[h] > 0.0f) {
      if (p.sinks) {
        const float sk = p.sinks[c.head(geo, r)] * 1.4426950408889634f, mx = fmaxf(m_run[h], sk);
        const float f = exp2f(m_run[h] - mx);
        inv = f / (l_run[h] * f + exp2f(sk - mx));
      } else {
        inv = 1.0f / l_run[h];
      }
    }
    float* dst = p.dst + (static_cast<size_t>(t) * p.n_head + c.head(geo, r)) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8 + 2 * (lane & 3)) =
          make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

// The paged slot of position pos: table[pos / bs] * bs + pos % bs (a power-of-two block size: shift and mask).
__device__ __forceinline__ int64_t fa_slot(const int32_t* table, int pos, int block_size, int bs_shift) {
  const int blk = bs_shift >= 0 ? pos >> bs_shift : pos / block_size;
  const int off = bs_shift >= 0 ? pos & (block_size - 1) : pos % block_size;
  return static_cast<int64_t>(table[blk]) * block_size + off;
}

// The wgmma kernel's variants (sm90a/fattn_wgmma.cu): wgs warpgroups per CTA (64 query rows each, sharing the K/V
// tiles), pipe: tile j's S wgmmas and softmax beside tile j - 1's P V wgmmas; ws: the warp-specialized kernel
// (fattn_ws: a copying warpgroup beside 2 pipelined computing ones; head dims 64 / 128). fa_wg_variant is the one
// choice per head dim (the launcher's; dev/cuda/fattn_bench times every variant); wgs 0: none, the mma.sync kernel.
// H100, fattn_bench --quick at d2cb2e9 (TFLOP/s, 32/8 heads (256: 16/8), causal; 1 warpgroup / 1 pipelined / 2 /
// 2 pipelined / ws / mma.sync, two rounds agree within 2%):
//   hd 128: 512 tokens 47.8 / 45.4 / 51.8 / 52.8 / 60.0 / 48.9; 4096 143.6 / 143.5 / 165.7 / 181.6 / 206.3 / 155.7;
//           16384 169.6 / 173.2 / 197.7 / 224.7 / 248.2 / 183.4; 512 at depth 32768 165.0 / 172.5 / 195.4 / 219.2 /
//           240.8 / 179.3; 512 at depth 131072 168.2 / 175.6 / 200.6 / 229.9 / 250.5 / 183.1
//   hd 64:  512 33.1 / 32.9 / 34.7 / 37.4 / 41.4 / 34.6; 4096 118.2 / 127.5 / 117.9 / 140.4 / 178.8 / 133.1;
//           16384 144.5 / 158.9 / 136.4 / 168.2 / 225.5 / 166.0
//   hd 256 (Q in shared memory, 32-position tiles; no ws): 512 44.0 / 38.6 / 42.6 / 37.2 / - / 34.5; 4096 128.4 /
//           107.4 / 197.7 / 176.3 / - / 134.0; 16384 141.0 / 118.8 / 267.7 / 239.1 / - / 185.2
// hd 64 and 128 take ws (+9-14% over 2 pipelined warpgroups at hd 128, +27-34% at hd 64 from 4096 tokens); hd 256
// takes 2 warpgroups unpipelined (+45-48% over mma.sync from 4096 tokens; 1 warpgroup is 3% ahead at 512 only).
struct FaWgVariant {
  int wgs;
  bool pipe;
  bool ws = false;
};
constexpr FaWgVariant fa_wg_variant(int d) {
  if (d == 128 || d == 64) return FaWgVariant{2, true, true};
  if (d == 256) return FaWgVariant{2, false};
  return FaWgVariant{0, false};
}
constexpr int kFaWgVariantCount = 5;
constexpr FaWgVariant kFaWgVariants[kFaWgVariantCount] = {{1, false}, {1, true}, {2, false}, {2, true},
                                                          {2, true, true}};  // every instance
// The kernel of a variant for head dim d, its dynamic shared memory; null / 0 when the build has no sm_90a code or
// no instance for d.
const void* fattn_wg_kernel(int d, FaWgVariant v);
size_t fattn_wg_smem(int d, FaWgVariant v);
// Launches variant v (fattn_mma_selected's conditions hold, the device is 9.0; padded rows are the caller's).
Status launch_fattn_wg(const AttnParams& p, FaWgVariant v, cudaStream_t s);

}  // namespace kiln::cuda

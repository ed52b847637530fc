// Causal paged attention over the KV cache (f16, f32 or q8_0 storage), decode and prefill, any head dims.
//   entry: CudaBackend::attention  ->  launch_attention  ->  attn_vec_kernel or attn_kernel (+ attn_combine when split)
// attn_vec_kernel (f16 cache, head dims 64/128/256, n_rep 1/2/4/8: vec_kernel() selects) is the decode kernel:
// 16-byte K/V row loads, lane-per-position scores, lane-per-dims P.V; attn_kernel (below) covers everything else.
// Work item = (token, KV head, split): one 128-thread block serves all n_head/n_head_kv query heads of its GQA
// group, so each KV tile is loaded once per group. The positions [0, kv_len) of the token are cut into n_split
// contiguous ranges (flash-decoding: the split count comes from the host-known bound max_kv_len and the SM count,
// never from tensor values, so a step stays capturable); each split runs an online softmax over tiles of 32
// positions: K tile -> shared (f32) -> scores q.k (thread per (head, position)) -> running max / sum per head ->
// V tile -> shared -> acc += p V (thread per (head, dim)). Splits write (acc, max, sum) and attn_combine merges
// them with the usual rescaling. kv_len 0 (padding) gives a zero row (sum exactly 0); a NaN read from the cache
// propagates to the output (the sum is NaN, not > 0), as on the CPU. Sliding window (KvLayer::window): a token
// reads [max(0, L - window), L) only, and the splits divide that range (sized from min(window, max_kv_len)), so
// positions and tiles before the window are never read. Prefill of f16 caches at head dims 64/128/256 on sm_80+
// runs fattn_mma.cu instead (fattn_mma_selected).
// Numerics: f32 throughout; q is rounded to f16 first when the cache is f16 (as the CPU reference and llama.cpp's
// f16 flash attention do); exp in f32.
#include <algorithm>
#include <climits>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

// Split count: enough (token, KV head, split) blocks for kBlocksPerSm per SM (memory-bound: the loads in flight per
// SM decide the bandwidth; 2 per SM left d32768 at ~1.2 TB/s), at most kMaxSplit, each at least kMinSplitLen long.
constexpr int kTile = 32, kThreads = 128, kMaxSplit = 128, kMinSplitLen = 64, kBlocksPerSm = 4;

struct Shape {
  int n_rep, n_split, chunk, dmax;
};

Shape shape_of(const AttnParams& p) {
  Shape s;
  s.n_rep = p.n_head / p.n_head_kv;
  s.dmax = std::max(p.hd_k, p.hd_v);
  s.n_split = 1;
  // The longest range a token reads: its window when one is set (the splits divide [max(0, L - window), L)).
  const int span = p.window > 0 ? std::min(p.window, p.max_kv_len) : p.max_kv_len;
  if (span > 0) {
    const int items = std::max(1, p.n_tok * p.n_head_kv);
    const int want = ceil_div(kBlocksPerSm * std::max(p.n_sm, 1), items);
    const int by_len = std::max(1, span / kMinSplitLen);
    s.n_split = std::clamp(std::min(want, by_len), 1, kMaxSplit);
  }
  s.chunk = s.n_split == 1 ? INT_MAX : ceil_div(ceil_div(span, s.n_split), kTile) * kTile;
  return s;
}

size_t smem_floats(const AttnParams& p, const Shape& s) {
  return static_cast<size_t>(s.n_rep) * p.hd_k + static_cast<size_t>(kTile) * (s.dmax + 1) +
         static_cast<size_t>(s.n_rep) * kTile + 3 * static_cast<size_t>(s.n_rep) + static_cast<size_t>(s.n_rep) * p.hd_v;
}

__device__ __forceinline__ float kv_elem(DType t, const uint8_t* head, int d) {
  if (t == DType::F16) return h2f(reinterpret_cast<const uint16_t*>(head)[d]);
  if (t == DType::F32) return reinterpret_cast<const float*>(head)[d];
  const uint8_t* blk = head + 34 * (d / 32);  // Q8_0
  return h2f(ld_u16(blk)) * static_cast<float>(reinterpret_cast<const int8_t*>(blk + 2)[d % 32]);
}

__global__ void __launch_bounds__(kThreads) attn_kernel(AttnParams p, Shape sh, float* part) {
  extern __shared__ float smem[];
  const int n_rep = sh.n_rep, Dk = p.hd_k, Dv = p.hd_v, ld = sh.dmax + 1;
  float* qs = smem;                      // [n_rep][Dk]
  float* kv = qs + n_rep * Dk;           // [kTile][dmax + 1]
  float* ps = kv + kTile * ld;           // [n_rep][kTile]
  float* corr = ps + n_rep * kTile;      // [n_rep]
  float* mrow = corr + n_rep;            // [n_rep]
  float* lrow = mrow + n_rep;            // [n_rep]
  float* acc = lrow + n_rep;             // [n_rep][Dv]
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int len = p.kv_len[t];
  // Sliding window: positions before lo are skipped (never read); the splits cover [lo, len).
  const int lo = (p.window > 0 && len > p.window) ? len - p.window : 0;
  const int start = lo + sp * sh.chunk;  // chunk is INT_MAX only when n_split == 1 (sp == 0)
  const int end = sp == sh.n_split - 1 ? len : min(len, start + sh.chunk);
  const int32_t* table = p.tables + static_cast<int64_t>(p.tok_table[t]) * p.table_stride;
  const bool f16 = p.kv_type == DType::F16;

  for (int i = tid; i < n_rep * Dk; i += kThreads) {
    const int r = i / Dk, d = i % Dk;
    const float v = p.q[t * p.q_tok_stride + (g * n_rep + r) * p.q_head_stride + d];
    qs[i] = f16 ? __half2float(__float2half_rn(v)) : v;
  }
  for (int i = tid; i < n_rep * Dv; i += kThreads) acc[i] = 0.0f;
  if (tid < n_rep) mrow[tid] = -INFINITY, lrow[tid] = 0.0f;
  __syncthreads();

  for (int j0 = start; j0 < end; j0 += kTile) {
    const int nj = min(kTile, end - j0);
    for (int i = tid; i < nj * Dk; i += kThreads) {
      const int j = i / Dk, d = i % Dk, pos = j0 + j;
      const int64_t slot = static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
      kv[j * ld + d] = kv_elem(p.kv_type, p.k + slot * p.k_slot_bytes + g * p.k_head_bytes, d);
    }
    __syncthreads();
    for (int i = tid; i < n_rep * kTile; i += kThreads) {
      const int r = i / kTile, j = i % kTile;
      float s = -INFINITY;
      if (j < nj) {
        const float* qr = qs + r * Dk;
        const float* kr = kv + j * ld;
        float a = 0.0f;
        for (int d = 0; d < Dk; ++d) a = fmaf(qr[d], kr[d], a);
        s = a * p.scale;
      }
      ps[i] = s;
    }
    __syncthreads();
    for (int r = warp; r < n_rep; r += kThreads / kWarp) {
      const float s = ps[r * kTile + lane];
      const float m_old = mrow[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float e = lane < nj ? expf(s - m_new) : 0.0f;
      const float sum = warp_sum(e);
      ps[r * kTile + lane] = e;
      __syncwarp();
      if (lane == 0) {
        const float c = expf(m_old - m_new);  // m_old = -inf: 0
        corr[r] = c;
        lrow[r] = lrow[r] * c + sum;
        mrow[r] = m_new;
      }
    }
    for (int i = tid; i < nj * Dv; i += kThreads) {
      const int j = i / Dv, d = i % Dv, pos = j0 + j;
      const int64_t slot = static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size;
      kv[j * ld + d] = kv_elem(p.kv_type, p.v + slot * p.v_slot_bytes + g * p.v_head_bytes, d);
    }
    __syncthreads();
    for (int i = tid; i < n_rep * Dv; i += kThreads) {
      const int r = i / Dv, d = i % Dv;
      const float* pr = ps + r * kTile;
      float a = acc[i] * corr[r];
      for (int j = 0; j < nj; ++j) a = fmaf(pr[j], kv[j * ld + d], a);
      acc[i] = a;
    }
    __syncthreads();
  }

  if (sh.n_split == 1) {
    for (int i = tid; i < n_rep * Dv; i += kThreads) {
      const int r = i / Dv, d = i % Dv;
      const float l = lrow[r];
      p.dst[(static_cast<size_t>(t) * p.n_head + g * n_rep + r) * Dv + d] = l != 0.0f ? acc[i] / l : 0.0f;
    }
  } else {
    for (int i = tid; i < n_rep * Dv; i += kThreads) {
      const int r = i / Dv, d = i % Dv;
      const size_t th = static_cast<size_t>(t) * p.n_head + g * n_rep + r;
      part[(th * sh.n_split + sp) * (Dv + 2) + d] = acc[i];
    }
    if (tid < n_rep) {
      const size_t th = static_cast<size_t>(t) * p.n_head + g * n_rep + tid;
      float* o = part + (th * sh.n_split + sp) * (Dv + 2) + Dv;
      o[0] = mrow[tid];
      o[1] = lrow[tid];
    }
  }
}

// attn_vec_kernel<HD, NR>: the decode path of f16 caches at head dims 64/128/256 with NR = n_rep in {1, 2, 4, 8}
// (same work item, splits, partial layout and combine as attn_kernel; that kernel takes the rest).
// Q.K^T: lane = position: each lane reads its position's whole K row of the KV head (HD halves, 16-byte loads; the
// slot through the block table) and dots it with the NR query rows (f16-rounded, f32, broadcast from shared
// memory). Online softmax per head across the warp's 32 positions (warp max / sum). P.V: lane = HD/32 dims: for each
// of the 32 positions the warp reads one V row coalesced (HD * 2 bytes) and accumulates p * v for the NR heads (p
// from shared memory). The 4 warps take interleaved 32-position tiles of the split's range, each with its own
// running max / sum / accumulator, merged at the end. K and V bytes are read once per GQA group.
// Numerics: f32 dot products and probabilities (q rounded to f16 as attn_kernel), exp in f32; only the summation
// order differs from attn_kernel.
// Ledger (per thread): acc NR * HD/32 floats, q.k partials NR, the K row in 16-byte pieces; shared: q NR*HD,
// p 4*NR*32, the merge NR*(4*HD + 8) floats (NR 8, HD 256: 45 KB static). -Xptxas -v (sm_90, no spills, no stack),
// registers / static smem: HD 64: NR 1 44/1.8K, 2 54/3.6K, 4 62/7.3K, 8 92/14.6K; HD 128: 52/3.1K, 56/6.2K, 80/12.4K,
// 128/24.8K; HD 256: 56/5.7K, 68/11.3K, 106/22.7K, 144/45.3K.
// DL = HD / 32 halves of one V row per lane: 4 (HD 128), 8 or 16 bytes, one load.
template <int DL> struct VRow;
template <> struct VRow<2> {
  uint32_t u;
  __device__ __forceinline__ void load(const uint8_t* p) { u = *reinterpret_cast<const uint32_t*>(p); }
  __device__ __forceinline__ void to_float(float (&f)[2]) const {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u));
    f[0] = a.x, f[1] = a.y;
  }
};
template <> struct VRow<4> {
  uint2 u;
  __device__ __forceinline__ void load(const uint8_t* p) { u = *reinterpret_cast<const uint2*>(p); }
  __device__ __forceinline__ void to_float(float (&f)[4]) const {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  }
};
template <> struct VRow<8> {
  uint4 u;
  __device__ __forceinline__ void load(const uint8_t* p) { u = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
      f[2 * k] = a.x, f[2 * k + 1] = a.y;
    }
  }
};
constexpr int kVB = 8;  // V rows loaded together per lane in the P.V loop

template <int HD, int NR>
__global__ void __launch_bounds__(kThreads) attn_vec_kernel(AttnParams p, Shape sh, float* part) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  constexpr int kW = kThreads / kWarp, DL = HD / kWarp;
  __shared__ __align__(16) float qs[NR][HD];
  __shared__ float ps[kW][NR][kWarp];
  __shared__ float wm[kW][NR], wl[kW][NR];
  __shared__ float wacc[kW][NR][HD];
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int len = p.kv_len[t];
  const int lo = (p.window > 0 && len > p.window) ? len - p.window : 0;
  const int start = lo + sp * sh.chunk;
  const int end = sp == sh.n_split - 1 ? len : min(len, start + sh.chunk);
  const int32_t* table = p.tables + static_cast<int64_t>(p.tok_table[t]) * p.table_stride;
  for (int i = tid; i < NR * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    qs[r][d] = __half2float(__float2half_rn(p.q[t * p.q_tok_stride + (g * NR + r) * p.q_head_stride + d]));
  }
  __syncthreads();
  float m[NR], l[NR], acc[NR][DL];
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < DL; ++i) acc[r][i] = 0.0f;
  }
  const uint8_t* kbase = p.k + g * p.k_head_bytes;
  const uint8_t* vbase = p.v + g * p.v_head_bytes;
  for (int j0 = start + warp * kWarp; j0 < end; j0 += kThreads) {
    const int pos = j0 + lane;
    const bool valid = pos < end;
    const int64_t slot = valid ? static_cast<int64_t>(table[pos / p.block_size]) * p.block_size + pos % p.block_size : 0;
    float sc[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) sc[r] = 0.0f;
    if (valid) {
      const uint4* kr = reinterpret_cast<const uint4*>(kbase + slot * p.k_slot_bytes);
#pragma unroll
      for (int c = 0; c < HD / 8; ++c) {
        const uint4 w = kr[c];
        const __half2* h = reinterpret_cast<const __half2*>(&w);
        float kf[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(h[e]);
          kf[2 * e] = f.x, kf[2 * e + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const float4 q0 = *reinterpret_cast<const float4*>(&qs[r][8 * c]);
          const float4 q1 = *reinterpret_cast<const float4*>(&qs[r][8 * c + 4]);
          float a = sc[r];
          a = fmaf(q0.x, kf[0], a), a = fmaf(q0.y, kf[1], a), a = fmaf(q0.z, kf[2], a), a = fmaf(q0.w, kf[3], a);
          a = fmaf(q1.x, kf[4], a), a = fmaf(q1.y, kf[5], a), a = fmaf(q1.z, kf[6], a), a = fmaf(q1.w, kf[7], a);
          sc[r] = a;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float s = valid ? sc[r] * p.scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));  // finite: position j0 (lane 0) is always valid
      const float e = valid ? expf(s - m_new) : 0.0f;
      const float c = expf(m[r] - m_new);  // m = -inf: 0
      l[r] = l[r] * c + warp_sum(e);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < DL; ++i) acc[r][i] *= c;
      ps[warp][r][lane] = e;
    }
    __syncwarp();
    // P.V: the V rows of the warp's positions, kVB rows' loads issued together before their FMAs (a loop of one
    // load and its use per row would leave one load in flight per lane: latency-bound at depth).
    const int nj = min(kWarp, end - j0);
    const auto pv = [&](const VRow<DL>& raw, int jj) {
      float vf[DL];
      raw.to_float(vf);
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float pj = ps[warp][r][jj];
#pragma unroll
        for (int i = 0; i < DL; ++i) acc[r][i] = fmaf(pj, vf[i], acc[r][i]);
      }
    };
    int jj = 0;
    for (; jj + kVB <= nj; jj += kVB) {
      VRow<DL> raw[kVB];
#pragma unroll
      for (int u = 0; u < kVB; ++u) {
        const int64_t sj = __shfl_sync(0xffffffffu, slot, jj + u);
        raw[u].load(vbase + sj * p.v_slot_bytes + lane * DL * 2);
      }
#pragma unroll
      for (int u = 0; u < kVB; ++u) pv(raw[u], jj + u);
    }
    for (; jj < nj; ++jj) {
      const int64_t sj = __shfl_sync(0xffffffffu, slot, jj);
      VRow<DL> raw;
      raw.load(vbase + sj * p.v_slot_bytes + lane * DL * 2);
      pv(raw, jj);
    }
    __syncwarp();
  }
  // Merge the warps: each warp's (m, l, acc) is relative to its own max.
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    if (lane == 0) wm[warp][r] = m[r], wl[warp][r] = l[r];
#pragma unroll
    for (int i = 0; i < DL; ++i) wacc[warp][r][lane * DL + i] = acc[r][i];
  }
  __syncthreads();
  for (int i = tid; i < NR * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kW; ++w) M = fmaxf(M, wm[w][r]);
    float L = 0.0f, o = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kW; ++w) {
        const float f = wm[w][r] == -INFINITY ? 0.0f : expf(wm[w][r] - M);
        L += wl[w][r] * f;
        o += wacc[w][r][d] * f;
      }
    }
    const size_t th = static_cast<size_t>(t) * p.n_head + g * NR + r;
    if (sh.n_split == 1) {
      p.dst[th * HD + d] = L != 0.0f ? o / L : 0.0f;
    } else {
      float* pr = part + (th * sh.n_split + sp) * (HD + 2);
      pr[d] = o;
      if (d == 0) pr[HD] = M, pr[HD + 1] = L;
    }
  }
}

__global__ void __launch_bounds__(kThreads) attn_combine(AttnParams p, Shape sh, const float* part) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const size_t th = blockIdx.x;  // token * n_head + head
  const int Dv = p.hd_v;
  const float* base = part + th * sh.n_split * (Dv + 2);
  float M = -INFINITY;
  for (int s = 0; s < sh.n_split; ++s)
    if (base[s * (Dv + 2) + Dv + 1] != 0.0f) M = fmaxf(M, base[s * (Dv + 2) + Dv]);
  float L = 0.0f;
  for (int s = 0; s < sh.n_split; ++s) {
    const float l = base[s * (Dv + 2) + Dv + 1];
    if (l != 0.0f) L += l * expf(base[s * (Dv + 2) + Dv] - M);
  }
  for (int d = threadIdx.x; d < Dv; d += kThreads) {
    float o = 0.0f;
    for (int s = 0; s < sh.n_split; ++s) {
      const float l = base[s * (Dv + 2) + Dv + 1];
      if (l != 0.0f) o += base[s * (Dv + 2) + d] * expf(base[s * (Dv + 2) + Dv] - M);
    }
    p.dst[th * Dv + d] = L != 0.0f ? o / L : 0.0f;
  }
}

using VecKernel = void (*)(AttnParams, Shape, float*);

template <int HD>
VecKernel vec_kernel_nr(int n_rep) {
  switch (n_rep) {
    case 1: return attn_vec_kernel<HD, 1>;
    case 2: return attn_vec_kernel<HD, 2>;
    case 4: return attn_vec_kernel<HD, 4>;
    case 8: return attn_vec_kernel<HD, 8>;
    default: return nullptr;
  }
}

// The selector of the decode kernel: f16 cache, hd_k == hd_v in {64, 128, 256}, n_rep in {1, 2, 4, 8}, 16-byte
// aligned K/V rows; else attn_kernel.
VecKernel vec_kernel(const AttnParams& p) {
  if (p.kv_type != DType::F16 || p.hd_k != p.hd_v || p.n_head % p.n_head_kv != 0) return nullptr;
  if ((p.k_slot_bytes | p.v_slot_bytes | p.k_head_bytes | p.v_head_bytes) % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v)) % 16 != 0)
    return nullptr;
  const int n_rep = p.n_head / p.n_head_kv;
  switch (p.hd_k) {
    case 64: return vec_kernel_nr<64>(n_rep);
    case 128: return vec_kernel_nr<128>(n_rep);
    case 256: return vec_kernel_nr<256>(n_rep);
    default: return nullptr;
  }
}

}  // namespace

size_t attention_scratch_floats(const AttnParams& p) {
  const Shape s = shape_of(p);
  if (s.n_split == 1) return 0;
  return static_cast<size_t>(p.n_tok) * p.n_head * s.n_split * (p.hd_v + 2);
}

size_t attention_smem_bytes(const AttnParams& p) { return smem_floats(p, shape_of(p)) * sizeof(float); }

Status attention_init(size_t max_smem) {
  KILN_CUDA_TRY(cudaFuncSetAttribute(attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(max_smem)));
  return fattn_mma_init(max_smem);
}

Status launch_attention(const AttnParams& p, float* scratch, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  const Shape sh = shape_of(p);
  const size_t smem = smem_floats(p, sh) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_head_kv), static_cast<unsigned>(sh.n_split));
  if (auto* vec = vec_kernel(p)) {
    KILN_TRY(launch_pdl(vec, grid, dim3(kThreads), 0, s, p, sh, scratch));
  } else {
    attn_kernel<<<grid, kThreads, smem, s>>>(p, sh, scratch);
  }
  KILN_CUDA_LAUNCH_CHECK();
  if (sh.n_split > 1) {
    KILN_TRY(launch_pdl(attn_combine, dim3(static_cast<unsigned>(p.n_tok * p.n_head)), dim3(kThreads), 0, s, p, sh,
                        static_cast<const float*>(scratch)));
    KILN_CUDA_LAUNCH_CHECK();
  }
  return Status::ok();
}

}  // namespace kiln::cuda

// Paged attention over the KV cache (f16, f32 or q8_0 storage), decode and prefill, any head dims.
//   entry: CudaBackend::attention  ->  launch_attention  ->  attn_krow_kernel, attn_vec_kernel or attn_kernel
//          (+ attn_combine when split)
// The decode kernels (f16 cache, head dims 64/128/256, n_rep 1/2/4/8: vec_kernel() selects): attn_krow_kernel (64 /
// 128: HD/8 lanes per K row, coalesced) and attn_vec_kernel (256: a lane per position); both lane-per-dims P.V.
// attn_kernel (below) covers everything else.
// Work item = (token, KV head, split): one 128-thread block serves all n_head/n_head_kv query heads of its GQA
// group, so each KV tile is loaded once per group. The positions [0, kv_len) of the token are cut into n_split
// contiguous ranges (flash-decoding: the split count comes from the host-known bound max_kv_len and the SM count,
// never from tensor values, so a step stays capturable); each split runs an online softmax over tiles of 32
// positions: K tile -> shared (f32) -> scores q.k (thread per (head, position)) -> running max / sum per head ->
// V tile -> shared -> acc += p V (thread per (head, dim)). Splits write (acc, max, sum) and attn_combine merges
// them with the usual rescaling. kv_len 0 (padding) gives a zero row (sum exactly 0); a NaN read from the cache
// propagates to the output (the sum is NaN, not > 0), as on the CPU. Attention sinks (AttnParams::sinks) join each
// row's max and sum exactly once, at its end (row_end): in the kernel when n_split is 1, else in attn_combine (the
// splits' partial rows never hold them). Non-causal attention (encoders: kv_len = the whole sequence for every
// token) needs nothing here: every kernel reads [lo, kv_len[t]) of its own token t, whatever kv_len is. Sliding
// window (KvLayer::window): a token reads [max(0, L - window), L) only, and the splits divide that range (sized from
// min(window, max_kv_len)), so positions and tiles before the window are never read. Prefill of f16 caches at head
// dims 64/128/256 on sm_80+ runs fattn_mma.cu instead (fattn_mma_selected).
// Numerics: f32 throughout; q is rounded to f16 first when the cache is f16 (as the CPU reference and llama.cpp's
// f16 flash attention do); exp in f32.
#include <algorithm>
#include <atomic>
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

// A split's partial row: [0, Dv) the unnormalized output, Dv its max, Dv + 1 its sum; padded to a multiple of 4
// floats so that every row starts 16-byte aligned (attn_combine's float4 reads). Layout: [token][head][split][row].
__host__ __device__ constexpr int part_row(int dv) { return (dv + 2 + 3) / 4 * 4; }
static_assert(kMaxSplit <= kThreads, "attn_combine: one thread per split");

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

// The end of a softmax row: (m, l) its max and sum over the positions (natural-log domain); the sink logit of `head`
// (AttnParams::sinks, null: none) joins both: m' = max(m, sink), l' = l e^(m - m') + e^(sink - m'). The row's output
// is l != 0 ? acc f / l' : 0 with f = e^(m - m') (l = 0: no position, a kv_len 0 padding row, stays zero as without
// sinks); without a sink f = 1 and l' = l, i.e. exactly acc / l.
struct RowEnd {
  float f, l;
};
__device__ __forceinline__ RowEnd row_end(float m, float l, const float* sinks, int head) {
  if (sinks == nullptr || l == 0.0f) return {1.0f, l};
  const float sk = sinks[head], mx = fmaxf(m, sk), f = expf(m - mx);
  return {f, l * f + expf(sk - mx)};
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

  if (sh.n_split == 1) {  // the sinks join here (row_end: corr <- f, lrow <- l'); split, they join in attn_combine
    if (p.sinks) {
      if (tid < n_rep) {
        const RowEnd e = row_end(mrow[tid], lrow[tid], p.sinks, g * n_rep + tid);
        corr[tid] = e.f, lrow[tid] = e.l;  // l' = 0 exactly when l = 0
      }
      __syncthreads();
    }
    for (int i = tid; i < n_rep * Dv; i += kThreads) {
      const int r = i / Dv, d = i % Dv;
      const float l = lrow[r];
      const float a = p.sinks ? acc[i] * corr[r] : acc[i];
      p.dst[(static_cast<size_t>(t) * p.n_head + g * n_rep + r) * Dv + d] = l != 0.0f ? a / l : 0.0f;
    }
  } else {
    for (int i = tid; i < n_rep * Dv; i += kThreads) {
      const int r = i / Dv, d = i % Dv;
      const size_t th = static_cast<size_t>(t) * p.n_head + g * n_rep + r;
      part[(th * sh.n_split + sp) * part_row(Dv) + d] = acc[i];
    }
    if (tid < n_rep) {
      const size_t th = static_cast<size_t>(t) * p.n_head + g * n_rep + tid;
      float* o = part + (th * sh.n_split + sp) * part_row(Dv) + Dv;
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
// p 4*NR*32, the merge NR*(4*HD + 8) floats (NR 8, HD 256: 45 KB static). -Xptxas -v (nvcc 13.0, sm_90, no spills,
// no stack), registers / static smem: HD 64: NR 1 56/1.8K, 2 56/3.6K, 4 64/7.3K, 8 108/14.6K; HD 128: 60/3.1K,
// 64/6.2K, 80/12.4K, 130/24.8K; HD 256: 72/5.7K, 80/11.3K, 128/22.7K, 206/45.3K.
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

// The end of a decode block: merge the 4 warps' (m, l, acc) (each relative to its own max) and write the output row
// (one split) or the split's partial row.
template <int HD, int NR>
__device__ __forceinline__ void decode_merge(const AttnParams& p, const Shape& sh, float* part, const float (&m)[NR],
                                             const float (&l)[NR], const float (&acc)[NR][HD / kWarp],
                                             float (&wm)[kThreads / kWarp][NR], float (&wl)[kThreads / kWarp][NR],
                                             float (&wacc)[kThreads / kWarp][NR][HD]) {
  constexpr int kW = kThreads / kWarp, DL = HD / kWarp;
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / kWarp, lane = tid % kWarp;
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
    if (sh.n_split == 1) {  // the sinks join here; split, they join in attn_combine
      const RowEnd e = row_end(M, L, p.sinks, g * NR + r);
      p.dst[th * HD + d] = L != 0.0f ? o * e.f / e.l : 0.0f;
    } else {
      float* pr = part + (th * sh.n_split + sp) * part_row(HD);
      pr[d] = o;
      if (d == 0) pr[HD] = M, pr[HD + 1] = L;
    }
  }
}

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
  decode_merge<HD, NR>(p, sh, part, m, l, acc, wm, wl, wacc);
}

// attn_krow_kernel<HD, NR, MINB>: the decode path of f16 caches at head dims 64/128 (vec_kernel() selects it where
// measured faster: the ledger there). Same work item, splits, online softmax, P.V and partial layout as
// attn_vec_kernel; what differs is how K is read. attn_vec_kernel gives each lane one position's whole K row, so one
// 16-byte load instruction of a warp touches 32 rows (32 L1 wavefronts, 32 L2 requests). Here CPR = HD/8 lanes
// cover one row with one 16-byte load each (RPI = 32/CPR rows per instruction: whole 128-byte lines), CPR
// instructions per 32-position tile, all issued before their use. Each lane dots its 8 dims with the NR query rows;
// the CPR partial dots of a row are summed by a transpose reduction (log2(CPR) rounds of shuffles, folding halves so
// that CPR/2 partials per head stay live), which leaves lane l with the score of tile row rho = RPI (l % CPR) + l /
// CPR. P.V reads kKrowVB V rows per lane before their FMAs.
// Numerics: f32 dot products (another summation order than attn_vec_kernel's), exp in f32.
// Ledger (per thread): K chunks CPR x 4, partial dots NR x CPR/2, acc NR x HD/32 registers. MINB is the launch-bounds
// block count: 4 caps registers at 128 (a few spilled at HD 128, NR 4) for 4 blocks per SM, the split count's target;
// 1 leaves them free. -Xptxas -v (nvcc 13.0, sm_90, registers / spill-store bytes, MINB 4 then 1): HD 128: NR 1
// 124 / 0, 118 / 0; NR 2 128 / 0, 168 / 0; NR 4 128 / 72, 167 / 0; NR 8 128 / 840, 252 / 0; HD 64: NR 1 92 / 0,
// 86 / 0; NR 2 122 / 0, 122 / 0; NR 4 127 / 0, 128 / 0; NR 8 128 / 408, 198 / 0.
constexpr int kKrowVB = 16;

template <int HD, int NR, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) attn_krow_kernel(AttnParams p, Shape sh, float* part) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  constexpr int kW = kThreads / kWarp, DL = HD / kWarp, CPR = HD / 8, RPI = kWarp / CPR;
  static_assert(HD == 64 || HD == 128, "CPR lanes per row: 8 or 16");
  __shared__ __align__(16) float qs[NR][HD];
  __shared__ float ps[kW][NR][kWarp];
  __shared__ float wm[kW][NR], wl[kW][NR];
  __shared__ float wacc[kW][NR][HD];
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int ch = lane % CPR, sub = lane / CPR;  // this lane's 16-byte chunk of a row, and its row within a load
  const int rho = RPI * ch + sub;               // the tile row whose score this lane holds after the reduction
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
  const uint8_t* kbase = p.k + g * p.k_head_bytes + ch * 16;
  const uint8_t* vbase = p.v + g * p.v_head_bytes + lane * DL * 2;
  for (int j0 = start + warp * kWarp; j0 < end; j0 += kThreads) {
    const int pos = j0 + lane;
    const int slot = pos < end ? table[pos / p.block_size] * p.block_size + pos % p.block_size : 0;
    uint4 kw[CPR];  // row RPI i + sub of the tile, chunk ch (rows past the end read slot 0: valid, unused)
#pragma unroll
    for (int i = 0; i < CPR; ++i) {
      const int sj = __shfl_sync(0xffffffffu, slot, RPI * i + sub);
      kw[i] = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(sj) * p.k_slot_bytes);
    }
    float pd[NR][CPR / 2];
#pragma unroll
    for (int k = 0; k < CPR / 2; ++k) {
      float a[2][NR];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __half2* hv = reinterpret_cast<const __half2*>(&kw[k + h * (CPR / 2)]);
        float kf[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(hv[e]);
          kf[2 * e] = f.x, kf[2 * e + 1] = f.y;
        }
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          const float4 q0 = *reinterpret_cast<const float4*>(&qs[r][8 * ch]);
          const float4 q1 = *reinterpret_cast<const float4*>(&qs[r][8 * ch + 4]);
          float s = q0.x * kf[0];
          s = fmaf(q0.y, kf[1], s), s = fmaf(q0.z, kf[2], s), s = fmaf(q0.w, kf[3], s);
          s = fmaf(q1.x, kf[4], s), s = fmaf(q1.y, kf[5], s), s = fmaf(q1.z, kf[6], s), s = fmaf(q1.w, kf[7], s);
          a[h][r] = s;
        }
      }
      const bool up = lane & (CPR / 2);
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float send = up ? a[0][r] : a[1][r];
        pd[r][k] = (up ? a[1][r] : a[0][r]) + __shfl_xor_sync(0xffffffffu, send, CPR / 2);
      }
    }
#pragma unroll
    for (int o = CPR / 4; o >= 1; o >>= 1) {
      const bool up = lane & o;
#pragma unroll
      for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int k = 0; k < o; ++k) {
          const float send = up ? pd[r][k] : pd[r][k + o];
          pd[r][k] = (up ? pd[r][k + o] : pd[r][k]) + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    const bool valid = j0 + rho < end;
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const float s = valid ? pd[r][0] * p.scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));  // finite: tile row 0 (lane 0) is always valid
      const float e = valid ? expf(s - m_new) : 0.0f;
      const float c = expf(m[r] - m_new);
      l[r] = l[r] * c + warp_sum(e);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < DL; ++i) acc[r][i] *= c;
      ps[warp][r][rho] = e;
    }
    __syncwarp();
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
    for (; jj + kKrowVB <= nj; jj += kKrowVB) {
      VRow<DL> raw[kKrowVB];
#pragma unroll
      for (int u = 0; u < kKrowVB; ++u) {
        const int sj = __shfl_sync(0xffffffffu, slot, jj + u);
        raw[u].load(vbase + static_cast<int64_t>(sj) * p.v_slot_bytes);
      }
#pragma unroll
      for (int u = 0; u < kKrowVB; ++u) pv(raw[u], jj + u);
    }
    for (; jj < nj; ++jj) {
      const int sj = __shfl_sync(0xffffffffu, slot, jj);
      VRow<DL> raw;
      raw.load(vbase + static_cast<int64_t>(sj) * p.v_slot_bytes);
      pv(raw, jj);
    }
    __syncwarp();
  }
  decode_merge<HD, NR>(p, sh, part, m, l, acc, wm, wl, wacc);
}

// attn_combine: one block per (token, head) merges its n_split partial rows (flash-decoding's second pass), and the
// head's sink joins the merged (M, L) (row_end).
// Every load is independent of the others, so the pass costs a few memory latencies whatever n_split is: thread s
// reads split s's (max, sum); the block max M, the factors w_s = exp(m_s - M) (0 for a split that saw no position) and
// L = sum l_s w_s (a fixed-order tree: the same bits every launch); then thread (group gi, column c) sums float4 column c
// of splits gi, gi + G, ... in order, and the G group sums are added in group order. A split with l = 0 contributes 0
// (its row may hold anything). Shared: w[kMaxSplit], the G x C float4 group sums (G C <= kThreads), 4 warp values.
__global__ void __launch_bounds__(kThreads) attn_combine(AttnParams p, int n_split, const float* part) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  constexpr int kW = kThreads / kWarp;
  __shared__ float w[kMaxSplit], red[kW];
  __shared__ float4 gsum[kThreads];
  const size_t th = blockIdx.x;  // token * n_head + head
  const int Dv = p.hd_v, R = part_row(Dv), S = n_split, tid = threadIdx.x, lane = tid % kWarp, wp = tid / kWarp;
  const float* base = part + th * S * R;
  const float l_s = tid < S ? base[tid * R + Dv + 1] : 0.0f;
  const float m_s = l_s != 0.0f ? base[tid * R + Dv] : -INFINITY;
  float v = warp_max(m_s);
  if (lane == 0) red[wp] = v;
  __syncthreads();
  float M = red[0];
#pragma unroll
  for (int i = 1; i < kW; ++i) M = fmaxf(M, red[i]);
  const float w_s = l_s != 0.0f ? expf(m_s - M) : 0.0f;  // M = -inf only when every l_s is 0
  if (tid < S) w[tid] = w_s;
  v = warp_sum(l_s * w_s);
  __syncthreads();  // every warp read red[] (M) before it is reused
  if (lane == 0) red[wp] = v;
  __syncthreads();
  float L = 0.0f;
#pragma unroll
  for (int i = 0; i < kW; ++i) L += red[i];
  const RowEnd e = row_end(M, L, p.sinks, static_cast<int>(th % p.n_head));  // the sink joins the merged row
  float* dst = p.dst + th * Dv;
  if (Dv % 4 != 0 || Dv > 4 * kThreads) {  // no head dim of a known model; plain columns
    for (int d = tid; d < Dv; d += kThreads) {
      float o = 0.0f;
      for (int s = 0; s < S; ++s) o += w[s] != 0.0f ? base[s * R + d] * w[s] : 0.0f;
      dst[d] = L != 0.0f ? o * e.f / e.l : 0.0f;
    }
    return;
  }
  const int C = Dv / 4, G = kThreads / C, c = tid % C, gi = tid / C;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (gi < G) {
#pragma unroll 8
    for (int s = gi; s < S; s += G) {
      const float4 x = *reinterpret_cast<const float4*>(base + s * R + 4 * c);
      const float ws = w[s];
      if (ws != 0.0f) o.x += x.x * ws, o.y += x.y * ws, o.z += x.z * ws, o.w += x.w * ws;
    }
    gsum[gi * C + c] = o;
  }
  __syncthreads();
  if (tid < C) {
    float4 r = gsum[tid];
    for (int g = 1; g < G; ++g) {
      const float4 x = gsum[g * C + tid];
      r.x += x.x, r.y += x.y, r.z += x.z, r.w += x.w;
    }
    const bool ok = L != 0.0f;
    dst[4 * tid] = ok ? r.x * e.f / e.l : 0.0f, dst[4 * tid + 1] = ok ? r.y * e.f / e.l : 0.0f;
    dst[4 * tid + 2] = ok ? r.z * e.f / e.l : 0.0f, dst[4 * tid + 3] = ok ? r.w * e.f / e.l : 0.0f;
  }
}

using VecKernel = void (*)(AttnParams, Shape, float*);

// The decode kernels, by name (attention_force_decode's indices).
enum class DecodeKernel { kVec = 0, kKrow4 = 1, kKrow1 = 2 };
std::atomic<int> g_decode_forced{-1};

template <int HD, int NR>
VecKernel decode_instance(DecodeKernel k) {
  if constexpr (HD <= 128) {
    if (k == DecodeKernel::kKrow4) return attn_krow_kernel<HD, NR, 4>;
    if (k == DecodeKernel::kKrow1) return attn_krow_kernel<HD, NR, 1>;
  }
  return k == DecodeKernel::kVec ? attn_vec_kernel<HD, NR> : nullptr;
}

template <int HD>
VecKernel decode_instance_nr(DecodeKernel k, int n_rep) {
  switch (n_rep) {
    case 1: return decode_instance<HD, 1>(k);
    case 2: return decode_instance<HD, 2>(k);
    case 4: return decode_instance<HD, 4>(k);
    case 8: return decode_instance<HD, 8>(k);
    default: return nullptr;
  }
}

// The selector of the decode kernel: f16 cache, hd_k == hd_v in {64, 128, 256}, n_rep in {1, 2, 4, 8}, 16-byte
// aligned K/V rows; else attn_kernel (null). Head dims 64 / 128 take attn_krow_kernel, 256 attn_vec_kernel (a K row
// would be a whole warp's loads there; not built). attn_krow_kernel's block count (launch bounds): 4 per SM
// (registers capped at 128) only where the grid needs all 4 to run in one wave, i.e. more blocks than 3 per SM and
// at most 4 (the split count aims at 4: one or two sequences at depth), and not at n_rep 8 (its 4-per-SM build
// spills 0.8 KB at hd 128); else 1 (no cap, no spills: 167 registers at hd 128, n_rep 4, 3 per SM).
// Measured (H100, dev/cuda/attn_decode_bench, ms; attn_vec_kernel / krow 4 / krow 1; hd 128, 8 KV heads, n_rep 4
// unless said): 1 sequence at 2048 (256 blocks) 0.0170 / 0.0172 / 0.0158; at 32768 (528) 0.0737 / 0.0651 / 0.0748;
// at 131072 0.2486 / 0.2137 / 0.2323; 2 at 32768 (528) 0.1311 / 0.1156 / 0.1313; 4 (544) 0.2530 / 0.2525 /
// 0.2330; 8 (576) 0.4684 / 0.5117 / 0.4198; 32 at 8192 0.4485 / 0.4412 / 0.3635; 64 at 512 0.0575 / 0.0543 /
// 0.0520; n_rep 1 / 2, 1 at 32768: 0.0658 / 0.0554 / 0.0561, 0.0684 / 0.0581 / 0.0650; n_rep 8: 1 at 32768
// 0.1222 / 0.1357 / 0.0900, 8 at 32768 0.7259 / 1.2316 / 0.6950; hd 64, 1 at 32768: 0.0503 / 0.0408 / 0.0419, 8 at
// 32768: 0.2732 / 0.2793 / 0.2787.
DecodeKernel decode_kernel_for(const AttnParams& p, const Shape& sh) {
  const int forced = g_decode_forced.load(std::memory_order_relaxed);
  if (forced >= 0 && forced <= 2 && (p.hd_k <= 128 || forced == 0)) return static_cast<DecodeKernel>(forced);
  if (p.hd_k > 128) return DecodeKernel::kVec;
  const int64_t blocks = static_cast<int64_t>(p.n_tok) * p.n_head_kv * sh.n_split, sms = std::max(p.n_sm, 1);
  const bool four = sh.n_rep <= 4 && blocks > 3 * sms && blocks <= kBlocksPerSm * sms;
  return four ? DecodeKernel::kKrow4 : DecodeKernel::kKrow1;
}

VecKernel vec_kernel(const AttnParams& p, const Shape& sh) {
  if (p.kv_type != DType::F16 || p.hd_k != p.hd_v || p.n_head % p.n_head_kv != 0) return nullptr;
  if ((p.k_slot_bytes | p.v_slot_bytes | p.k_head_bytes | p.v_head_bytes) % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v)) % 16 != 0)
    return nullptr;
  const int n_rep = p.n_head / p.n_head_kv;
  const DecodeKernel k = decode_kernel_for(p, sh);
  switch (p.hd_k) {
    case 64: return decode_instance_nr<64>(k, n_rep);
    case 128: return decode_instance_nr<128>(k, n_rep);
    case 256: return decode_instance_nr<256>(k, n_rep);
    default: return nullptr;
  }
}

}  // namespace

size_t attention_scratch_floats(const AttnParams& p) {
  const Shape s = shape_of(p);
  if (s.n_split == 1) return 0;
  return static_cast<size_t>(p.n_tok) * p.n_head * s.n_split * part_row(p.hd_v);
}

int attention_part_row(int dv) { return part_row(dv); }

void attention_force_decode(int kernel) { g_decode_forced.store(kernel, std::memory_order_relaxed); }

Status launch_attention_combine(const AttnParams& p, int n_split, const float* part, cudaStream_t s) {
  if (n_split < 1 || n_split > kMaxSplit)
    return make_error(ErrorCode::kInternal, "attention: %d splits (1..%d)", n_split, kMaxSplit);
  KILN_TRY(launch_pdl(attn_combine, dim3(static_cast<unsigned>(p.n_tok * p.n_head)), dim3(kThreads), 0, s, p, n_split,
                      part));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
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
  if (auto* vec = vec_kernel(p, sh)) {
    KILN_TRY(launch_pdl(vec, grid, dim3(kThreads), 0, s, p, sh, scratch));
  } else {
    attn_kernel<<<grid, kThreads, smem, s>>>(p, sh, scratch);
  }
  KILN_CUDA_LAUNCH_CHECK();
  if (sh.n_split > 1) KILN_TRY(launch_attention_combine(p, sh.n_split, scratch, s));
  return Status::ok();
}

}  // namespace kiln::cuda

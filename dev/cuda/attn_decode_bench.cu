// Decode attention micro-benchmark: attention.cu's split-KV decode kernel (attn_vec_kernel, the reference) against
// `dec_kernel` below, a variant with coalesced K reads. Same work item (token, KV head, split), splits, partial
// layout and combine as attention.cu; f16 cache, hd 64/128, n_rep 4 (llama3-8b: 32 query / 8 KV heads).
//
// What differs in dec_kernel (the hypothesis it tests): attn_vec_kernel gives each lane one position and lets it read
// that position's whole K row, so one 16-byte load instruction of a warp touches 32 different rows (32 L1 wavefronts,
// 32 L2 requests of 16 bytes). dec_kernel reads K row-contiguously: CPR = HD/8 lanes cover one row's HD halves with
// one 16-byte load each, RPI = 32/CPR rows per instruction (HD 128: 2 rows, 512 contiguous bytes per row pair
// instruction), CPR instructions per 32-position tile. Each lane dots its 8 dims with the NR query heads; the CPR
// partial dots of a row are summed by a transpose reduction (log2(CPR) shuffle rounds, CPR-1 shuffles per head),
// which leaves lane l with the score of tile row RPI*(l % CPR) + l / CPR. Softmax and P.V are attn_vec_kernel's,
// with KVB V rows' loads in flight per lane (8 there).
//
// Usage: attn_decode_bench [blocks_per_sm]   (the split count's target; attention.cu uses 4)
// Prints per shape: ms and KV GB/s of each kernel, the variant's NMSE against the reference (~1e-12 expected: only
// the summation order of q.k differs), and the device copy bandwidth (cudaMemcpy D2D, read + write) as the ceiling.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "bench_util.cuh"

using namespace kiln;
using namespace kiln::cuda;

namespace {

constexpr int kTile = 32, kThreads = 128, kMaxSplit = 128, kMinSplitLen = 64;

struct Sh {
  int n_split, chunk;
};

// attention.cu's shape_of with the blocks-per-SM target as a parameter (no window here).
Sh shape_of(const AttnParams& p, int blocks_per_sm) {
  Sh s{1, INT_MAX};
  const int span = p.max_kv_len;
  const int items = std::max(1, p.n_tok * p.n_head_kv);
  const int want = ceil_div(blocks_per_sm * std::max(p.n_sm, 1), items);
  const int by_len = std::max(1, span / kMinSplitLen);
  s.n_split = std::clamp(std::min(want, by_len), 1, kMaxSplit);
  if (s.n_split > 1) s.chunk = ceil_div(ceil_div(span, s.n_split), kTile) * kTile;
  return s;
}

template <int HD, int NR, int KVB, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) dec_kernel(AttnParams p, Sh sh, float* part) {
  constexpr int kW = kThreads / kWarp, DL = HD / kWarp, CPR = HD / 8, RPI = kWarp / CPR;
  static_assert(HD == 64 || HD == 128, "CPR lanes per row: 8 or 16");
  static_assert(DL == 2 || DL == 4, "V row piece per lane: 4 or 8 bytes");
  using VPiece = std::conditional_t<DL == 4, uint2, uint32_t>;
  __shared__ __align__(16) float qs[NR][HD];
  __shared__ float ps[kW][NR][kWarp];
  __shared__ float wm[kW][NR], wl[kW][NR];
  __shared__ float wacc[kW][NR][HD];
  const int t = blockIdx.x, g = blockIdx.y, sp = blockIdx.z, tid = threadIdx.x;
  const int warp = tid / kWarp, lane = tid % kWarp;
  const int ch = lane % CPR, sub = lane / CPR;  // this lane's 16-byte chunk of a row, and its row within a load
  const int rho = RPI * ch + sub;               // the tile row whose score this lane holds after the reduction
  const int len = p.kv_len[t];
  const int start = sp * sh.chunk;
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
    // K: CPR coalesced loads (row RPI*i + sub of the tile), issued together.
    uint4 kw[CPR];
#pragma unroll
    for (int i = 0; i < CPR; ++i) {
      const int sj = __shfl_sync(0xffffffffu, slot, RPI * i + sub);
      kw[i] = *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(sj) * p.k_slot_bytes);
    }
    // Partial dots over this lane's 8 dims, then the transpose reduction. Pairs (k, k + CPR/2) are dotted and
    // folded first so that only CPR/2 partials per head stay live.
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
    const auto pv = [&](const VPiece& raw, int jj) {
      float vf[DL];
      const __half2* hv = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
      for (int e = 0; e < DL / 2; ++e) {
        const float2 f = __half22float2(hv[e]);
        vf[2 * e] = f.x, vf[2 * e + 1] = f.y;
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float pj = ps[warp][r][jj];
#pragma unroll
        for (int i = 0; i < DL; ++i) acc[r][i] = fmaf(pj, vf[i], acc[r][i]);
      }
    };
    int jj = 0;
    for (; jj + KVB <= nj; jj += KVB) {
      VPiece raw[KVB];
#pragma unroll
      for (int u = 0; u < KVB; ++u) {
        const int sj = __shfl_sync(0xffffffffu, slot, jj + u);
        raw[u] = *reinterpret_cast<const VPiece*>(vbase + static_cast<int64_t>(sj) * p.v_slot_bytes);
      }
#pragma unroll
      for (int u = 0; u < KVB; ++u) pv(raw[u], jj + u);
    }
    for (; jj < nj; ++jj) {
      const int sj = __shfl_sync(0xffffffffu, slot, jj);
      pv(*reinterpret_cast<const VPiece*>(vbase + static_cast<int64_t>(sj) * p.v_slot_bytes), jj);
    }
    __syncwarp();
  }
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

__global__ void combine(AttnParams p, Sh sh, const float* part) {
  const size_t th = blockIdx.x;
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
  for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < sh.n_split; ++s) {
      const float l = base[s * (Dv + 2) + Dv + 1];
      if (l != 0.0f) o += base[s * (Dv + 2) + d] * expf(base[s * (Dv + 2) + Dv] - M);
    }
    p.dst[th * Dv + d] = L != 0.0f ? o / L : 0.0f;
  }
}

template <int HD, int KVB, int MINB>
void launch_dec(const AttnParams& p, const Sh& sh, float* part, cudaStream_t st) {
  const dim3 grid(p.n_tok, p.n_head_kv, sh.n_split);
  dec_kernel<HD, 4, KVB, MINB><<<grid, kThreads, 0, st>>>(p, sh, part);
  if (sh.n_split > 1) combine<<<p.n_tok * p.n_head, kThreads, 0, st>>>(p, sh, part);
}

__device__ __forceinline__ float hash_unit(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = amp * hash_unit(i, seed);
}
__global__ void fill_f16(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = __float2half(hash_unit(i, seed));
}

template <typename F>
double median_ms(F&& f, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps) {
  std::vector<float> ms;
  for (int i = 0; i < reps + 1; ++i) {
    CK(cudaEventRecord(e0, st));
    f();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int bps = argc > 1 ? std::atoi(argv[1]) : 4;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  SK(attention_init(prop.sharedMemPerBlockOptin));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  {  // the ceiling: a 1 GiB device-to-device copy, read + write bytes
    const size_t n = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    const double ms = median_ms([&] { CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st)); }, st, e0, e1, 5);
    std::printf("device %s, %d SMs; copy %.0f GB/s (read + write); split target %d blocks per SM\n", prop.name,
                prop.multiProcessorCount, 2.0 * n / (ms * 1e-3) / 1e9, bps);
    cudaFree(a), cudaFree(b);
  }
  std::printf("%-3s %-5s %-7s | %8s %6s | %24s | %24s | %24s\n", "hd", "n_seq", "depth", "ref ms", "GB/s",
              "kvb 8, minb 4: ms GB/s nmse", "kvb 16, minb 4", "kvb 16, minb 1");
  struct D { int hd, n_seq, depth; };
  for (const D& d : {D{128, 1, 8192}, D{128, 1, 32768}, D{128, 1, 131072}, D{128, 8, 32768}, D{128, 32, 8192},
                     D{64, 1, 32768}}) {
    const int hd = d.hd, n_head = 32, n_kv = 8, bs = 16, n_blocks = (d.depth + bs - 1) / bs;
    const size_t kv_row = static_cast<size_t>(n_kv) * hd, n_slots = static_cast<size_t>(d.n_seq) * n_blocks * bs;
    __half *k = nullptr, *v = nullptr;
    float *q = nullptr, *o = nullptr, *scratch = nullptr, *scratch2 = nullptr;
    int32_t *table = nullptr, *tok_table = nullptr, *kv_len = nullptr;
    CK(cudaMalloc(&k, n_slots * kv_row * 2));
    CK(cudaMalloc(&v, n_slots * kv_row * 2));
    const size_t qn = static_cast<size_t>(d.n_seq) * n_head * hd;
    CK(cudaMalloc(&q, qn * 4));
    CK(cudaMalloc(&o, qn * 4));
    fill_f16<<<1024, 256, 0, st>>>(k, n_slots * kv_row, 1);
    fill_f16<<<1024, 256, 0, st>>>(v, n_slots * kv_row, 2);
    fill_f32<<<1024, 256, 0, st>>>(q, qn, 3, 2.0f);
    std::vector<int32_t> tb(static_cast<size_t>(d.n_seq) * n_blocks), tt(d.n_seq), kl(d.n_seq);
    std::iota(tb.begin(), tb.end(), 0);
    std::shuffle(tb.begin(), tb.end(), std::mt19937(5));
    std::iota(tt.begin(), tt.end(), 0);
    for (int s = 0; s < d.n_seq; ++s) kl[s] = d.depth - 7 * s;  // ragged ends: partial last tiles
    CK(cudaMalloc(&table, tb.size() * 4));
    CK(cudaMalloc(&tok_table, tt.size() * 4));
    CK(cudaMalloc(&kv_len, kl.size() * 4));
    CK(cudaMemcpy(table, tb.data(), tb.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tok_table, tt.data(), tt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(kv_len, kl.data(), kl.size() * 4, cudaMemcpyHostToDevice));
    AttnParams p{};
    p.q = q, p.q_tok_stride = static_cast<size_t>(n_head) * hd, p.q_head_stride = hd, p.dst = o;
    p.k = reinterpret_cast<const uint8_t*>(k), p.v = reinterpret_cast<const uint8_t*>(v);
    p.k_slot_bytes = p.v_slot_bytes = kv_row * 2, p.k_head_bytes = p.v_head_bytes = static_cast<size_t>(hd) * 2;
    p.kv_type = DType::F16, p.n_tok = d.n_seq, p.n_head = n_head, p.n_head_kv = n_kv, p.hd_k = p.hd_v = hd;
    p.block_size = bs, p.tables = table, p.table_stride = n_blocks, p.tok_table = tok_table, p.kv_len = kv_len;
    p.scale = 1.0f / std::sqrt(static_cast<float>(hd)), p.max_kv_len = d.depth, p.n_sm = prop.multiProcessorCount;
    if (const size_t sc = attention_scratch_floats(p)) CK(cudaMalloc(&scratch, sc * 4));
    const Sh sh = shape_of(p, bps);
    CK(cudaMalloc(&scratch2, static_cast<size_t>(p.n_tok) * n_head * sh.n_split * (hd + 2) * 4));
    std::vector<float> ref(qn), got(qn);
    auto nmse = [&] {
      CK(cudaMemcpy(got.data(), o, qn * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < qn; ++i) num += (got[i] - ref[i]) * double(got[i] - ref[i]), den += ref[i] * double(ref[i]);
      return den > 0 ? num / den : num;
    };
    const double t_ref = median_ms([&] { SK(launch_attention(p, scratch, st)); }, st, e0, e1, 7);
    CK(cudaMemcpy(ref.data(), o, qn * 4, cudaMemcpyDeviceToHost));
    // variants: (KVB, MINB) = (8, 4), (16, 4), (16, 1): V rows in flight per lane, the launch-bounds block count
    // (4: at most 128 registers, a few spilled; 1: unbounded, 168 registers at hd 128, 3 blocks per SM)
    double tv[3], nv[3];
    for (int v = 0; v < 3; ++v) {
      auto go = [&] {
        if (hd == 128) {
          if (v == 0) launch_dec<128, 8, 4>(p, sh, scratch2, st);
          if (v == 1) launch_dec<128, 16, 4>(p, sh, scratch2, st);
          if (v == 2) launch_dec<128, 16, 1>(p, sh, scratch2, st);
        } else {
          if (v == 0) launch_dec<64, 8, 4>(p, sh, scratch2, st);
          if (v == 1) launch_dec<64, 16, 4>(p, sh, scratch2, st);
          if (v == 2) launch_dec<64, 16, 1>(p, sh, scratch2, st);
        }
      };
      tv[v] = median_ms(go, st, e0, e1, 7);
      CK(cudaGetLastError());
      nv[v] = nmse();
    }
    double bytes = 0;
    for (int s = 0; s < d.n_seq; ++s) bytes += 2.0 * 2.0 * kl[s] * n_kv * hd;
    auto gbs = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
    std::printf("%-3d %-5d %-7d | %8.4f %6.0f", hd, d.n_seq, d.depth, t_ref, gbs(t_ref));
    for (int v = 0; v < 3; ++v) std::printf(" | %8.4f %6.0f %7.1e", tv[v], gbs(tv[v]), nv[v]);
    std::printf("\n");
    std::fflush(stdout);
    cudaFree(k), cudaFree(v), cudaFree(q), cudaFree(o), cudaFree(table), cudaFree(tok_table), cudaFree(kv_len);
    if (scratch) cudaFree(scratch);
    cudaFree(scratch2);
  }
  return 0;
}

// mmf_bench: an experiment for the many-token GEMM at 8..128 tokens. The backend's mmq (int8 MMA on q8_1
// activations) is bound by instruction issue there: per 32 K and output it spends 4 f32 operations on scales (ncu:
// docs/BENCHMARKS.md, 2026-12-02 02fa592 .. b83eced). Here the scales go into the weights instead: Q4_K weights are
// dequantized in registers straight into f16 A fragments (the weight rows as M; two nibbles -> one f16x2 with a
// byte permute, an exact subtraction and one fused multiply-add per pair: w = q * (d * sc) - dmin * m in f16), the
// activations are f16 tiles copied with cp.async (ldmatrix B fragments), mma.sync m16n8k16 accumulates in f32, so
// no f32 work remains per output and sub-block. Split-K by atomicAdd (a timing experiment: not deterministic).
//
// Numerics (what a backend kernel of this design would compute): d * sc and dmin * m rounded to f16 once per
// (row, sub-block), then one f16 rounding of q * s - m per weight; activations rounded to f16; f32 accumulation
// (the tensor core's). Checked here against f64 math on the dequantized weights and f32 activations (NMSE).
//
// Geometry (template): WARPS x 16 weight rows per block (each warp one m16 tile and every token of the block: no
// weight is dequantized twice), BN tokens, K stage 128 (half a super-block: a 16-byte header chunk + 64 qs bytes
// per row, 80-byte smem rows: the A loads of 8 rows x 4 lanes fall in distinct banks), SL slots (SL - 2 stages in
// flight ahead of the computed one), activations in 272-byte rows (17 x 16 bytes: conflict-free ldmatrix).
//
// Build: the CMake target mmf_bench (KILN_CUDA=ON); run: mmf_bench [n_toks] (default 8,16,32,64,128).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/mmq_common.cuh"
#include "backend/cuda/quant.cuh"
#include "bench_util.cuh"

namespace kiln {
namespace {
using cuda::kq_scale_min;
using cuda::mmq_cp16;
using cuda::mmq_cp_commit;
using cuda::mmq_cp_wait_group;
using cuda::mmq_ldsm4;

constexpr int kKS = 128, kWPitch = 80, kXPitch = kKS + 8, kQ4KBytes = 144;

template <int WARPS, int BN, int SL>
struct MmfSmem {
  static constexpr int BM = 16 * WARPS;
  uint8_t w[SL][BM][kWPitch];
  __half x[SL][BN][kXPitch];
  __half2 sm[2][BM][kKS / 32];  // (d * sc, -(dmin * m)) per row and sub-block of the stage
};

__device__ __forceinline__ uint32_t h2u(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 u2h(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }
__device__ __forceinline__ uint32_t lds16(const void* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
// Two nibbles (bytes sel of nib) -> f16x2 of q * s - m.
__device__ __forceinline__ uint32_t dq2(uint32_t nib, uint32_t sel, __half2 k1024, __half2 s, __half2 nm) {
  const __half2 q = __hsub2(u2h(__byte_perm(nib, 0x64u, sel)), k1024);  // 1024 + q - 1024: exact
  return h2u(__hfma2(q, s, nm));
}

template <int WARPS, int BN, int SL>
__global__ void __launch_bounds__(32 * WARPS) mmf_q4k_kernel(const uint8_t* __restrict__ w, size_t row_bytes,
                                                           const __half* __restrict__ x, int64_t n_in,
                                                           int64_t n_out, int64_t n_tok, float* __restrict__ y,
                                                           int n_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using S = MmfSmem<WARPS, BN, SL>;
  constexpr int BM = S::BM, NTH = 32 * WARPS, NT = BN / 8;
  static_assert(NT % 2 == 0);
  extern __shared__ __align__(16) unsigned char mmf_smem[];
  S& sm = *reinterpret_cast<S*>(mmf_smem);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * BM, t0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int n_all = static_cast<int>(n_in / kKS), z = static_cast<int>(blockIdx.z);
  const int sb = static_cast<int>(static_cast<int64_t>(z) * n_all / n_split);
  const int se = static_cast<int>(static_cast<int64_t>(z + 1) * n_all / n_split);
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  const auto issue = [&](int st) {
    if (st < se) {
      const int slot = st % SL, kb = st / 2, hs = st % 2;
      for (int i = tid; i < BM * 5; i += NTH) {
        const int r = i / 5, c = i % 5;
        const int64_t row = r0 + r;
        const bool ok = row < n_out;
        const int src = c == 0 ? 0 : 16 + 64 * hs + 16 * (c - 1);
        mmq_cp16(&sm.w[slot][r][16 * c], ok ? w + row * row_bytes + static_cast<size_t>(kb) * kQ4KBytes + src : w, ok);
      }
      for (int i = tid; i < BN * (kKS / 8); i += NTH) {
        const int n = i / (kKS / 8), c = i % (kKS / 8);
        const int64_t tk = t0 + n;
        const bool ok = tk < n_tok;
        mmq_cp16(&sm.x[slot][n][8 * c], ok ? x + tk * n_in + static_cast<int64_t>(st) * kKS + 8 * c : x, ok);
      }
    }
    mmq_cp_commit();
  };
  const auto scales = [&](int st) {
    const int slot = st % SL, hs = st % 2, buf = st & 1;
    for (int i = tid; i < BM * 4; i += NTH) {
      const int r = i / 4, j = i % 4;
      const uint4 hdr = *reinterpret_cast<const uint4*>(&sm.w[slot][r][0]);
      int sc, mn;
      kq_scale_min(4 * hs + j, hdr.y, hdr.z, hdr.w, &sc, &mn);
      const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(hdr.x)));
      const float dmin = __half2float(__ushort_as_half(static_cast<uint16_t>(hdr.x >> 16)));
      sm.sm[buf][r][j] = __floats2half2_rn(d * static_cast<float>(sc), -(dmin * static_cast<float>(mn)));
    }
  };

#pragma unroll
  for (int s = 0; s < SL - 1; ++s) issue(sb + s);
  mmq_cp_wait_group<SL - 2>();
  __syncthreads();
  scales(sb);
  const __half2 k1024 = __float2half2_rn(1024.0f);
  const int rb = 16 * warp;
  for (int st = sb; st < se; ++st) {
    mmq_cp_wait_group<SL - 3>();  // stage st + 1 landed
    __syncthreads();              // and everyone's; stage st's scales visible; stage st - 1's slot free
    issue(st + SL - 1);
    if (st + 1 < se) scales(st + 1);
    const int slot = st % SL, buf = st & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2 pa = sm.sm[buf][rb + g][j], pb = sm.sm[buf][rb + g + 8][j];
      const __half2 sa = __low2half2(pa), na = __high2half2(pa), sbb = __low2half2(pb), nb = __high2half2(pb);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int off = 16 + 32 * (j >> 1) + 16 * h + 2 * t;
        const uint32_t va = lds16(&sm.w[slot][rb + g][off]) | (lds16(&sm.w[slot][rb + g][off + 8]) << 16);
        const uint32_t vb = lds16(&sm.w[slot][rb + g + 8][off]) | (lds16(&sm.w[slot][rb + g + 8][off + 8]) << 16);
        const uint32_t qa = (va >> (4 * (j & 1))) & 0x0F0F0F0Fu, qb = (vb >> (4 * (j & 1))) & 0x0F0F0F0Fu;
        const uint32_t A[4] = {dq2(qa, 0x4140u, k1024, sa, na), dq2(qb, 0x4140u, k1024, sbb, nb),
                               dq2(qa, 0x4342u, k1024, sa, na), dq2(qb, 0x4342u, k1024, sbb, nb)};
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t B[4];
          mmq_ldsm4(B, &sm.x[slot][np * 16 + (lane & 7) + 8 * (lane >> 4)][32 * j + 16 * h + 8 * ((lane >> 3) & 1)]);
          const uint32_t b0[2] = {B[0], B[1]}, b1[2] = {B[2], B[3]};
          cuda::mma_f_k16<false>(acc[2 * np], A, b0);
          cuda::mma_f_k16<false>(acc[2 * np + 1], A, b1);
        }
      }
    }
  }
  mmq_cp_wait_group<0>();
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = r0 + rb + g + 8 * (i >> 1), tk = t0 + nt * 8 + 2 * t + (i & 1);
      if (row < n_out && tk < n_tok) atomicAdd(&y[tk * n_out + row], acc[nt][i]);
    }
#endif
}

__global__ void to_f16_kernel(const float* __restrict__ x, __half* __restrict__ h, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = __float2half_rn(x[i]);
}

struct Config {
  const char* name;
  void (*run)(const uint8_t*, size_t, const __half*, int64_t, int64_t, int64_t, float*, int);
};

int g_sms = 132;

template <int WARPS, int BN, int SL>
void run_cfg(const uint8_t* w, size_t rb, const __half* x, int64_t n_in, int64_t n_out, int64_t n_tok, float* y,
             int /*unused*/) {
  using S = MmfSmem<WARPS, BN, SL>;
  static int per_sm = 0;
  if (!per_sm) {
    CK(cudaFuncSetAttribute(mmf_q4k_kernel<WARPS, BN, SL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            static_cast<int>(sizeof(S))));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mmf_q4k_kernel<WARPS, BN, SL>, 32 * WARPS,
                                                     sizeof(S)));
    if (per_sm < 1) per_sm = 1;
  }
  const int64_t tx = (n_tok + BN - 1) / BN, ty = (n_out + S::BM - 1) / S::BM, n_stage = n_in / kKS;
  const int64_t slots = static_cast<int64_t>(per_sm) * g_sms;
  int split = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n_stage / 2, slots / (tx * ty))));
  CK(cudaMemsetAsync(y, 0, static_cast<size_t>(n_out * n_tok) * 4));
  mmf_q4k_kernel<WARPS, BN, SL><<<dim3(static_cast<unsigned>(tx), static_cast<unsigned>(ty), split), 32 * WARPS,
                                   sizeof(S)>>>(w, rb, x, n_in, n_out, n_tok, y, split);
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  using namespace kiln;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::vector<int64_t> toks = {8, 16, 32, 64, 128};
  if (argc > 1) {
    toks.clear();
    for (const char* s = argv[1]; *s;) {
      toks.push_back(std::atoll(s));
      while (*s && *s != ',') ++s;
      if (*s) ++s;
    }
  }
  const Config cfgs[] = {
      {"4w x16 s5", run_cfg<4, 16, 5>}, {"8w x16 s5", run_cfg<8, 16, 5>}, {"4w x32 s4", run_cfg<4, 32, 4>},
      {"8w x32 s4", run_cfg<8, 32, 4>}, {"4w x64 s3", run_cfg<4, 64, 3>}, {"8w x64 s3", run_cfg<8, 64, 3>},
  };
  struct Shape {
    const char* name;
    int64_t n_out, n_in, count;
  } shapes[] = {{"q/o", 4096, 4096, 2}, {"k/v", 1024, 4096, 2}, {"gate/up", 14336, 4096, 2}, {"down", 4096, 14336, 1}};
  std::mt19937 rng(7);
  int fails = 0;
  for (int64_t n_tok : toks) {
    std::vector<double> layer(sizeof(cfgs) / sizeof(cfgs[0]), 0.0);
    for (const Shape& sh : shapes) {
      const DType t = DType::Q4_K;
      const size_t rb = dtype_row_bytes(t, sh.n_in).value();
      std::vector<uint8_t> wb = random_weights(t, sh.n_in, sh.n_out, rng);
      std::vector<float> xf(static_cast<size_t>(sh.n_in * n_tok));
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (float& v : xf) v = u(rng);
      constexpr int kCopies = 3;  // rotated: the weights of one launch are not in L2 from the previous one
      uint8_t* dw[kCopies];
      for (auto& p : dw) {
        CK(cudaMalloc(&p, wb.size()));
        CK(cudaMemcpy(p, wb.data(), wb.size(), cudaMemcpyHostToDevice));
      }
      float *dx = nullptr, *dy = nullptr;
      __half* dh = nullptr;
      CK(cudaMalloc(&dx, xf.size() * 4));
      CK(cudaMalloc(&dh, xf.size() * 2));
      CK(cudaMalloc(&dy, static_cast<size_t>(sh.n_out * n_tok) * 4));
      CK(cudaMemcpy(dx, xf.data(), xf.size() * 4, cudaMemcpyHostToDevice));
      const int64_t n = static_cast<int64_t>(xf.size());
      to_f16_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(dx, dh, n);
      CK(cudaGetLastError());
      std::printf("n_tok %4lld %-8s", static_cast<long long>(n_tok), sh.name);
      for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); ++c) {
        cfgs[c].run(dw[0], rb, dh, sh.n_in, sh.n_out, n_tok, dy, 0);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> y(static_cast<size_t>(sh.n_out * n_tok));
        CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
        const double e = cpu_spot_nmse(t, wb, xf, y, sh.n_in, sh.n_out, n_tok);
        const bool ok = e < 1e-5;
        fails += !ok;
        int k = 0;
        const float ms = median_ms([&] {
          cfgs[c].run(dw[k], rb, dh, sh.n_in, sh.n_out, n_tok, dy, 0);
          k = (k + 1) % kCopies;
        });
        layer[c] += sh.count * ms;
        std::printf("  %s %.4f ms (%.0f GB/s) %.1e%s", cfgs[c].name, ms, wb.size() / ms * 1e-6, e, ok ? "" : " FAIL");
      }
      std::printf("\n");
      for (auto& p : dw) CK(cudaFree(p));
      CK(cudaFree(dx));
      CK(cudaFree(dh));
      CK(cudaFree(dy));
    }
    std::printf("n_tok %4lld layer (2 q/o + 2 k/v + 2 gate/up + down), ms:", static_cast<long long>(n_tok));
    for (size_t c = 0; c < layer.size(); ++c) std::printf("  %s %.4f", cfgs[c].name, layer[c]);
    std::printf("\n");
  }
  std::printf("mmf_bench: %s\n", fails ? "FAILED checks" : "all checks passed");
  return fails ? 1 : 0;
}

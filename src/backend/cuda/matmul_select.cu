// The one matmul selector: which kernel computes y (+)= W x (+ bias) for one product on the current device. The
// backend's dispatch (CudaBackend::matmul_run, the grouped GEMVs, rms_norm_for_matmul's fused quantization) and
// supports() (its first rule: a weight type no kernel takes) ask it; nothing else picks a matmul kernel.
//   n_tok <= the type's gemv_to   quantized weights: mmvq (the dp4a / tensor-core GEMVs, mmvq.cu); F16/BF16/F32: mmvf
//   n_tok <= the type's mmf_to    mmf (the weight-streaming f16 GEMM: each weight dequantized once, mmf.cuh)
//   n_tok >= the type's blas_from  blas (dequantize to f16 + cuBLAS, gemm_blas.cu)
//   between                        mmq (the int8 / f16 mma.sync GEMM, split-K on small grids, mmq.cuh)
//   anything else                  gemm (the f32 tiled GEMM, gemm.cu: sm_75 without cuBLAS's types, odd alignments)
// KILN_CUDA_MATMUL=mmvq|mmvf|mmf|mmq|gemm|blas (developer A/B runs; tests call matmul_set_override) forces a kernel
// wherever that kernel can run the product, else the rule decides.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

// Per weight type, the token counts where the kernels change, measured on the H200 (132 SMs) with
// dev/cuda/matmul_select_bench (back-to-back launches, weights rotated past the L2) over one llama3-8b layer's
// products (2 q/o 4096x4096 + 2 k/v 1024x4096 + 2 gate/up 14336x4096 + 1 down 4096x14336) at 2 .. 256 tokens
// (docs/BENCHMARKS.md has the table; mmq with its 16- and 32-token tiles and the split-K reduction of 02fa592):
//   gemv_to: the most tokens for which the GEMV is faster than the better of mmq and blas (between two measured
//            counts: where the GEMV's time, linear in the tokens, crosses it). Q4_K 0.152 / 0.189 ms at 4 / 8
//            tokens against mmq's 0.163 / 0.175, but the model groups its GEMVs (q/k/v in one launch, gate/up
//            with the SwiGLU fused: mmvq.cu), which the bench does not: end to end (llama3-8b Q4_K_M, 8
//            sequences) the GEMV to 8 tokens gave 1291 t/s, mmq from 7 tokens 1108; Q8_0 0.171 / 0.282 against
//            0.205 / 0.207; Q6_K's GEMV against its mmq (mmq_p6_kernel) 0.388 / 0.408 ms at 24 tokens, 0.407 /
//            0.411 at 32, and end to end at 32 sequences mmq won (2811 t/s against 2759);
//   blas_from: the fewest tokens from which blas stays faster than mmq: 65 for every measured type (mmq's second
//            64-token tile: Q4_K 0.345 / 0.530 ms at 64 / 96 tokens, blas 0.484 / 0.498).
// Measured: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, F16 (BF16 as F16: the same GEMV and cuBLAS path); Q4_1, Q5_0, Q5_1 take
// Q4_0's (the same dp4a GEMV, their mmq no faster than Q4_0's); Q2_K, Q3_K the rule measured before split-K mmq
// (GEMV to kGemvMaxTok, blas from 33). IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0 and the i-quant grid types: not measured yet; the GEMV to kGemvMaxTok, then blas
// (no measured mmq rule: MXFP4's mmq serves the MoE experts' grouped products, cuda_moe.cu).
//   mmf_to: Q4_K's weight-streaming GEMM (mmf_bench, one layer, best geometry per shape): 0.098 / 0.113 / 0.151 /
//            0.237 ms at 8 / 16 / 32 / 64 tokens against mmq's 0.175 / 0.179 / 0.244 / 0.343 and the GEMV's 0.189 at 8.
//            End to end (llama3-8b Q4_K_M, P sequences decoding, 112e990): a step of 4 sequences took 5.2 ms on mmf,
//            of 8 5.3 ms (mmf's smallest tile is 8 tokens), of 2 on the GEMV 3.45 ms and of 8 on the GEMV 6.2 ms
//            (b83eced).
//            Q6_K (q4_k_m's attn_v, ffn_down, output), end to end with Q6_K forced onto mmf against the rule
//            before (its GEMV to 24 tokens, mmq above), H200, e339605: 8 / 16 / 24 / 32 / 64 sequences 1585 / 2744 /
//            3271 / 4294 / 5049 t/s against 1478 / 2531 / 2878 / 3790 / 5132: mmf to 32 tokens then. With
//            64-token tiles on wgmma (84b5d8c), H100, 6f4e290: 64 sequences 5408 / 5418 t/s with Q6_K on mmf
//            (KILN_CUDA_MATMUL=mmf, 2 rounds) against 5213 / 5214 on mmq: mmf to 64 tokens.
//   gemv_to of Q4_K and Q6_K, end to end (ec41644, both on the GEMV against both on mmf): 3 / 4 / 5 sequences
//            559 / 745 / 1002 t/s on the GEMV, 601 / 797 / 1003 on mmf; 2 sequences on the GEMV 580 t/s, a step of
//            3.45 ms, where mmf's step costs its 8-token tile's ~5.0 ms from 3 to 8 tokens: the GEMV to 2 tokens.
struct Crossover {
  DType type;
  int64_t gemv_to, mmf_to, blas_from;
};
constexpr Crossover kCrossover[] = {
    {DType::Q4_0, 14, 0, 65},   {DType::Q4_1, 14, 0, 65},   {DType::Q5_0, 14, 0, 65},   {DType::Q5_1, 14, 0, 65},
    {DType::Q8_0, 5, 0, 65},    {DType::Q2_K, 32, 0, 33},   {DType::Q3_K, 32, 0, 33},   {DType::Q4_K, 2, 64, 65},
    {DType::Q5_K, 6, 0, 65},    {DType::Q6_K, 2, 64, 65},   {DType::F16, 2, 0, 3},      {DType::BF16, 2, 0, 3},
    {DType::IQ4_NL, 32, 0, 33}, {DType::IQ4_XS, 32, 0, 33}, {DType::MXFP4, 32, 0, 33},  {DType::TQ1_0, 32, 0, 33},
    {DType::TQ2_0, 32, 0, 33},  {DType::IQ2_XXS, 32, 0, 33}, {DType::IQ2_XS, 32, 0, 33}, {DType::IQ2_S, 32, 0, 33},
    {DType::IQ3_XXS, 32, 0, 33}, {DType::IQ3_S, 32, 0, 33},  {DType::IQ1_S, 32, 0, 33},  {DType::IQ1_M, 32, 0, 33},
};
static_assert(kGemvMaxTok >= 32, "kCrossover's gemv_to values are at most 32");

Crossover crossover(DType t) {
  for (const Crossover& c : kCrossover)
    if (c.type == t) return c;
  return {t, kGemvMaxTok, 0, 0};  // F32: its GEMV, then mmq/gemm (no blas)
}

// matmul_set_override's kernel (-1: none set, the environment's KILN_CUDA_MATMUL decides).
std::atomic<int> g_forced{-1};

MatmulKernel parse_kernel(const char* s) {
  if (!s) return MatmulKernel::kNone;
  for (MatmulKernel k : {MatmulKernel::kMmvq, MatmulKernel::kMmvf, MatmulKernel::kMmf, MatmulKernel::kMmq,
                         MatmulKernel::kGemm, MatmulKernel::kBlas})
    if (std::strcmp(s, matmul_kernel_name(k)) == 0) return k;
  return MatmulKernel::kNone;
}

MatmulKernel override_kernel() {
  const int f = g_forced.load(std::memory_order_relaxed);
  if (f >= 0) return static_cast<MatmulKernel>(f);
  static const MatmulKernel env = [] {
    const char* e = std::getenv("KILN_CUDA_MATMUL");
    const MatmulKernel k = parse_kernel(e);
    if (e && *e && k == MatmulKernel::kNone)
      std::fprintf(stderr, "KILN_CUDA_MATMUL=%s is not a matmul kernel (mmvq, mmvf, mmf, mmq, gemm, blas): ignored\n", e);
    return k;
  }();
  return env;
}

bool usable(MatmulKernel k, const MatmulParams& p, int cc) {
  switch (k) {
    case MatmulKernel::kMmvq: return mmvq_supports(p.type);
    case MatmulKernel::kMmvf: return mmvf_usable(p);
    case MatmulKernel::kMmf: return mmf_usable(p);
    case MatmulKernel::kMmq: return mmq_usable(p);
    case MatmulKernel::kGemm: return gemm_supports(p.type);
    case MatmulKernel::kBlas: return blas_usable(p, cc);
    default: return false;
  }
}

}  // namespace

const char* matmul_kernel_name(MatmulKernel k) {
  switch (k) {
    case MatmulKernel::kMmvq: return "mmvq";
    case MatmulKernel::kMmvf: return "mmvf";
    case MatmulKernel::kMmf: return "mmf";
    case MatmulKernel::kMmq: return "mmq";
    case MatmulKernel::kGemm: return "gemm";
    case MatmulKernel::kBlas: return "blas";
    default: return "none";
  }
}

void matmul_set_override(const char* name) {
  g_forced.store(static_cast<int>(parse_kernel(name)), std::memory_order_relaxed);
}

const char* matmul_kernel_for(DType t, int64_t n_in, int64_t n_out, int64_t n_tok) {
  int dev = 0, ma = 0, mi = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) ||
      cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev))
    return "none";
  const auto rb = dtype_row_bytes(t, n_in);
  if (!rb) return "none";
  // No memory is touched: pointers only need the alignment of a fresh allocation.
  const auto at = [](uintptr_t a) { return reinterpret_cast<float*>(a); };
  MatmulParams p{t, reinterpret_cast<const uint8_t*>(uintptr_t{1} << 20), rb.value(), n_in, n_out, n_tok,
                 at(uintptr_t{2} << 20), static_cast<size_t>(n_in), nullptr, at(uintptr_t{3} << 20),
                 static_cast<size_t>(n_out), false};
  return matmul_kernel_name(select_matmul(p, 10 * ma + mi));
}

MatmulKernel select_matmul(const MatmulParams& p, int cc) {
  if (!gemm_supports(p.type)) return MatmulKernel::kNone;
  const MatmulKernel forced = override_kernel();
  if (forced != MatmulKernel::kNone && usable(forced, p, cc)) return forced;
  const Crossover c = crossover(p.type);
  if (p.n_tok <= c.gemv_to) {
    if (mmvq_supports(p.type)) return MatmulKernel::kMmvq;
    if (mmvf_usable(p)) return MatmulKernel::kMmvf;
  }
  if (p.n_tok <= c.mmf_to && mmf_usable(p)) return MatmulKernel::kMmf;
  if (c.blas_from > 0 && p.n_tok >= c.blas_from && blas_usable(p, cc)) return MatmulKernel::kBlas;
  if (mmq_usable(p)) return MatmulKernel::kMmq;
  if (blas_usable(p, cc)) return MatmulKernel::kBlas;  // devices without mmq (sm_75): cuBLAS's f16 tensor cores
  return MatmulKernel::kGemm;
}

}  // namespace kiln::cuda

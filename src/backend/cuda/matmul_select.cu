// The one matmul selector: which kernel computes y (+)= W x (+ bias) for one product on the current device. The
// backend's dispatch (CudaBackend::matmul_run, the grouped GEMVs, rms_norm_for_matmul's fused quantization) and
// supports() (its first rule: a weight type no kernel takes) ask it; nothing else picks a matmul kernel.
//   n_tok <= kGemvMaxTok      quantized weights: mmvq (the dp4a / tensor-core GEMVs, mmvq.cu); F16/BF16/F32: mmvf
//   above                     blas (dequantize to f16 + cuBLAS, gemm_blas.cu) from the type's measured crossover
//                             (kBlasFrom below), else mmq (the int8 / f16 mma.sync GEMM, mmq.cuh)
//   anything else             gemm (the f32 tiled GEMM, gemm.cu: sm_75 without cuBLAS's types, odd alignments)
// KILN_CUDA_MATMUL=mmvq|mmvf|mmq|gemm|blas (developer A/B runs; tests call matmul_set_override) forces a kernel
// wherever that kernel can run the product, else the rule decides.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

// The fewest tokens from which dequantize + cuBLAS beats mmq, per weight type, measured on the H200 (132 SMs) with
// dev/cuda/matmul_select_bench over the llama3-8b projections (q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096,
// down 4096x14336) at 33..4096 tokens: the smallest count from which blas stays faster on one layer's products
// (2 q/o + 2 k/v + 2 gate/up + 1 down; docs/BENCHMARKS.md has the table). Measured: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K,
// F16, BF16, all 33 (blas 0.62-0.78x of mmq's time at 33 tokens, 0.20-0.33x at 4096); Q4_1, Q5_0, Q5_1, Q2_K and
// Q3_K take the same (their mmq is no faster than Q4_0's / Q6_K's, their dequantization costs the same). Per shape,
// mmq still wins gate/up at 33-64 tokens (8-36%); the rule does not split by shape yet. 0: blas never.
struct BlasFrom {
  DType type;
  int64_t n_tok;
};
constexpr BlasFrom kBlasFrom[] = {
    {DType::Q4_0, 33}, {DType::Q4_1, 33}, {DType::Q5_0, 33}, {DType::Q5_1, 33}, {DType::Q8_0, 33},
    {DType::Q2_K, 33}, {DType::Q3_K, 33}, {DType::Q4_K, 33}, {DType::Q5_K, 33}, {DType::Q6_K, 33},
    {DType::F16, 33},  {DType::BF16, 33},
};

int64_t blas_from(DType t) {
  for (const BlasFrom& b : kBlasFrom)
    if (b.type == t) return b.n_tok;
  return 0;
}

// matmul_set_override's kernel (-1: none set, the environment's KILN_CUDA_MATMUL decides).
std::atomic<int> g_forced{-1};

MatmulKernel parse_kernel(const char* s) {
  if (!s) return MatmulKernel::kNone;
  for (MatmulKernel k : {MatmulKernel::kMmvq, MatmulKernel::kMmvf, MatmulKernel::kMmq, MatmulKernel::kGemm,
                         MatmulKernel::kBlas})
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
      std::fprintf(stderr, "KILN_CUDA_MATMUL=%s is not a matmul kernel (mmvq, mmvf, mmq, gemm, blas): ignored\n", e);
    return k;
  }();
  return env;
}

bool usable(MatmulKernel k, const MatmulParams& p, int cc) {
  switch (k) {
    case MatmulKernel::kMmvq: return mmvq_supports(p.type);
    case MatmulKernel::kMmvf: return mmvf_usable(p);
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
    case MatmulKernel::kMmq: return "mmq";
    case MatmulKernel::kGemm: return "gemm";
    case MatmulKernel::kBlas: return "blas";
    default: return "none";
  }
}

void matmul_set_override(const char* name) {
  g_forced.store(static_cast<int>(parse_kernel(name)), std::memory_order_relaxed);
}

MatmulKernel select_matmul(const MatmulParams& p, int cc) {
  if (!gemm_supports(p.type)) return MatmulKernel::kNone;
  const MatmulKernel forced = override_kernel();
  if (forced != MatmulKernel::kNone && usable(forced, p, cc)) return forced;
  if (p.n_tok <= kGemvMaxTok) {
    if (mmvq_supports(p.type)) return MatmulKernel::kMmvq;
    if (mmvf_usable(p)) return MatmulKernel::kMmvf;
  }
  const int64_t from = blas_from(p.type);
  if (from > 0 && p.n_tok >= from && blas_usable(p, cc)) return MatmulKernel::kBlas;
  if (mmq_usable(p)) return MatmulKernel::kMmq;
  if (blas_usable(p, cc)) return MatmulKernel::kBlas;  // devices without mmq (sm_75): cuBLAS's f16 tensor cores
  return MatmulKernel::kGemm;
}

}  // namespace kiln::cuda

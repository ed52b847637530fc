// The large-token matmul through cuBLAS: weights dequantized to f16 rows in a scratch buffer, activations rounded to
// f16, one cublasGemmEx per chunk of rows (f32 accumulation, f32 output written in place or added to y).
//   entry: CudaBackend::matmul_run (select_matmul == kBlas)  ->  launch_blas  ->  dequant_f16_kernel<T>,
//          act_f16_kernel, cublasGemmEx
// Numerics: every weight is the reference dequantizer's f32 value (quant.cuh dequant32) rounded to nearest f16
// (relative error <= 2^-11), every activation x rounded to f16 the same way and clamped to +-65504 (a value outside
// f16's range saturates rather than turning into inf); products and sums in f32 on the tensor cores. F16 weights are
// read as they are; BF16 weights keep bf16 and take bf16 activations (2^-8). This is llama.cpp's cuBLAS path (f16
// activations for f16 and quantized weights), more exact than the q8_1 activations of the GEMV / mmq (~2^-8
// relative per activation), so a token's logits depend on whether its batch took this path (within the parity
// limits: both are far inside them).
// Scratch: kBlasChunkBytes of f16 weight rows (the whole matrix when it fits: llama3-8b's 14336 x 4096 is 112 MiB)
// and n_tok x n_in f16 activations; a larger matrix (the output head) runs in row chunks.
#include <cublas_v2.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/quant_iq.cuh"  // the i-quant grid types' decode32

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per 32-element sub-block: decode (quant.cuh), round, four 16-byte stores. dst: [n_rows][n_in] f16.
template <DType T>
__global__ void __launch_bounds__(kThreads)
    dequant_f16_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t subs_per_row, int64_t n_subs,
                       __half* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_subs) return;
  const int64_t r = i / subs_per_row, s = i % subs_per_row;
  float v[32];
  dequant32<T>(w + static_cast<size_t>(r) * row_bytes, static_cast<int>(s), v);
  uint4* out = reinterpret_cast<uint4*>(dst + i * 32);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __half2 p = __floats2half2_rn(v[8 * j + 2 * k], v[8 * j + 2 * k + 1]);
      h[k] = *reinterpret_cast<const uint32_t*>(&p);
    }
    out[j] = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

// x [n_tok] rows of n_in f32 (row stride x_stride floats) -> dst [n_tok][n_in] f16 (or bf16), rounded to nearest,
// f16 clamped to its finite range.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    act_f16_kernel(const float* __restrict__ x, size_t x_stride, int64_t n_in, int64_t n, uint16_t* __restrict__ dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const int64_t t = i / n_in, k = i % n_in;
  const float v = x[t * static_cast<int64_t>(x_stride) + k];
  dst[i] = kBf16 ? f2bf(v) : f2h(fminf(fmaxf(v, -65504.0f), 65504.0f));
}

template <DType T>
Status dequant_rows(const MatmulParams& p, int64_t r0, int64_t rows, __half* dst, cudaStream_t s) {
  const int64_t subs = p.n_in / 32, n = rows * subs;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  dequant_f16_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p.w + static_cast<size_t>(r0) * p.w_row_bytes,
                                                                          p.w_row_bytes, subs, n, dst);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status dequant_dispatch(const MatmulParams& p, int64_t r0, int64_t rows, __half* dst, cudaStream_t s) {
  switch (p.type) {
    case DType::Q4_0: return dequant_rows<DType::Q4_0>(p, r0, rows, dst, s);
    case DType::Q4_1: return dequant_rows<DType::Q4_1>(p, r0, rows, dst, s);
    case DType::Q5_0: return dequant_rows<DType::Q5_0>(p, r0, rows, dst, s);
    case DType::Q5_1: return dequant_rows<DType::Q5_1>(p, r0, rows, dst, s);
    case DType::Q8_0: return dequant_rows<DType::Q8_0>(p, r0, rows, dst, s);
    case DType::Q2_K: return dequant_rows<DType::Q2_K>(p, r0, rows, dst, s);
    case DType::Q3_K: return dequant_rows<DType::Q3_K>(p, r0, rows, dst, s);
    case DType::Q4_K: return dequant_rows<DType::Q4_K>(p, r0, rows, dst, s);
    case DType::Q5_K: return dequant_rows<DType::Q5_K>(p, r0, rows, dst, s);
    case DType::Q6_K: return dequant_rows<DType::Q6_K>(p, r0, rows, dst, s);
    case DType::IQ4_NL: return dequant_rows<DType::IQ4_NL>(p, r0, rows, dst, s);
    case DType::IQ4_XS: return dequant_rows<DType::IQ4_XS>(p, r0, rows, dst, s);
    case DType::MXFP4: return dequant_rows<DType::MXFP4>(p, r0, rows, dst, s);
    case DType::TQ1_0: return dequant_rows<DType::TQ1_0>(p, r0, rows, dst, s);
    case DType::TQ2_0: return dequant_rows<DType::TQ2_0>(p, r0, rows, dst, s);
    case DType::IQ2_XXS: return dequant_rows<DType::IQ2_XXS>(p, r0, rows, dst, s);
    case DType::IQ2_XS: return dequant_rows<DType::IQ2_XS>(p, r0, rows, dst, s);
    case DType::IQ2_S: return dequant_rows<DType::IQ2_S>(p, r0, rows, dst, s);
    case DType::IQ3_XXS: return dequant_rows<DType::IQ3_XXS>(p, r0, rows, dst, s);
    case DType::IQ3_S: return dequant_rows<DType::IQ3_S>(p, r0, rows, dst, s);
    case DType::IQ1_S: return dequant_rows<DType::IQ1_S>(p, r0, rows, dst, s);
    case DType::IQ1_M: return dequant_rows<DType::IQ1_M>(p, r0, rows, dst, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "blas: weight type %s", dtype_name(p.type));
}

bool is_quant(DType t) { return t != DType::F16 && t != DType::BF16; }

// Rows per cublasGemmEx call: all of them when their f16 copy fits `bytes`, else a multiple of 256 that does.
int64_t chunk_rows(const MatmulParams& p, size_t bytes) {
  if (!is_quant(p.type)) return p.n_out;
  const int64_t fit = static_cast<int64_t>(bytes / (2 * static_cast<size_t>(p.n_in)));
  return std::min(p.n_out, std::max<int64_t>(256, fit / 256 * 256));
}

#define KILN_CUBLAS_TRY(call)                                                                                   \
  do {                                                                                                          \
    const cublasStatus_t st_ = (call);                                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                           \
      return make_error(ErrorCode::kInternal, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                       \
                        cublasGetStatusString(st_));                                                            \
  } while (0)

}  // namespace

bool blas_usable(const MatmulParams& p, int cc) {
  if (cc < 75 || p.n_in > INT32_MAX || p.n_tok > INT32_MAX || p.y_stride > INT32_MAX) return false;
  switch (p.type) {
    // float weights: rows of whole 16-byte vectors, as the tensor-core kernels read them (other shapes: gemm.cu)
    case DType::F16: return p.n_in % 8 == 0 && p.w_row_bytes % 16 == 0 && p.w_row_bytes / 2 <= INT32_MAX;
    case DType::BF16: return cc >= 80 && p.n_in % 8 == 0 && p.w_row_bytes % 16 == 0 && p.w_row_bytes / 2 <= INT32_MAX;
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0: case DType::Q2_K:
    case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_NL: case DType::IQ4_XS:
    case DType::MXFP4: case DType::TQ1_0: case DType::TQ2_0: case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S:
    case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S: case DType::IQ1_M: return p.n_in % 32 == 0;
    default: return false;
  }
}

size_t blas_weight_scratch_bytes(const MatmulParams& p) {
  return is_quant(p.type) ? static_cast<size_t>(chunk_rows(p, kBlasChunkBytes)) * static_cast<size_t>(p.n_in) * 2 : 0;
}

size_t blas_act_scratch_bytes(const MatmulParams& p) {
  return static_cast<size_t>(p.n_tok) * static_cast<size_t>(p.n_in) * 2;
}

Status blas_create(void** handle, void* workspace, size_t ws_bytes) {
  cublasHandle_t h = nullptr;
  KILN_CUBLAS_TRY(cublasCreate(&h));
  // Our own workspace: cuBLAS then allocates nothing while a step is captured as a CUDA graph.
  const cublasStatus_t st = cublasSetWorkspace(h, workspace, ws_bytes);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    return make_error(ErrorCode::kInternal, "cublasSetWorkspace: %s", cublasGetStatusString(st));
  }
  *handle = h;
  return Status::ok();
}

void blas_destroy(void* handle) {
  if (handle) cublasDestroy(static_cast<cublasHandle_t>(handle));
}

Status launch_blas(const MatmulParams& p, const BlasScratch& sc, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  auto h = static_cast<cublasHandle_t>(sc.handle);
  KILN_CUBLAS_TRY(cublasSetStream(h, s));
  const bool bf = p.type == DType::BF16;
  const int64_t nx = p.n_tok * p.n_in;
  // rows per chunk: as many as the weight scratch holds (the backend sizes it for kBlasChunkBytes)
  const int64_t rows = chunk_rows(p, sc.w_bytes);
  if (sc.x_bytes < static_cast<size_t>(nx) * 2 ||
      (is_quant(p.type) && sc.w_bytes < static_cast<size_t>(rows) * static_cast<size_t>(p.n_in) * 2))
    return make_error(ErrorCode::kInternal, "blas: scratch too small");
  auto* xh = static_cast<uint16_t*>(sc.x);
  const unsigned xb = static_cast<unsigned>((nx + kThreads - 1) / kThreads);
  if (bf) act_f16_kernel<true><<<xb, kThreads, 0, s>>>(p.x, p.x_stride, p.n_in, nx, xh);
  else act_f16_kernel<false><<<xb, kThreads, 0, s>>>(p.x, p.x_stride, p.n_in, nx, xh);
  KILN_CUDA_LAUNCH_CHECK();
  const cudaDataType_t ab = bf ? CUDA_R_16BF : CUDA_R_16F;
  const float one = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  // Column-major view: W rows are columns of a [n_in x n_out] matrix (op T), x a [n_in x n_tok] one, y a
  // [n_out x n_tok] one with leading dimension y_stride: y = W^T' x in cuBLAS terms, m = rows, n = n_tok, k = n_in.
  for (int64_t r0 = 0; r0 < p.n_out; r0 += rows) {
    const int64_t m = std::min(rows, p.n_out - r0);
    const void* a = nullptr;
    int64_t lda = 0;
    if (is_quant(p.type)) {
      KILN_TRY(dequant_dispatch(p, r0, m, static_cast<__half*>(sc.w), s));
      a = sc.w;
      lda = p.n_in;
    } else {
      a = p.w + static_cast<size_t>(r0) * p.w_row_bytes;
      lda = static_cast<int64_t>(p.w_row_bytes / 2);
    }
    KILN_CUBLAS_TRY(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m), static_cast<int>(p.n_tok),
                                 static_cast<int>(p.n_in), &one, a, ab, static_cast<int>(lda), xh, ab,
                                 static_cast<int>(p.n_in), &beta, p.y + r0, CUDA_R_32F, static_cast<int>(p.y_stride),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (p.bias) {
    EwParams e{EwOp::kAdd, p.y, p.y_stride, p.bias, 0, p.y, p.y_stride, p.n_out, p.n_tok, 0.0f};
    KILN_TRY(launch_elementwise(e, s));
  }
  return Status::ok();
}

}  // namespace kiln::cuda

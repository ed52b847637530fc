// Tiled GEMM for any token count and every matmul type (the prefill path, n_tok > 16, and the fallback of the float
// GEMV for unaligned shapes). Correct and simple; the tensor-core prefill GEMM is the next issue.
//   entry: CudaBackend::matmul*  ->  launch_gemm  ->  gemm_kernel<T>
// Tile: 64 output rows x 64 tokens per 256-thread block, K steps of 32; the weight tile is dequantized to f32 in
// shared memory (quant.cuh dequant32: the reference dequantizers' values), the activation tile is f32; each thread
// accumulates a 4x4 block in f32 registers (FMA). Numerics: float weights (F32/F16/BF16) times f32 activations;
// quantized weights times the same q8_1 activations as the GEMV (quantize.cu), dequantized (d * q) into the tile,
// so a token gets the same logits (up to f32 summation order) whatever the batch size.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/quant_iq.cuh"  // the i-quant grid types' decode32

namespace kiln::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 256, kPad = 4;

template <DType T>
__device__ __forceinline__ float load_float_w(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) return reinterpret_cast<const float*>(row)[k];
  else if constexpr (T == DType::F16) return h2f(reinterpret_cast<const uint16_t*>(row)[k]);
  else return bf2f(reinterpret_cast<const uint16_t*>(row)[k]);
}

template <DType T>
__global__ void __launch_bounds__(kThreads) gemm_kernel(MatmulParams p, ActQ a) {
  constexpr bool kFloat = T == DType::F32 || T == DType::F16 || T == DType::BF16;
  __shared__ __align__(16) float ws[kBK][kBM + kPad];
  __shared__ __align__(16) float xs[kBK][kBN + kPad];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kBM, t0 = static_cast<int64_t>(blockIdx.y) * kBN;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.n_in; k0 += kBK) {
    if constexpr (kFloat) {
#pragma unroll
      for (int j = 0; j < kBM * kBK / kThreads; ++j) {
        const int idx = tid + kThreads * j, r = idx / kBK, k = idx % kBK;
        const int64_t row = r0 + r, kk = k0 + k;
        ws[k][r] = row < p.n_out && kk < p.n_in ? load_float_w<T>(p.w + static_cast<size_t>(row) * p.w_row_bytes, kk)
                                                : 0.0f;
      }
    } else {
      if (tid < kBM) {
        const int64_t row = r0 + tid;
        float v[32];
        if (row < p.n_out) {
          dequant32<T>(p.w + static_cast<size_t>(row) * p.w_row_bytes, static_cast<int>(k0 / 32), v);
        } else {
#pragma unroll
          for (int k = 0; k < 32; ++k) v[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 32; ++k) ws[k][tid] = v[k];
      }
    }
#pragma unroll
    for (int j = 0; j < kBN * kBK / kThreads; ++j) {
      const int idx = tid + kThreads * j, n = idx / kBK, k = idx % kBK;
      const int64_t t = t0 + n, kk = k0 + k;
      float v = 0.0f;
      if (t < p.n_tok && kk < p.n_in) {
        if constexpr (kFloat)
          v = p.x[t * p.x_stride + kk];
        else  // the q8_1 activations of the GEMV, dequantized: both paths compute the same function
          v = a.ds[t * a.ds_stride + kk / 32].x * static_cast<float>(a.qs[t * a.qs_stride + kk]);
      }
      xs[k][n] = v;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kBK; ++k) {
      const float4 a = *reinterpret_cast<const float4*>(&ws[k][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&xs[k][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = r0 + ty * 4 + i;
    if (row >= p.n_out) continue;
    const float b = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + tx * 4 + j;
      if (t >= p.n_tok) continue;
      float* y = p.y + t * p.y_stride + row;
      *y = (p.accumulate ? *y : 0.0f) + acc[i][j] + b;
    }
  }
}

template <DType T>
Status run(const MatmulParams& p, const ActQ& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((p.n_out + kBM - 1) / kBM), static_cast<unsigned>((p.n_tok + kBN - 1) / kBN));
  gemm_kernel<T><<<grid, kThreads, 0, s>>>(p, a);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace

bool gemm_supports(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0:
    case DType::Q5_1: case DType::Q8_0: case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K:
    case DType::Q6_K: case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: case DType::TQ1_0:
    case DType::TQ2_0: case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M: return true;
    default: return false;
  }
}

Status launch_gemm(const MatmulParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  if ((p.n_tok + kBN - 1) / kBN > 65535)
    return make_error(ErrorCode::kUnsupported, "gemm: %lld tokens in one call", static_cast<long long>(p.n_tok));
  switch (p.type) {
    case DType::F32: return run<DType::F32>(p, a, s);
    case DType::F16: return run<DType::F16>(p, a, s);
    case DType::BF16: return run<DType::BF16>(p, a, s);
    default: break;
  }
  return dispatch_decode32_type(p.type, "gemm", [&](auto t) { return run<decltype(t)::value>(p, a, s); });
}

}  // namespace kiln::cuda

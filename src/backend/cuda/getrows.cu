// get_rows: dst[:, t] = row ids[t] of w as f32, every type matmul supports.
//   entry: CudaBackend::get_rows (cuda_backend.cu)  ->  launch_get_rows  ->  get_rows_q<T> / get_rows_f<T>
// Quantized rows: one thread per 32-element sub-block (dequant32, quant.cuh: the reference dequantizers' values
// up to one FMA rounding). Float rows: one thread per element.
#include "backend/cuda/launch.h"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/quant_iq.cuh"  // the i-quant grid types' decode32

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

template <DType T>
__global__ void get_rows_q(GetRowsParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int n_sub = static_cast<int>(p.d / 32);
  const int s = blockIdx.x * kThreads + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (s >= n_sub) return;
  const uint8_t* row = p.w + static_cast<size_t>(p.ids[t]) * p.w_row_bytes;
  float v[32];
  dequant32<T>(row, s, v);
  float* o = p.dst + t * p.dst_stride + 32 * s;
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = v[i];
}

template <DType T>
__global__ void get_rows_f(GetRowsParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t t = blockIdx.y;
  if (i >= p.d) return;
  const uint8_t* row = p.w + static_cast<size_t>(p.ids[t]) * p.w_row_bytes;
  float v;
  if constexpr (T == DType::F32) v = reinterpret_cast<const float*>(row)[i];
  else if constexpr (T == DType::F16) v = h2f(reinterpret_cast<const uint16_t*>(row)[i]);
  else v = bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
  p.dst[t * p.dst_stride + i] = v;
}

template <DType T>
Status run_q(const GetRowsParams& p, cudaStream_t s) {
  const dim3 grid(ceil_div(static_cast<int>(p.d / 32), kThreads), static_cast<unsigned>(p.n));
  KILN_TRY(launch_pdl(get_rows_q<T>, dim3(grid), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}
template <DType T>
Status run_f(const GetRowsParams& p, cudaStream_t s) {
  const dim3 grid(ceil_div(static_cast<int>(p.d), kThreads), static_cast<unsigned>(p.n));
  KILN_TRY(launch_pdl(get_rows_f<T>, dim3(grid), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace

Status launch_get_rows(const GetRowsParams& p, cudaStream_t s) {
  if (p.n == 0 || p.d == 0) return Status::ok();
  if (p.n > 65535) return make_error(ErrorCode::kUnsupported, "get_rows: %lld rows (at most 65535 per call)",
                                     static_cast<long long>(p.n));
  switch (p.type) {
    case DType::F32: return run_f<DType::F32>(p, s);
    case DType::F16: return run_f<DType::F16>(p, s);
    case DType::BF16: return run_f<DType::BF16>(p, s);
    case DType::Q4_0: return run_q<DType::Q4_0>(p, s);
    case DType::Q4_1: return run_q<DType::Q4_1>(p, s);
    case DType::Q5_0: return run_q<DType::Q5_0>(p, s);
    case DType::Q5_1: return run_q<DType::Q5_1>(p, s);
    case DType::Q8_0: return run_q<DType::Q8_0>(p, s);
    case DType::Q2_K: return run_q<DType::Q2_K>(p, s);
    case DType::Q3_K: return run_q<DType::Q3_K>(p, s);
    case DType::Q4_K: return run_q<DType::Q4_K>(p, s);
    case DType::Q5_K: return run_q<DType::Q5_K>(p, s);
    case DType::Q6_K: return run_q<DType::Q6_K>(p, s);
    case DType::IQ4_NL: return run_q<DType::IQ4_NL>(p, s);
    case DType::IQ4_XS: return run_q<DType::IQ4_XS>(p, s);
    case DType::MXFP4: return run_q<DType::MXFP4>(p, s);
    case DType::TQ1_0: return run_q<DType::TQ1_0>(p, s);
    case DType::TQ2_0: return run_q<DType::TQ2_0>(p, s);
    case DType::IQ2_XXS: return run_q<DType::IQ2_XXS>(p, s);
    case DType::IQ2_XS: return run_q<DType::IQ2_XS>(p, s);
    case DType::IQ2_S: return run_q<DType::IQ2_S>(p, s);
    case DType::IQ3_XXS: return run_q<DType::IQ3_XXS>(p, s);
    case DType::IQ3_S: return run_q<DType::IQ3_S>(p, s);
    case DType::IQ1_S: return run_q<DType::IQ1_S>(p, s);
    case DType::IQ1_M: return run_q<DType::IQ1_M>(p, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "get_rows: weight type %s is not supported", dtype_name(p.type));
}

}  // namespace kiln::cuda

// rms_norm: dst[:, r] = x[:, r] / sqrt(mean(x^2) + eps) * w.
//   entry: CudaBackend::rms_norm  ->  launch_rms_norm  ->  rms_norm_kernel (one block per row)
// Numerics as the CPU backend (and ggml): squares in f32, summed in double; mean and scale in f32.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* y = p.dst + r * p.dst_stride;
  double s = 0;
  for (int64_t i = threadIdx.x; i < p.d; i += kThreads) s += static_cast<double>(x[i] * x[i]);
  __shared__ double part[kThreads / kWarp];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  double tot = 0;
#pragma unroll
  for (int w = 0; w < kThreads / kWarp; ++w) tot += part[w];
  const float mean = static_cast<float>(tot / static_cast<double>(p.d));
  const float sc = 1.0f / sqrtf(mean + p.eps);
  if (p.w)
    for (int64_t i = threadIdx.x; i < p.d; i += kThreads) y[i] = x[i] * sc * p.w[i];
  else
    for (int64_t i = threadIdx.x; i < p.d; i += kThreads) y[i] = x[i] * sc;
}

}  // namespace

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  rms_norm_kernel<<<static_cast<unsigned>(p.n), kThreads, 0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

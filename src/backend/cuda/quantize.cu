// Activation quantization for the integer GEMV (mmvq.cu): per token and 32-element block, d = amax/127 (f32),
// q = roundf(x / d) as int8 (the q8_1 scheme llama.cpp's CUDA MMVQ uses, with the scale kept in f32 instead of
// f16), plus d * sum(q) of each 16-element half for the weight types with offsets (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K).
//   caller: the matmul entries (once per input per step, shared by the matmuls of one input)  ->
//   launch_quantize_act  ->  quantize_act_kernel (one warp per block of 32, lane = element)
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) quantize_act_kernel(const float* x, size_t x_stride, ActQ a) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t t = blockIdx.y;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (kThreads / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (b >= a.n_in / 32) return;
  const float v = x[t * x_stride + 32 * b + lane];
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = static_cast<int>(fminf(fmaxf(roundf(v * id), -127.f), 127.f));
  a.qs[t * a.qs_stride + 32 * b + lane] = static_cast<int8_t>(q);
  int sum = q;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // within each half of 16
  const int s_hi = __shfl_sync(0xffffffffu, sum, 16);
  if (lane == 0) a.ds[t * a.ds_stride + b] = make_float4(d, d * static_cast<float>(sum), d * static_cast<float>(s_hi), 0.f);
}

}  // namespace

Status launch_quantize_act(const float* x, size_t x_stride, const ActQ& a, cudaStream_t s) {
  if (a.n_tok == 0) return Status::ok();
  const dim3 grid(ceil_div(static_cast<int>(a.n_in / 32), kThreads / kWarp), static_cast<unsigned>(a.n_tok));
  KILN_TRY(launch_pdl(quantize_act_kernel, dim3(grid), dim3(kThreads), 0, s, x, x_stride, a));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

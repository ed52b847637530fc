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
  q8_1_warp_block(x[t * x_stride + 32 * b + lane], lane, a.qs + t * a.qs_stride + 32 * b, a.ds + t * a.ds_stride + b);
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

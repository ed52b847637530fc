// Row-wise softmax and argmax (one block per row).
//   entries: CudaBackend::{softmax, argmax, argmax_masked}  ->  launch_softmax / launch_argmax  ->  kernels
// softmax: max in f32, exp(x - max) in f32, the sum in double (as the CPU), scaled by the f32 reciprocal.
// argmax: the first index of the maximum; NaN rule of backend.h: NaN is below every number, a row of only NaN
// gives 0 (each thread keeps (value, index) with NaN mapped below -inf; ties keep the smaller index).
// argmax_masked: the same over the entries whose mask bit is set (RowParams::mask: u64 words, bit i % 64 of word
// i / 64). Thread t still walks i = t, t + 1024, ...: the 32 lanes of a warp read 32 entries of one mask word (an
// L1 broadcast) and load x only where a bit is set, so a warp over a zero half-word loads nothing. No allowed
// entry: -1; allowed entries of only NaN: the first of them (better() orders NaN by index).
#include <cfloat>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) softmax_kernel(RowParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* y = p.dst + r * p.dst_stride;
  __shared__ float fpart[kThreads / kWarp];
  __shared__ double dpart[kThreads / kWarp];
  const int w = threadIdx.x / kWarp, l = threadIdx.x % kWarp;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < p.d; i += kThreads) mx = fmaxf(mx, x[i]);
  mx = warp_max(mx);
  if (l == 0) fpart[w] = mx;
  __syncthreads();
  mx = fpart[0];
#pragma unroll
  for (int k = 1; k < kThreads / kWarp; ++k) mx = fmaxf(mx, fpart[k]);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < p.d; i += kThreads) {
    const float e = expf(x[i] - mx);
    y[i] = e;
    sum += e;
  }
  sum = warp_sum(sum);
  if (l == 0) dpart[w] = sum;
  __syncthreads();
  double tot = 0;
#pragma unroll
  for (int k = 0; k < kThreads / kWarp; ++k) tot += dpart[k];
  const float inv = static_cast<float>(1.0 / tot);
  for (int64_t i = threadIdx.x; i < p.d; i += kThreads) y[i] *= inv;
}

// (value, index) "better than": larger value, then smaller index; NaN ranks below everything.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  const bool vn = isnan(v), bn = isnan(bv);
  if (vn != bn) return bn;
  if (!vn && v != bv) return v > bv;
  return i < bi;
}

constexpr int kArgThreads = 1024;  // a 128k-entry logits row: 125 loads per thread, all independent

template <bool kMasked>
__global__ void __launch_bounds__(kArgThreads) argmax_kernel(RowParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  const uint64_t* m = kMasked ? p.mask + r * p.mask_stride : nullptr;
  float bv = NAN;
  int64_t bi = INT64_MAX;
  for (int64_t i = threadIdx.x; i < p.d; i += kArgThreads) {
    if constexpr (kMasked) {
      if (!((__ldg(m + (i >> 6)) >> (i & 63)) & 1)) continue;
    }
    const float v = x[i];
    if (better(v, i, bv, bi)) bv = v, bi = i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[kArgThreads / kWarp];
  __shared__ int64_t si[kArgThreads / kWarp];
  if (threadIdx.x % kWarp == 0) sv[threadIdx.x / kWarp] = bv, si[threadIdx.x / kWarp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kArgThreads / kWarp; ++k)
      if (better(sv[k], si[k], bv, bi)) bv = sv[k], bi = si[k];
    if constexpr (kMasked) p.ids[r] = bi == INT64_MAX ? -1 : static_cast<int32_t>(bi);
    else p.ids[r] = isnan(bv) || bi == INT64_MAX ? 0 : static_cast<int32_t>(bi);
  }
}

}  // namespace

Status launch_softmax(const RowParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  KILN_TRY(launch_pdl(softmax_kernel, dim3(static_cast<unsigned>(p.n)), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_argmax(const RowParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  if (p.mask) KILN_TRY(launch_pdl(argmax_kernel<true>, dim3(static_cast<unsigned>(p.n)), dim3(kArgThreads), 0, s, p));
  else KILN_TRY(launch_pdl(argmax_kernel<false>, dim3(static_cast<unsigned>(p.n)), dim3(kArgThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

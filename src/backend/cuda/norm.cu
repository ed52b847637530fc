// rms_norm: dst[:, r] = x[:, r] / sqrt(mean(x^2) + eps) * w;
// layer_norm: dst[:, r] = (x[:, r] - mean) / sqrt(var + eps) * w + b.
//   entry: CudaBackend::rms_norm  ->  launch_rms_norm  ->  rms_norm_kernel (one block per row)
//   entry: CudaBackend::layer_norm  ->  launch_layer_norm  ->  layer_norm_kernel (one block per row; below)
// Numerics as the CPU backend (and ggml): squares in f32, summed in double; mean and scale in f32.
// rms_norm_fast_kernel<Q> (rows of d % 32 == 0, 16-byte aligned): one block per row of one float4 per thread (up to
// 1024 threads, the row kept in registers between the two passes), and with Q the q8_1 activations of the result
// in the same pass (rms_norm_for_matmul: quantize.cu's numerics exactly, one 32-element block per 8 lanes), so the
// matmuls that follow skip their quantize launch. The 256-thread version that re-read x took 5.6 us per 4096-wide
// row on the H200 (one block per token: latency-bound). -Xptxas -v (sm_90): 56 (plain) / 58 (quantizing)
// registers, 256 bytes smem, no stack, no spills.
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// The sum of every thread's s over a block of kThreads (part: kThreads / kWarp doubles of shared memory).
__device__ __forceinline__ double block_sum(double s, double* part) {
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  double tot = 0;
#pragma unroll
  for (int w = 0; w < kThreads / kWarp; ++w) tot += part[w];
  __syncthreads();  // part is written again by the next reduction
  return tot;
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t r = blockIdx.x;
  const float* x = p.x + r * p.x_stride;
  float* y = p.dst + r * p.dst_stride;
  double s = 0;
  for (int64_t i = threadIdx.x; i < p.d; i += kThreads) s += static_cast<double>(x[i] * x[i]);
  __shared__ double part[kThreads / kWarp];
  const float mean = static_cast<float>(block_sum(s, part) / static_cast<double>(p.d));
  const float sc = 1.0f / sqrtf(mean + p.eps);
  if (p.w)
    for (int64_t i = threadIdx.x; i < p.d; i += kThreads) y[i] = x[i] * sc * p.w[i];
  else
    for (int64_t i = threadIdx.x; i < p.d; i += kThreads) y[i] = x[i] * sc;
}

// One block of kFastThreads per row; each thread keeps its (up to kFastV) float4 of the row in registers between
// the sum of squares and the scaling, so x is read once (rows of d > 4 * kFastThreads * kFastV re-read the rest).
constexpr int kFastThreads = 1024, kFastV = 4;

template <bool Q>
__global__ void __launch_bounds__(kFastThreads) rms_norm_fast_kernel(RmsNormParams p, ActQ a) {
  const int64_t r = blockIdx.x;
  const float4* x = reinterpret_cast<const float4*>(p.x + r * p.x_stride);
  float4* y = reinterpret_cast<float4*>(p.dst + r * p.dst_stride);
  const float4* w = reinterpret_cast<const float4*>(p.w);
  const int64_t n4 = p.d / 4;
  const int nt = blockDim.x;
  // The norm weight of the thread's first float4 is read before pdl_wait (a weight: never written during a step;
  // common.cuh), off the critical path of the reduction.
  float4 g0 = make_float4(1.f, 1.f, 1.f, 1.f);
  if (p.w && threadIdx.x < n4) g0 = w[threadIdx.x];
  pdl_enter();  // launched with launch_pdl (common.cuh)
  float4 keep[kFastV];
  double s = 0;
#pragma unroll
  for (int k = 0; k < kFastV; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * nt;
    keep[k] = i < n4 ? x[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kFastV) * nt; i < n4; i += nt) {
    const float4 v = x[i];
    s += static_cast<double>(v.x * v.x) + static_cast<double>(v.y * v.y) + static_cast<double>(v.z * v.z) +
         static_cast<double>(v.w * v.w);
  }
#pragma unroll
  for (int k = 0; k < kFastV; ++k) {
    const float4 v = keep[k];
    s += static_cast<double>(v.x * v.x) + static_cast<double>(v.y * v.y) + static_cast<double>(v.z * v.z) +
         static_cast<double>(v.w * v.w);
  }
  __shared__ double part[kFastThreads / kWarp];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / kWarp] = s;
  __syncthreads();
  double tot = 0;
  for (int k = 0; k < nt / kWarp; ++k) tot += part[k];
  const float mean = static_cast<float>(tot / static_cast<double>(p.d));
  const float sc = 1.0f / sqrtf(mean + p.eps);
  const int lane = threadIdx.x % kWarp;
  // A warp covers 128 consecutive elements per step: whole 32-element blocks (d % 32 == 0), so the 8-lane
  // shuffles below never mix in- and out-of-range lanes.
  int k = 0;
  for (int64_t base = threadIdx.x - lane; base < n4; base += nt, ++k) {
    const int64_t i = base + lane;
    const bool in = i < n4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (in) {
      if (k < kFastV) {
#pragma unroll
        for (int j = 0; j < kFastV; ++j)
          if (j == k) v = keep[j];  // static register indexing
      } else {
        v = x[i];
      }
      if (p.w) {
        const float4 g = k == 0 ? g0 : w[i];
        v = make_float4(v.x * sc * g.x, v.y * sc * g.y, v.z * sc * g.z, v.w * sc * g.w);
      } else {
        v = make_float4(v.x * sc, v.y * sc, v.z * sc, v.w * sc);
      }
      y[i] = v;
    }
    if constexpr (Q) {
      float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const int q0 = static_cast<int>(fminf(fmaxf(roundf(v.x * id), -127.f), 127.f));
      const int q1 = static_cast<int>(fminf(fmaxf(roundf(v.y * id), -127.f), 127.f));
      const int q2 = static_cast<int>(fminf(fmaxf(roundf(v.z * id), -127.f), 127.f));
      const int q3 = static_cast<int>(fminf(fmaxf(roundf(v.w * id), -127.f), 127.f));
      int sum = q0 + q1 + q2 + q3;
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // lanes 8g..8g+3: first 16 of the block, 8g+4..: second 16
      const int s_hi = __shfl_down_sync(0xffffffffu, sum, 4);
      if (in) {
        const uint32_t pk = (static_cast<uint32_t>(q0) & 0xFF) | (static_cast<uint32_t>(q1) & 0xFF) << 8 |
                            (static_cast<uint32_t>(q2) & 0xFF) << 16 | (static_cast<uint32_t>(q3) & 0xFF) << 24;
        *reinterpret_cast<uint32_t*>(a.qs + r * a.qs_stride + 4 * i) = pk;
        if ((lane & 7) == 0)
          a.ds[r * a.ds_stride + (4 * i) / 32] =
              make_float4(d, d * static_cast<float>(sum), d * static_cast<float>(s_hi), 0.f);
      }
    }
  }
}

// Threads for a row of n4 float4: one float4 per thread up to 1024 (whole warps), at least 128.
unsigned fast_threads(int64_t d) {
  const int64_t n4 = d / 4;
  const int64_t t = (n4 + kWarp - 1) / kWarp * kWarp;
  return static_cast<unsigned>(t < 128 ? 128 : t > kFastThreads ? kFastThreads : t);
}

bool fast_ok(const RmsNormParams& p) {
  auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  return p.d % 32 == 0 && al(p.x) && al(p.dst) && (!p.w || al(p.w)) && p.x_stride % 4 == 0 && p.dst_stride % 4 == 0;
}

// layer_norm_kernel: one block per row, three passes over x (the sum, the centred squares, the output): as
// CpuBackend::layer_norm (ggml's norm), the mean and the variance summed in double (f32 squares of the f32-centred
// values), mean, variance and scale rounded to f32, the rest in f32; only the summation order of the doubles differs.
// dst may alias x: every read of x in the first two passes precedes the barrier of the second reduction. Encoder rows
// (bert: 384..1024 wide) are read three times from L1/L2; -Xptxas -v (nvcc 13.0, sm_90): 32 registers, 64 bytes
// smem, no stack, no spills.
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(LayerNormParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  __shared__ double part[kThreads / kWarp];
  const int64_t r = blockIdx.x, d = p.r.d;
  const float* x = p.r.x + r * p.r.x_stride;
  float* y = p.r.dst + r * p.r.dst_stride;
  double s = 0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) s += static_cast<double>(x[i]);
  const float mean = static_cast<float>(block_sum(s, part) / static_cast<double>(d));
  double sq = 0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float c = x[i] - mean;
    sq += static_cast<double>(c * c);
  }
  const float var = static_cast<float>(block_sum(sq, part) / static_cast<double>(d));
  const float sc = 1.0f / sqrtf(var + p.r.eps);
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float v = (x[i] - mean) * sc;
    y[i] = (p.r.w ? v * p.r.w[i] : v) + (p.b ? p.b[i] : 0.0f);
  }
}

}  // namespace

Status launch_layer_norm(const LayerNormParams& p, cudaStream_t s) {
  if (p.r.n == 0) return Status::ok();
  if (p.r.n > INT32_MAX)
    return make_error(ErrorCode::kUnsupported, "layer_norm: %lld rows", static_cast<long long>(p.r.n));
  KILN_TRY(launch_pdl(layer_norm_kernel, dim3(static_cast<unsigned>(p.r.n)), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

bool rms_norm_quant_usable(const RmsNormParams& p) { return fast_ok(p); }

Status launch_rms_norm_quant(const RmsNormParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  if (!fast_ok(p)) return make_error(ErrorCode::kInternal, "rms_norm_quant: unaligned rows");
  KILN_TRY(launch_pdl(rms_norm_fast_kernel<true>, dim3(static_cast<unsigned>(p.n)), dim3(fast_threads(p.d)), 0, s, p, a));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_rms_norm(const RmsNormParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  if (fast_ok(p)) {
    KILN_TRY(launch_pdl(rms_norm_fast_kernel<false>, dim3(static_cast<unsigned>(p.n)), dim3(fast_threads(p.d)), 0, s, p, ActQ{}));
    KILN_CUDA_LAUNCH_CHECK();
    return Status::ok();
  }
  KILN_TRY(launch_pdl(rms_norm_kernel, dim3(static_cast<unsigned>(p.n)), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

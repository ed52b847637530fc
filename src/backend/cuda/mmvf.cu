// Decode GEMV for float weights (F16, BF16, F32), 1..16 tokens, weights read once for all tokens.
//   entry: CudaBackend::matmul* (n_tok <= 16, n_in % 8 == 0, 16-byte aligned rows)  ->  launch_mmvf  ->
//   mmvf_kernel<T, NC>: one warp per row, each lane 8 weights per step (one 16-byte load for F16/BF16, two for
//   F32), f32 activations (two float4 per token), f32 FMA, shuffle reduction.
// Numerics: weights converted exactly to f32, activations kept in f32 (the CPU rounds them to the weight type
// first: relative difference ~2^-9 per activation for BF16, 2^-11 for F16, far inside the 1e-4 NMSE limit).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;

template <DType T>
__device__ __forceinline__ void load8(const uint8_t* row, int64_t i, float (&w)[8]) {
  if constexpr (T == DType::F32) {
    const float4 a = *reinterpret_cast<const float4*>(row + 4 * i);
    const float4 b = *reinterpret_cast<const float4*>(row + 4 * i + 16);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(row + 2 * i);
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = static_cast<uint16_t>(v[k]), hi = static_cast<uint16_t>(v[k] >> 16);
      if constexpr (T == DType::F16) w[2 * k] = h2f(lo), w[2 * k + 1] = h2f(hi);
      else w[2 * k] = bf2f(lo), w[2 * k + 1] = bf2f(hi);
    }
  }
}

template <DType T, int NC>
__global__ void __launch_bounds__(kWarps * kWarp) mmvf_kernel(MatmulParams p) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= p.n_out) return;  // a warp that exits counts as triggered (common.cuh)
  const uint8_t* wr = p.w + static_cast<size_t>(row) * p.w_row_bytes;
  float acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
  // Pipelined (the next 8 weights in flight while these are used); the first load before pdl_wait (weights are not
  // written during a step: mmvq_fast.cuh).
  float w[8];
  if (p.prefetch && 8 * lane < p.n_in) load8<T>(wr, 8 * lane, w);
  pdl_enter();  // launched with launch_pdl (common.cuh)
  if (!p.prefetch && 8 * lane < p.n_in) load8<T>(wr, 8 * lane, w);
  for (int64_t i = 8 * lane; i < p.n_in; i += 8 * kWarp) {
    float wn[8];
    if (i + 8 * kWarp < p.n_in) load8<T>(wr, i + 8 * kWarp, wn);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (NC > 1 && c >= p.n_tok) break;
      const float4* x = reinterpret_cast<const float4*>(p.x + c * p.x_stride + i);
      const float4 a = x[0], b = x[1];
      acc[c] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = wn[k];
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) acc[c] = warp_sum(acc[c]);
  if (lane == 0) {
    const float bb = p.bias ? p.bias[row] : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (c >= p.n_tok) break;
      float* y = p.y + c * p.y_stride + row;
      *y = (p.accumulate ? *y : 0.0f) + acc[c] + bb;
    }
  }
}

template <DType T, int NC>
Status run_nc(const MatmulParams& p, cudaStream_t s) {
  auto* const kernel = mmvf_kernel<T, NC>;
  MatmulParams q = p;
  KILN_TRY(launch_pdl(kernel, dim3(static_cast<unsigned>((p.n_out + kWarps - 1) / kWarps)), dim3(kWarps * kWarp), 0, s, q));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

template <DType T>
Status run(const MatmulParams& p, cudaStream_t s) {
  if (p.n_tok <= 1) return run_nc<T, 1>(p, s);
  if (p.n_tok <= 2) return run_nc<T, 2>(p, s);
  if (p.n_tok <= 4) return run_nc<T, 4>(p, s);
  if (p.n_tok <= 8) return run_nc<T, 8>(p, s);
  return run_nc<T, 16>(p, s);
}

}  // namespace

bool mmvf_supports(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

bool mmvf_usable(const MatmulParams& p) {
  return mmvf_supports(p.type) && p.n_tok <= kGemvMaxTok && p.n_in % 8 == 0 && p.w_row_bytes % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
         p.x_stride % 4 == 0;
}

Status launch_mmvf(const MatmulParams& p, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  for (int64_t t0 = 0; t0 < p.n_tok; t0 += kMmvqMaxTok) {  // passes of 16 tokens (launch.h)
    MatmulParams q = p;
    q.n_tok = std::min<int64_t>(kMmvqMaxTok, p.n_tok - t0);
    q.x = p.x + static_cast<size_t>(t0) * p.x_stride;
    q.y = p.y + static_cast<size_t>(t0) * p.y_stride;
    switch (p.type) {
      case DType::F32: KILN_TRY(run<DType::F32>(q, s)); break;
      case DType::F16: KILN_TRY(run<DType::F16>(q, s)); break;
      case DType::BF16: KILN_TRY(run<DType::BF16>(q, s)); break;
      default: return make_error(ErrorCode::kUnsupported, "mmvf: weight type %s", dtype_name(p.type));
    }
  }
  return Status::ok();
}

}  // namespace kiln::cuda

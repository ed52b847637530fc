// The dot steps of mmvf_kernel (mmvf.cu): a lane's 8 float weights at element i of a row (one 16-byte load for
// F16 / BF16, two for F32, converted exactly to f32) and their products with 8 f32 activations, summed in one fixed
// expression. Shared with the kernels that compute a float GEMV row as matmul does (moe.cu's router), so their
// rows are mmvf's bit for bit.
#pragma once

#include "backend/cuda/common.cuh"
#include "quant/dtype.h"

namespace kiln::cuda {

template <DType T>
__device__ __forceinline__ void mmvf_load8(const uint8_t* row, int64_t i, float (&w)[8]) {
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

// w . (a, b): the 8 products summed left to right (the accumulator adds the result).
__device__ __forceinline__ float mmvf_dot8(const float (&w)[8], const float4& a, const float4& b) {
  return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
}

}  // namespace kiln::cuda

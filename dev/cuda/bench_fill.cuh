// Random device buffers for the attention benchmarks (fattn_bench, attn_decode_bench): a counter hash per element,
// uniform in [-1, 1), so a buffer of any size fills in one launch and the same seed gives the same values.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

__device__ __forceinline__ float hash_unit(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f;  // [-1, 1)
}
// p[i] = amp * u_i (grid-stride: any grid covers any n). Kernels cannot be inline: include this header in one
// translation unit per executable.
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = amp * hash_unit(i, seed);
}
__global__ void fill_f16(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = __float2half(hash_unit(i, seed));
}

}  // namespace kiln::cuda

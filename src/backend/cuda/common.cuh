// Device helpers shared by the CUDA op families: half/bfloat16 conversions, warp reductions, unaligned loads, the
// launch check. Included by the .cu files only (device code).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/cuda_check.h"

// After a kernel launch: a bad configuration (grid too large, too much shared memory) is reported here with the
// launch site; asynchronous faults surface at the next synchronizing call, also checked.
#define KILN_CUDA_LAUNCH_CHECK() KILN_CUDA_TRY(cudaGetLastError())

namespace kiln::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
// Round to nearest even, NaN quieted (as util/fp16.h f32_to_bf16).
__device__ __forceinline__ uint16_t f2bf(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 32-bit little-endian loads at 2- and 4-byte alignment (GGUF blocks of 18, 22, 34, 110, 210 bytes are only
// 2-byte aligned).
__device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}
__device__ __forceinline__ uint32_t ld_u32_a4(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The gated activations' f32 steps, one home for every kernel that applies them (elementwise.cu, moe.cu, the fused
// expert GEMV of moe_gemv.cu), so that fused and separate launches give the same bits: silu(g) * u, and gpt-oss's
// clamped SwiGLU (x = min(g, limit), y = clamp(u, -limit, limit), x / (1 + exp(alpha * -x)) * (y + 1), ggml's steps).
__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }
__device__ __forceinline__ float swiglu_oai_f(float g, float u, float alpha, float limit) {
  const float x = fminf(g, limit);
  const float y = fminf(fmaxf(u, -limit), limit);
  return x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
}

// ---- programmatic dependent launch (sm_90) ----------------------------------------------------------------------
// A kernel launched with launch_pdl() may start while the previous kernel of the stream is still running (its
// blocks are scheduled as soon as every block of the previous kernel has called pdl_trigger() or exited), so the
// launch latency and block ramp of kernel N+1 overlap the tail of kernel N: on a decode step of ~400 small kernels
// that is the ~3 us gap between them. The invariant that keeps this exactly stream-ordered: a kernel launched with
// launch_pdl() calls pdl_wait() before its first global memory write and before any read of memory that a kernel
// of the stream may write (activations, caches, outputs), and pdl_wait() returns only once the previous kernel has
// completed and its writes are visible. The one exception on purpose: the GEMV kernels read their first weights
// before pdl_wait (weights are written only by uploads, never during a step), so those loads overlap the previous
// kernel's tail. pdl_trigger() right after pdl_wait() lets the
// next kernel in at most one level deep. Below sm_90 both are no-ops and launch_pdl() is a plain launch.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, at the top of every kernel launched with launch_pdl().
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Whether launch_pdl() sets the programmatic-serialization attribute on the current device: compute capability
// 9.0 or newer and KILN_CUDA_PDL not "0" (an A/B switch). Cached per device.
bool pdl_enabled();

template <class... P, class... A>
Status launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  KILN_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
  return Status::ok();
}

}  // namespace kiln::cuda

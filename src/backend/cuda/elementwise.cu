// Elementwise ops: add, mul (b broadcasts when it has one row), swiglu (silu(gate) * up, silu(g) = g / (1 + e^-g)
// in f32 as the CPU computes it), scale, geglu (tanh GELU(gate) * up), gelu (tanh GELU(x)) and sigmoid_mul
// (x * sigmoid(gate), gate rows may be a strided view: any row stride); and copy's f32/f16/bf16 conversions (round to
// nearest even).
//   entries: CudaBackend::{add, mul, swiglu, scale, geglu, gelu, sigmoid_mul, copy}  ->  launch_elementwise /
//   launch_convert  ->  kernels
// Numerics of geglu / gelu / sigmoid_mul: the CPU op's f32 expression, operation for operation; the only difference is
// the libm used (CUDA tanhf / expf: <= 2 ulp each, no fast-math in this build, vs glibc's <= 1 ulp), so results
// differ from the CPU by a few ulp of the result, plus ~u |x| |up| absolute where 1 + tanh(.) cancels (x << 0).
// tests/unit/test_backend_ops_next.cpp bounds both against a double oracle by 16u (|ref| + |x up|).
// Grid: x over elements of a row (256 per block), y over rows (chunked by 65535).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;

template <EwOp OP>
__global__ void __launch_bounds__(kThreads) ew_kernel(EwParams p, int64_t r0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t r = r0 + blockIdx.y;
  if (i >= p.d) return;
  const float a = p.a[r * p.a_stride + i];
  float y;
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoef = 0.044715f;  // the tanh GELU's constants
  if constexpr (OP == EwOp::kScale) {
    y = a * p.s;
  } else if constexpr (OP == EwOp::kGelu) {  // as CpuBackend::gelu: 0.5 x (1 + tanh(c x (1 + k x^2)))
    y = 0.5f * a * (1.0f + tanhf(kSqrt2OverPi * a * (1.0f + kCoef * a * a)));
  } else {
    const float b = p.b[r * p.b_stride + i];
    if constexpr (OP == EwOp::kAdd) y = a + b;
    else if constexpr (OP == EwOp::kMul) y = a * b;
    else if constexpr (OP == EwOp::kSwiglu) y = swiglu_f(a, b);
    else if constexpr (OP == EwOp::kGeglu) {  // as CpuBackend::geglu: 0.5 x (1 + tanh(c x (1 + k x^2))) up
      y = 0.5f * a * (1.0f + tanhf(kSqrt2OverPi * a * (1.0f + kCoef * a * a))) * b;
    } else {  // kSigmoidMul: x / (1 + e^-gate), as CpuBackend::sigmoid_mul
      y = a / (1.0f + expf(-b));
    }
  }
  p.dst[r * p.dst_stride + i] = y;
}

template <EwOp OP>
Status run(const EwParams& p, cudaStream_t s) {
  for (int64_t r0 = 0; r0 < p.n; r0 += kMaxGridY) {
    const dim3 grid(ceil_div(static_cast<int>(p.d), kThreads), static_cast<unsigned>(std::min(kMaxGridY, p.n - r0)));
    ew_kernel<OP><<<grid, kThreads, 0, s>>>(p, r0);
    KILN_CUDA_LAUNCH_CHECK();
  }
  return Status::ok();
}

__device__ __forceinline__ float load_as_f32(DType t, const uint8_t* row, int64_t i) {
  if (t == DType::F32) return reinterpret_cast<const float*>(row)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(row)[i];
  return t == DType::F16 ? h2f(h) : bf2f(h);
}

__global__ void __launch_bounds__(kThreads) convert_kernel(ConvertParams p, int64_t r0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t r = r0 + blockIdx.y;
  if (i >= p.d) return;
  const float v = load_as_f32(p.src_type, p.src + r * p.src_stride, i);
  uint8_t* o = p.dst + r * p.dst_stride;
  if (p.dst_type == DType::F32) reinterpret_cast<float*>(o)[i] = v;
  else if (p.dst_type == DType::F16) reinterpret_cast<uint16_t*>(o)[i] = f2h(v);
  else reinterpret_cast<uint16_t*>(o)[i] = f2bf(v);
}

}  // namespace

Status launch_elementwise(const EwParams& p, cudaStream_t s) {
  if (p.n == 0 || p.d == 0) return Status::ok();
  switch (p.op) {
    case EwOp::kAdd: return run<EwOp::kAdd>(p, s);
    case EwOp::kMul: return run<EwOp::kMul>(p, s);
    case EwOp::kSwiglu: return run<EwOp::kSwiglu>(p, s);
    case EwOp::kScale: return run<EwOp::kScale>(p, s);
    case EwOp::kGeglu: return run<EwOp::kGeglu>(p, s);
    case EwOp::kSigmoidMul: return run<EwOp::kSigmoidMul>(p, s);
    case EwOp::kGelu: return run<EwOp::kGelu>(p, s);
  }
  return make_error(ErrorCode::kInternal, "elementwise: unknown op");
}

Status launch_convert(const ConvertParams& p, cudaStream_t s) {
  if (p.n == 0 || p.d == 0) return Status::ok();
  for (int64_t r0 = 0; r0 < p.n; r0 += kMaxGridY) {
    const dim3 grid(ceil_div(static_cast<int>(p.d), kThreads), static_cast<unsigned>(std::min(kMaxGridY, p.n - r0)));
    convert_kernel<<<grid, kThreads, 0, s>>>(p, r0);
    KILN_CUDA_LAUNCH_CHECK();
  }
  return Status::ok();
}

}  // namespace kiln::cuda

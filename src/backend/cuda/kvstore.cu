// kv_store: k and v rows of the batch into their cache slots (slot -1 = padding: nothing written), converted to
// the cache type. F16: round to nearest even; Q8_0: exactly the CPU/llama.cpp quantizer (quant/quantize_q8.cpp:
// d = amax/127 in f32, id = d ? 1/d : 0, q = roundf(x*id), d stored as f16, saturated where it would be inf).
//   entry: CudaBackend::kv_store  ->  launch_kv_store  ->  kv_store_kernel<T> (block per token and k/v; for Q8_0
//   one warp per 32-element block)
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

template <DType T>
__device__ void store_row(const float* x, uint8_t* o, int64_t d) {
  if constexpr (T == DType::F32) {
    for (int64_t i = threadIdx.x; i < d; i += kThreads) reinterpret_cast<float*>(o)[i] = x[i];
  } else if constexpr (T == DType::F16) {
    for (int64_t i = threadIdx.x; i < d; i += kThreads) reinterpret_cast<uint16_t*>(o)[i] = f2h(x[i]);
  } else {  // Q8_0: 34-byte blocks
    const int lane = threadIdx.x % kWarp;
    for (int64_t b = threadIdx.x / kWarp; b < d / 32; b += kThreads / kWarp) {
      const float v = x[32 * b + lane];
      const float amax = warp_max(fabsf(v));
      float dd = amax / 127.0f;
      uint16_t dh = f2h(dd);
      if ((dh & 0x7FFF) >= 0x7C00) {
        dh = 0x7BFF;
        dd = 65504.0f;
      }
      const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
      const float r = roundf(v * id);
      const int8_t q = r >= 127.f ? 127 : r <= -127.f ? -127 : (r == r ? static_cast<int8_t>(r) : 0);
      uint8_t* blk = o + 34 * b;
      blk[2 + lane] = static_cast<uint8_t>(q);
      if (lane == 0) *reinterpret_cast<uint16_t*>(blk) = dh;
    }
  }
}

template <DType T>
__global__ void __launch_bounds__(kThreads) kv_store_kernel(KvStoreParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t t = blockIdx.x;
  const int32_t slot = p.slots[t];
  if (slot < 0) return;
  if (blockIdx.y == 0)
    store_row<T>(p.k + t * p.k_stride, p.ck + static_cast<size_t>(slot) * p.ck_row, p.dk);
  else
    store_row<T>(p.v + t * p.v_stride, p.cv + static_cast<size_t>(slot) * p.cv_row, p.dv);
}

template <DType T>
Status run(const KvStoreParams& p, cudaStream_t s) {
  KILN_TRY(launch_pdl(kv_store_kernel<T>, dim3(static_cast<unsigned>(p.n), 2), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace

Status launch_kv_store(const KvStoreParams& p, cudaStream_t s) {
  if (p.n == 0) return Status::ok();
  switch (p.type) {
    case DType::F32: return run<DType::F32>(p, s);
    case DType::F16: return run<DType::F16>(p, s);
    case DType::Q8_0: return run<DType::Q8_0>(p, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "kv_store: cache type %s", dtype_name(p.type));
}

}  // namespace kiln::cuda

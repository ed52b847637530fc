// launch_mmq: the tensor-core prefill GEMM's type dispatch and usability rule (kernels, tile geometry and numerics:
// mmq.cuh; instances: instances/mmq_<type>.cu).
//
// Measured -Xptxas -v (registers / thread; static smem: 28672 B quantized, 20480 B float; 0 spills everywhere;
// min blocks from mmq.cuh's mmq_min_blocks):
//            Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K  F16 BF16
//   sm_80     116  128  116  128  116  168  161  128  128  161  128  128
//   sm_86/89  110  128  110  128  110  162  118  128  128  120  128  128
//   sm_90     112  128  112  128  112  164  117  128  128  123  126  126
//   sm_75: empty bodies (4 registers), never launched (mmq_usable).
// KILN_CUDA_MMQ=0 keeps the old f32 GEMM for n_tok > 16 (A/B measurements only).
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/mmq.cuh"

namespace kiln::cuda {

bool mmq_supports(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::F16: case DType::BF16: return true;
    default: return false;
  }
}

namespace {
// Compiled like every kernel of the backend (same arch list): its PTX version is the virtual arch the code that runs
// on this device was built from (a binary built for sm_75 only and JIT-compiled on an sm_80+ GPU has empty mmq
// kernel bodies: __CUDA_ARCH__ 750).
__global__ void mmq_arch_probe() {}

// Whether the current device runs the mmq kernels: compute capability >= 8.0 and code built for >= compute_80.
// Cached per device id (1 = yes, -1 = no).
bool device_ok() {
  constexpr int kMaxDev = 64;
  static int cache[kMaxDev] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return false;
  if (cache[dev] == 0) {
    int ma = 0;
    cudaFuncAttributes fa{};
    const bool ok = cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && ma >= 8 &&
                    cudaFuncGetAttributes(&fa, mmq_arch_probe) == cudaSuccess && fa.ptxVersion >= 80;
    cache[dev] = ok ? 1 : -1;
  }
  return cache[dev] > 0;
}
}  // namespace

bool mmq_usable(const MatmulParams& p) {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_MMQ");
    return !(e && e[0] == '0');
  }();
  if (!on || !mmq_supports(p.type) || !device_ok()) return false;  // sm_75: the f32 GEMM (gemm.cu)
  if ((p.n_tok + kMmqBN - 1) / kMmqBN > INT32_MAX || (p.n_out + kMmqBM - 1) / kMmqBM > 65535) return false;
  if (p.type == DType::F16 || p.type == DType::BF16) {
    // 16-byte cp.async of weight rows and float4 loads of x
    const auto al16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    return p.n_in % 8 == 0 && p.w_row_bytes % 16 == 0 && al16(p.w) && al16(p.x) && p.x_stride % 4 == 0;
  }
  return p.n_in % 32 == 0;
}

Status launch_mmq(const MatmulParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  if (!mmq_usable(p))
    return make_error(ErrorCode::kInternal, "mmq: %s %lld x %lld x %lld not usable here", dtype_name(p.type),
                      static_cast<long long>(p.n_out), static_cast<long long>(p.n_in),
                      static_cast<long long>(p.n_tok));
  switch (p.type) {
    case DType::Q4_0: return mmq_run<DType::Q4_0>(p, a, s);
    case DType::Q4_1: return mmq_run<DType::Q4_1>(p, a, s);
    case DType::Q5_0: return mmq_run<DType::Q5_0>(p, a, s);
    case DType::Q5_1: return mmq_run<DType::Q5_1>(p, a, s);
    case DType::Q8_0: return mmq_run<DType::Q8_0>(p, a, s);
    case DType::Q2_K: return mmq_run<DType::Q2_K>(p, a, s);
    case DType::Q3_K: return mmq_run<DType::Q3_K>(p, a, s);
    case DType::Q4_K: return mmq_run<DType::Q4_K>(p, a, s);
    case DType::Q5_K: return mmq_run<DType::Q5_K>(p, a, s);
    case DType::Q6_K: return mmq_run<DType::Q6_K>(p, a, s);
    case DType::F16: return mmq_run<DType::F16>(p, a, s);
    case DType::BF16: return mmq_run<DType::BF16>(p, a, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "mmq: weight type %s", dtype_name(p.type));
}

}  // namespace kiln::cuda

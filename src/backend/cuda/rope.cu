// rope and rope_kv_store: rotary embedding in place, normal (pairs 2i, 2i+1) or NeoX (pairs i, i + n_rot/2)
// ordering, optional frequency factors, YaRN (RopeParams: the ramp's range and mscale come from yarn_terms, the
// host's f32 steps, as the CPU backend's).
//   entry: CudaBackend::rope  ->  launch_rope  ->  rope_kernel (block per token and head, thread per pair: the
// earlier block per token looped over the heads with a dependent load/store each, 10.8 us per launch on the H200 for
// 32 heads; now 3.7 us). -Xptxas -v (nvcc 13.0, sm_90): 23 registers, 32-byte stack frame (sincosf's slow path), the
// same with the YaRN terms. The angle is built as the CPU backend and ggml build it, so they agree bit for bit
// before cos/sin: theta_i = pos * theta_scale^i by i repeated f32 multiplications, then freq_scale * theta / ff[i].
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 64;  // one thread per rotated pair of a 128-dim head

// Rotates pair i of the head at v (the CPU's angle, see the file comment; YaRN as CpuBackend::rope: the ramp mixes
// the interpolated and the extrapolated angle, cos and sin times mscale, which is 1 without YaRN: exact).
__device__ __forceinline__ void rope_pair(const RopeLaunch& p, float pos, int i, float* v) {
  const int half = p.n_rot / 2;
  float theta = pos;
  for (int k = 0; k < i; ++k) theta *= p.theta_scale;
  const float extrap = p.freq_factors ? theta / p.freq_factors[i] : theta;
  float th = p.freq_scale * extrap;
  if (p.ext_factor != 0.0f) {
    const float y = (static_cast<float>(i) - p.corr_lo) / fmaxf(0.001f, p.corr_hi - p.corr_lo);
    const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p.ext_factor;
    th = th * (1.0f - mix) + extrap * mix;
  }
  float sn, cs;
  sincosf(th, &sn, &cs);
  cs *= p.mscale, sn *= p.mscale;
  const int i0 = p.neox ? i : 2 * i;
  const int i1 = p.neox ? i + half : 2 * i + 1;
  const float a0 = v[i0], a1 = v[i1];
  v[i0] = a0 * cs - a1 * sn;
  v[i1] = a0 * sn + a1 * cs;
}

__global__ void __launch_bounds__(kThreads) rope_kernel(RopeLaunch p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float pos = static_cast<float>(p.pos[t]);
  float* v = p.x + t * p.tok_stride + h * p.head_stride;
  for (int i = threadIdx.x; i < p.n_rot / 2; i += kThreads) rope_pair(p, pos, i, v);
}

// rope_kv_store: block (token t, head slot y): y < n_head ropes q head y; y < n_head + n_head_kv ropes k head
// y - n_head in place and stores it (all head_dim values: the unrotated tail too) into the token's cache slot;
// the last n_head_kv slots store the v heads. Slot -1 (padding): q/k still roped (as the decomposition does),
// nothing stored. F16 (round to nearest even) and F32 caches; the other cache types take the decomposition.
template <bool F16>
__global__ void __launch_bounds__(kThreads) rope_kv_store_kernel(RopeLaunch q, RopeLaunch k, RopeKvStoreParams c) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t t = blockIdx.x;
  const int y = static_cast<int>(blockIdx.y);
  const float pos = static_cast<float>(q.pos[t]);
  const int32_t slot = c.slots[t];
  if (y < q.n_head) {
    float* v = q.x + t * q.tok_stride + y * q.head_stride;
    for (int i = threadIdx.x; i < q.n_rot / 2; i += kThreads) rope_pair(q, pos, i, v);
    return;
  }
  const bool is_k = y < q.n_head + k.n_head;
  const int h = is_k ? y - static_cast<int>(q.n_head) : y - static_cast<int>(q.n_head + k.n_head);
  const float* src;
  int64_t d;
  uint8_t* dst;
  if (is_k) {
    float* v = k.x + t * k.tok_stride + h * k.head_stride;
    for (int i = threadIdx.x; i < k.n_rot / 2; i += kThreads) rope_pair(k, pos, i, v);
    __syncthreads();  // the rotated values of the other threads, before the store reads them
    src = v;
    d = k.head_dim;
    dst = slot < 0 ? nullptr : c.ck + static_cast<size_t>(slot) * c.ck_row + c.k_head_bytes * h;
  } else {
    src = c.v + t * c.v_stride + h * c.hd_v;
    d = c.hd_v;
    dst = slot < 0 ? nullptr : c.cv + static_cast<size_t>(slot) * c.cv_row + c.v_head_bytes * h;
  }
  if (!dst) return;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    if constexpr (F16) reinterpret_cast<uint16_t*>(dst)[i] = f2h(src[i]);
    else reinterpret_cast<float*>(dst)[i] = src[i];
  }
}

}  // namespace

Status launch_rope(const RopeLaunch& p, cudaStream_t s) {
  if (p.n_tok == 0 || p.n_head == 0) return Status::ok();
  if (p.n_head > 65535) return make_error(ErrorCode::kUnsupported, "rope: %lld heads", static_cast<long long>(p.n_head));
  KILN_TRY(launch_pdl(rope_kernel, dim3(static_cast<unsigned>(p.n_tok), static_cast<unsigned>(p.n_head)), dim3(kThreads), 0, s, p));
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_rope_kv_store(const RopeLaunch& q, const RopeLaunch& k, const RopeKvStoreParams& c, cudaStream_t s) {
  if (q.n_tok == 0) return Status::ok();
  const int64_t slots = q.n_head + 2 * k.n_head;
  if (slots > 65535) return make_error(ErrorCode::kUnsupported, "rope_kv_store: %lld heads", static_cast<long long>(slots));
  if (c.type != DType::F16 && c.type != DType::F32)
    return make_error(ErrorCode::kUnsupported, "rope_kv_store: cache type %s", dtype_name(c.type));
  const dim3 grid(static_cast<unsigned>(q.n_tok), static_cast<unsigned>(slots));
  auto* const kernel = c.type == DType::F16 ? rope_kv_store_kernel<true> : rope_kv_store_kernel<false>;
  return launch_pdl(kernel, grid, dim3(kThreads), 0, s, q, k, c);
}

}  // namespace kiln::cuda

// The device pieces of the mixture-of-experts FFN (CudaBackend::moe_ffn in cuda_moe.cu runs them around matmul_run;
// contract and order of operations: backend/backend.h moe_ffn, the CPU's ops_moe.cpp the spec):
//   moe_route   one warp per token: router bias, softmax (kSoftmax), the k largest in decreasing order (ties:
//               the lower index), their weights (kSoftmaxWeight: softmax over the k chosen), renormalisation. The
//               CPU's arithmetic: max-subtracted exp in f32, the sum in double, one f32 reciprocal; the renormalising
//               sum in double, clamped to 2^-14, one f32 division per weight.
//   moe_group   the slots grouped by expert on the device: first / row / tok and mmq's tile sections (MatmulGroup)
//   moe_gather  xg row r = x row tok[r] (the slots grouped by expert, tokens increasing within an expert)
//   swiglu_oai  gpt-oss's clamped SwiGLU in ggml's f32 steps (in place on g)
//   moe_combine acc_t += sum_j w_{t,j} y_{row(t,j)}: o = y_0 w_0, then o = o + y_j w_j in slot order, then acc + o
#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kMinWeightSum = 6.103515625e-5f;  // llama.cpp's clamp of the renormalising sum (smallest f16 normal)

// softmax over n values in place, as the CPU's softmax_row
__device__ void softmax_inplace(float* v, int n) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, v[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    v[i] = expf(v[i] - mx);
    sum += v[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) v[i] *= inv;
}

// One warp per token (the experts strided over the lanes). Softmax: the max and the double sum by warp reductions
// (the CPU sums in expert order: the double sum of f32 terms differs in its last bits at most, below the one f32
// rounding of its reciprocal). Choice j: each lane's best unchosen expert, then the warp's: the larger value, equal
// values the lower index (the CPU's first maximum), lane 0's answer broadcast (a NaN logit orders nothing; the
// choice stays a valid, unchosen expert). Lane 0 writes sel / w; the weights' softmax and renormalisation are the
// CPU's serial loops.
constexpr int kRouteWarps = kThreads / kWarp;
__global__ void moe_route_kernel(MoeRouteParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  if (t >= p.n_tok) return;
  float* l = p.logits + t * p.n_expert;  // scratch: overwritten with the probabilities
  const int n = p.n_expert;
  if (p.bias)
    for (int e = lane; e < n; e += kWarp) l[e] = l[e] + p.bias[e];
  if (p.softmax_all) {
    float mx = -INFINITY;
    for (int e = lane; e < n; e += kWarp) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0;
    for (int e = lane; e < n; e += kWarp) {
      const float v = expf(l[e] - mx);
      l[e] = v;
      sum += v;
    }
    const float inv = static_cast<float>(1.0 / warp_sum(sum));
    for (int e = lane; e < n; e += kWarp) l[e] *= inv;
  }
  __syncwarp();
  int32_t* sel = p.sel + t * p.k;
  float* w = p.w + t * p.k;
  for (int j = 0; j < p.k; ++j) {
    int best = -1;
    float bv = 0.0f;
    for (int e = lane; e < n; e += kWarp) {
      bool taken = false;
      for (int i = 0; i < j && !taken; ++i) taken = sel[i] == e;
      if (!taken && (best < 0 || l[e] > bv)) best = e, bv = l[e];
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, best, off);
      if (oi >= 0 && (best < 0 || ov > bv || (!(bv > ov) && oi < best))) best = oi, bv = ov;
    }
    best = __shfl_sync(0xffffffffu, best, 0);
    if (lane == 0) sel[j] = best, w[j] = l[best];
    __syncwarp();
  }
  if (lane != 0) return;
  if (p.softmax_chosen) softmax_inplace(w, p.k);
  if (!p.norm) return;
  double s = 0;
  for (int j = 0; j < p.k; ++j) s += w[j];
  const float sf = fmaxf(static_cast<float>(s), kMinWeightSum);
  for (int j = 0; j < p.k; ++j) w[j] /= sf;
}

__global__ void moe_gather_kernel(const float* __restrict__ x, size_t x_stride, const int32_t* __restrict__ tok,
                                  int64_t n_rows, int64_t d, float* __restrict__ xg) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * d) return;
  const int64_t r = i / d, c = i % d;
  xg[i] = x[static_cast<int64_t>(tok[r]) * static_cast<int64_t>(x_stride) + c];
}

__global__ void swiglu_oai_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n, float alpha,
                                  float limit) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  g[i] = swiglu_oai_f(g[i], u[i], alpha, limit);
}

__global__ void moe_combine_kernel(MoeCombineParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.n_tok * p.d) return;
  const int64_t t = i / p.d, c = i % p.d;
  const float* w = p.w + t * p.k;
  const auto y_of = [&](int j) {  // slot (t, j)'s row of y: p.row's entry, or the slot itself
    const int64_t r = p.row ? p.row[t * p.k + j] : t * p.k + j;
    return p.y[r * p.d + c];
  };
  float o = y_of(0) * w[0];
  for (int j = 1; j < p.k; ++j) o = o + y_of(j) * w[j];
  float* a = p.acc + t * static_cast<int64_t>(p.acc_stride) + c;
  *a = *a + o;
}

// One block. cnt: slots per expert (shared atomics); fst: their prefix (thread 0, expert order); warp 0 places the
// slots 32 at a time in slot order, so rows within an expert follow the slots (tokens increasing): a lane's rank
// among the lanes of its expert (__match_any_sync) plus the expert's running offset, which the group's highest lane
// advances. Warp 1's lanes 0..3 write the tile sections for BN = 16, 32, 64, 128 meanwhile (launch.h MatmulGroup).
// A slot whose expert is out of range (moe_route never writes one) is counted nowhere and gets no row.
constexpr int kGroupThreads = 128;
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(MoeGroupParams p) {
  pdl_enter();  // launched with launch_pdl (common.cuh)
  __shared__ int cnt[kMoeGroupMaxExperts], fst[kMoeGroupMaxExperts + 1];
  const int tid = static_cast<int>(threadIdx.x), n = p.n_expert;
  for (int e = tid; e < n; e += kGroupThreads) cnt[e] = 0;
  __syncthreads();
  for (int64_t s = tid; s < p.n_slot; s += kGroupThreads) {
    const int e = p.sel[s];
    if (static_cast<unsigned>(e) < static_cast<unsigned>(n)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int acc = 0;
    for (int e = 0; e < n; ++e) fst[e] = acc, acc += cnt[e];
    fst[n] = acc;
  }
  __syncthreads();
  for (int e = tid; e <= n; e += kGroupThreads) p.first[e] = fst[e];
  if (tid < kWarp) {
    int* next = cnt;  // reused: the running offset of each expert
    for (int e = tid; e < n; e += kWarp) next[e] = fst[e];
    __syncwarp();
    for (int64_t base = 0; base < p.n_slot; base += kWarp) {
      const int64_t s = base + tid;
      int e = s < p.n_slot ? p.sel[s] : -1;
      if (static_cast<unsigned>(e) >= static_cast<unsigned>(n)) e = -1;
      const unsigned same = __match_any_sync(0xffffffffu, e);
      const int r = e >= 0 ? next[e] + __popc(same & ((1u << tid) - 1u)) : 0;
      __syncwarp();
      if (e >= 0) {
        p.row[s] = r;
        p.tok[r] = static_cast<int32_t>(s / p.k);
        if ((same >> tid) == 1u) next[e] += __popc(same);  // the highest lane of its expert's group
      }
      __syncwarp();
    }
  } else if (tid < kWarp + 4) {
    const int bn = 16 << (tid - kWarp);
    int2* t = p.tiles + mmq_group_off(p.n_slot, n, bn);
    const int64_t cap = mmq_group_cap(p.n_slot, n, bn);
    int64_t i = 0;
    for (int e = 0; e < n; ++e)
      for (int r = fst[e]; r < fst[e + 1]; r += bn) t[i++] = make_int2(e, r);
    for (; i < cap; ++i) t[i] = make_int2(-1, 0);
  }
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

Status launch_moe_route(const MoeRouteParams& p, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  return launch_pdl(moe_route_kernel, dim3(static_cast<unsigned>((p.n_tok + kRouteWarps - 1) / kRouteWarps)),
                    dim3(kThreads), 0, s, p);
}

Status launch_moe_gather(const float* x, size_t x_stride, const int32_t* tok, int64_t n_rows, int64_t d, float* xg,
                         cudaStream_t s) {
  if (n_rows == 0) return Status::ok();
  return launch_pdl(moe_gather_kernel, dim3(blocks(n_rows * d)), dim3(kThreads), 0, s, x, x_stride, tok, n_rows, d, xg);
}

Status launch_swiglu_oai(float* g, const float* u, int64_t n, float alpha, float limit, cudaStream_t s) {
  if (n == 0) return Status::ok();
  return launch_pdl(swiglu_oai_kernel, dim3(blocks(n)), dim3(kThreads), 0, s, g, u, n, alpha, limit);
}

Status launch_moe_group(const MoeGroupParams& p, cudaStream_t s) {
  if (p.n_expert < 1 || p.n_expert > kMoeGroupMaxExperts || p.k < 1)
    return make_error(ErrorCode::kInvalidArgument, "moe_group: %d experts (1..%d), k %d", p.n_expert,
                      kMoeGroupMaxExperts, p.k);
  if (p.n_slot == 0) return Status::ok();
  return launch_pdl(moe_group_kernel, dim3(1), dim3(kGroupThreads), 0, s, p);
}

Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  return launch_pdl(moe_combine_kernel, dim3(blocks(p.n_tok * p.d)), dim3(kThreads), 0, s, p);
}

}  // namespace kiln::cuda

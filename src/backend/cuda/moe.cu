// The device pieces of the mixture-of-experts FFN (CudaBackend::moe_ffn in cuda_moe.cu runs them around matmul_run;
// contract and order of operations: backend/backend.h moe_ffn, the CPU's ops_moe.cpp the spec):
//   moe_route   one thread per token: router bias, softmax (kSoftmax), the k largest in decreasing order (ties:
//               the lower index), their weights (kSoftmaxWeight: softmax over the k chosen), renormalisation. The
//               CPU's arithmetic: max-subtracted exp in f32, the sum in double, one f32 reciprocal; the renormalising
//               sum in double, clamped to 2^-14, one f32 division per weight.
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

__global__ void moe_route_kernel(MoeRouteParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.n_tok) return;
  float* l = p.logits + t * p.n_expert;  // scratch: overwritten with the probabilities
  if (p.bias)
    for (int e = 0; e < p.n_expert; ++e) l[e] = l[e] + p.bias[e];
  if (p.softmax_all) softmax_inplace(l, p.n_expert);
  int32_t* sel = p.sel + t * p.k;
  float* w = p.w + t * p.k;
  for (int j = 0; j < p.k; ++j) {
    int best = -1;
    for (int e = 0; e < p.n_expert; ++e) {
      bool taken = false;
      for (int i = 0; i < j && !taken; ++i) taken = sel[i] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = e;
    }
    sel[j] = best;
    w[j] = l[best];
  }
  if (p.softmax_chosen) softmax_inplace(w, p.k);
  if (!p.norm) return;
  double s = 0;
  for (int j = 0; j < p.k; ++j) s += w[j];
  const float sf = fmaxf(static_cast<float>(s), kMinWeightSum);
  for (int j = 0; j < p.k; ++j) w[j] /= sf;
}

__global__ void moe_gather_kernel(const float* __restrict__ x, size_t x_stride, const int32_t* __restrict__ tok,
                                  int64_t n_rows, int64_t d, float* __restrict__ xg) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_rows * d) return;
  const int64_t r = i / d, c = i % d;
  xg[i] = x[static_cast<int64_t>(tok[r]) * static_cast<int64_t>(x_stride) + c];
}

__global__ void swiglu_oai_kernel(float* __restrict__ g, const float* __restrict__ u, int64_t n, float alpha,
                                  float limit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const float x = fminf(g[i], limit);
  const float y = fminf(fmaxf(u[i], -limit), limit);
  g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
}

__global__ void moe_combine_kernel(MoeCombineParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.n_tok * p.d) return;
  const int64_t t = i / p.d, c = i % p.d;
  const int32_t* row = p.row + t * p.k;
  const float* w = p.w + t * p.k;
  float o = p.y[static_cast<int64_t>(row[0]) * p.d + c] * w[0];
  for (int j = 1; j < p.k; ++j) o = o + p.y[static_cast<int64_t>(row[j]) * p.d + c] * w[j];
  float* a = p.acc + t * static_cast<int64_t>(p.acc_stride) + c;
  *a = *a + o;
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

Status launch_moe_route(const MoeRouteParams& p, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  moe_route_kernel<<<blocks(p.n_tok), kThreads, 0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_moe_gather(const float* x, size_t x_stride, const int32_t* tok, int64_t n_rows, int64_t d, float* xg,
                         cudaStream_t s) {
  if (n_rows == 0) return Status::ok();
  moe_gather_kernel<<<blocks(n_rows * d), kThreads, 0, s>>>(x, x_stride, tok, n_rows, d, xg);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_swiglu_oai(float* g, const float* u, int64_t n, float alpha, float limit, cudaStream_t s) {
  if (n == 0) return Status::ok();
  swiglu_oai_kernel<<<blocks(n), kThreads, 0, s>>>(g, u, n, alpha, limit);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

Status launch_moe_combine(const MoeCombineParams& p, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  moe_combine_kernel<<<blocks(p.n_tok * p.d), kThreads, 0, s>>>(p);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace kiln::cuda

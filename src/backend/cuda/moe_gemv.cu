// launch_mmvq_id and its fused forms (launch.h): the mixture-of-experts GEMV of a decode step. One warp per output
// row of one slot (launch_mmvq_id, _glu) or of one token (_sum: its k slots), the slot's expert read from the
// device, the dot of mmvq_kernel (mmvq.cuh: lane l takes sub-blocks l, l + 32, ... of the row; mmvq_dot32; a
// butterfly of shuffles), so a slot's row is what launch_mmvq gives for that expert's plane and token up to the
// order of the lanes' f32 partial sums. The fused kernels keep one accumulator per product with the same lane order
// (id_dots), so their products are launch_mmvq_id's, and they apply the activation (common.cuh swiglu_f /
// swiglu_oai_f) and the slot sum in the separate kernels' f32 steps and order: fusing changes the launches (3
// instead of 5 per MoE layer's products) and the g / u / y round trips through memory, not the arithmetic.
// Every kernel here is launched with launch_pdl and waits at its top: the expert ids come from the routing kernel.
#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/quant_iq.cuh"

namespace kiln::cuda {
namespace {

// N dots of one warp: product i is the weight row at wr[i] against activation row xr[i] (the first n products; the
// rest give 0). Each accumulator sums its sub-blocks in the order mmvq_id_kernel's lane does, then the warp's
// butterfly; the products' loads are issued together.
template <DType T, int N>
__device__ __forceinline__ void id_dots(const uint8_t* const (&wr)[N], const ActQ& a, const int64_t (&xr)[N], int n,
                                        int64_t n_in, int lane, float (&out)[N]) {
  constexpr int kSubs = QTraits<T>::kElems / 32, kBytes = QTraits<T>::kBytes;
  const int n_sub = static_cast<int>(n_in / 32);
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.0f;
  for (int sb = lane; sb < n_sub; sb += kWarp) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i >= n) break;
      int q[8];
      float d[2], m[2];
      decode32<T>(wr[i] + static_cast<size_t>(sb / kSubs) * kBytes, sb % kSubs, q, d, m);
      acc[i] += mmvq_dot32(q, d, m, a.qs + static_cast<size_t>(xr[i]) * a.qs_stride + 32 * static_cast<size_t>(sb),
                           a.ds + static_cast<size_t>(xr[i]) * a.ds_stride + sb);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = i < n ? warp_sum(acc[i]) : 0.0f;
}

// Row `row` of expert e's plane of p.w.
__device__ __forceinline__ const uint8_t* id_row(const MmvqIdParams& p, int64_t e, int64_t row) {
  return p.w + static_cast<size_t>(e) * p.expert_bytes + static_cast<size_t>(row) * p.w_row_bytes;
}

__device__ __forceinline__ float id_bias(const MmvqIdParams& p, int64_t e, int64_t row) {
  return p.bias ? p.bias[e * p.n_out + row] : 0.0f;
}

template <DType T>
__global__ void __launch_bounds__(kMmvqWarps * kWarp) mmvq_id_kernel(MmvqIdParams p, ActQ a) {
  pdl_enter();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMmvqWarps + warp;
  if (row >= p.n_out) return;
  const int64_t s = blockIdx.y;
  const int64_t e = p.ids[s], xr[1] = {s / p.x_div};
  const uint8_t* const wr[1] = {id_row(p, e, row)};
  float y[1];
  id_dots<T, 1>(wr, a, xr, 1, p.n_in, lane, y);
  if (lane == 0) p.y[static_cast<size_t>(s) * p.y_stride + row] = y[0] + id_bias(p, e, row);
}

// Gate and up rows of one slot in one warp (two accumulators, the loads of both in flight together).
template <DType T, MoeGlu G>
__global__ void __launch_bounds__(kMmvqWarps * kWarp) mmvq_id_glu_kernel(MmvqIdGluParams p, ActQ a) {
  pdl_enter();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMmvqWarps + warp;
  if (row >= p.gate.n_out) return;
  const int64_t s = blockIdx.y, ex = p.gate.ids[s], t = s / p.gate.x_div;
  const int64_t xr[2] = {t, t};
  const uint8_t* const wr[2] = {id_row(p.gate, ex, row), id_row(p.up, ex, row)};
  float gu[2];
  id_dots<T, 2>(wr, a, xr, 2, p.gate.n_in, lane, gu);
  if (lane != 0) return;
  const float gv = gu[0] + id_bias(p.gate, ex, row), uv = gu[1] + id_bias(p.up, ex, row);
  p.gate.y[static_cast<size_t>(s) * p.gate.y_stride + row] =
      G == MoeGlu::kSwiglu ? swiglu_f(gv, uv) : swiglu_oai_f(gv, uv, p.alpha, p.limit);
}

// Row `row` of token t's down products, then launch_moe_combine's sum: its k slots kSumChunk at a time (their loads
// in flight together; all k at once took 230-255 registers and spilled), folded into o in slot order.
constexpr int kSumChunk = 4;
template <DType T>
__global__ void __launch_bounds__(kMmvqWarps * kWarp) mmvq_id_sum_kernel(MmvqIdSumParams p, ActQ a) {
  pdl_enter();
  const MmvqIdParams& q = p.down;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMmvqWarps + warp;
  if (row >= q.n_out) return;
  const int64_t t = blockIdx.y;
  const float* w = p.w + t * p.k;
  float o = 0.0f;
  for (int j0 = 0; j0 < p.k; j0 += kSumChunk) {
    const int n = min(kSumChunk, p.k - j0);
    int64_t e[kSumChunk], xr[kSumChunk];
    const uint8_t* wr[kSumChunk];
#pragma unroll
    for (int i = 0; i < kSumChunk; ++i) {
      const int64_t s = t * p.k + j0 + (i < n ? i : 0);
      e[i] = q.ids[s], xr[i] = s, wr[i] = id_row(q, e[i], row);
    }
    float y[kSumChunk];
    id_dots<T, kSumChunk>(wr, a, xr, n, q.n_in, lane, y);
#pragma unroll
    for (int i = 0; i < kSumChunk; ++i) {
      if (i >= n) break;
      const float yb = y[i] + id_bias(q, e[i], row);
      o = j0 + i == 0 ? yb * w[0] : o + yb * w[j0 + i];
    }
  }
  if (lane != 0) return;
  float* acc = p.acc + t * static_cast<int64_t>(p.acc_stride) + row;
  *acc = *acc + o;
}

Status check_id(const MmvqIdParams& p, const char* what) {
  if (p.n_slot > 65535 || p.x_div < 1 || p.n_in % 32 != 0)
    return make_error(ErrorCode::kInternal, "%s: %lld slots, x_div %d, n_in %lld", what,
                      static_cast<long long>(p.n_slot), p.x_div, static_cast<long long>(p.n_in));
  return Status::ok();
}

dim3 id_grid(int64_t n_out, int64_t n_y) {
  return dim3(static_cast<unsigned>((n_out + kMmvqWarps - 1) / kMmvqWarps), static_cast<unsigned>(n_y));
}

}  // namespace

Status launch_mmvq_id(const MmvqIdParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n_slot == 0 || p.n_out == 0) return Status::ok();
  KILN_TRY(check_id(p, "mmvq_id"));
  return dispatch_decode32_type(p.type, "mmvq_id", [&](auto t) {
    return launch_pdl(mmvq_id_kernel<decltype(t)::value>, id_grid(p.n_out, p.n_slot), dim3(kMmvqWarps * kWarp), 0, s,
                      p, a);
  });
}

Status launch_mmvq_id_glu(const MmvqIdGluParams& p, const ActQ& a, cudaStream_t s) {
  const MmvqIdParams &g = p.gate, &u = p.up;
  if (g.n_slot == 0 || g.n_out == 0) return Status::ok();
  KILN_TRY(check_id(g, "mmvq_id_glu"));
  if (u.type != g.type || u.n_in != g.n_in || u.n_out != g.n_out || u.n_slot != g.n_slot || u.ids != g.ids ||
      u.x_div != g.x_div)
    return make_error(ErrorCode::kInternal, "mmvq_id_glu: gate and up differ in type or shape");
  return dispatch_decode32_type(g.type, "mmvq_id_glu", [&](auto t) {
    constexpr DType T = decltype(t)::value;
    const dim3 grid = id_grid(g.n_out, g.n_slot), block(kMmvqWarps * kWarp);
    return p.act == MoeGlu::kSwiglu ? launch_pdl(mmvq_id_glu_kernel<T, MoeGlu::kSwiglu>, grid, block, 0, s, p, a)
                                    : launch_pdl(mmvq_id_glu_kernel<T, MoeGlu::kSwigluOai>, grid, block, 0, s, p, a);
  });
}

Status launch_mmvq_id_sum(const MmvqIdSumParams& p, const ActQ& a, cudaStream_t s) {
  const MmvqIdParams& q = p.down;
  if (q.n_slot == 0 || q.n_out == 0) return Status::ok();
  KILN_TRY(check_id(q, "mmvq_id_sum"));
  if (p.k < 1 || q.x_div != 1 || q.n_slot % p.k != 0)
    return make_error(ErrorCode::kInternal, "mmvq_id_sum: k %d, x_div %d, %lld slots", p.k, q.x_div,
                      static_cast<long long>(q.n_slot));
  return dispatch_decode32_type(q.type, "mmvq_id_sum", [&](auto t) {
    return launch_pdl(mmvq_id_sum_kernel<decltype(t)::value>, id_grid(q.n_out, q.n_slot / p.k),
                      dim3(kMmvqWarps * kWarp), 0, s, p, a);
  });
}

}  // namespace kiln::cuda

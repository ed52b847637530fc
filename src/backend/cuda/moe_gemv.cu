// launch_mmvq_id: the mixture-of-experts GEMV (launch.h MmvqIdParams). The grid is (row blocks, slots): one warp per
// output row of one slot, the slot's expert read from the device, the dot of mmvq_kernel (mmvq.cuh: lane l takes
// sub-blocks l, l + 32, ... of the row; mmvq_dot32; a butterfly of shuffles), so a slot's row is what launch_mmvq
// gives for that expert's plane and token up to the order of the lanes' f32 partial sums.
#include "backend/cuda/mmvq.cuh"
#include "backend/cuda/quant_iq.cuh"

namespace kiln::cuda {
namespace {

template <DType T>
__global__ void __launch_bounds__(kMmvqWarps * kWarp) mmvq_id_kernel(MmvqIdParams p, ActQ a) {
  constexpr int kSubs = QTraits<T>::kElems / 32, kBytes = QTraits<T>::kBytes;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMmvqWarps + warp;
  if (row >= p.n_out) return;
  const int64_t s = blockIdx.y;
  const int64_t e = p.ids[s];
  const uint8_t* wr = p.w + static_cast<size_t>(e) * p.expert_bytes + static_cast<size_t>(row) * p.w_row_bytes;
  const int64_t t = s / p.x_div;
  const int8_t* qs = a.qs + static_cast<size_t>(t) * a.qs_stride;
  const float4* ds = a.ds + static_cast<size_t>(t) * a.ds_stride;
  const int n_sub = static_cast<int>(p.n_in / 32);
  float acc = 0.0f;
  for (int sb = lane; sb < n_sub; sb += kWarp) {
    int q[8];
    float d[2], m[2];
    decode32<T>(wr + static_cast<size_t>(sb / kSubs) * kBytes, sb % kSubs, q, d, m);
    acc += mmvq_dot32(q, d, m, qs + 32 * static_cast<size_t>(sb), ds + sb);
  }
  acc = warp_sum(acc);
  if (lane == 0) p.y[static_cast<size_t>(s) * p.y_stride + row] = acc + (p.bias ? p.bias[e * p.n_out + row] : 0.0f);
}

template <DType T>
Status run(const MmvqIdParams& p, const ActQ& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((p.n_out + kMmvqWarps - 1) / kMmvqWarps), static_cast<unsigned>(p.n_slot));
  mmvq_id_kernel<T><<<grid, kMmvqWarps * kWarp, 0, s>>>(p, a);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

}  // namespace

Status launch_mmvq_id(const MmvqIdParams& p, const ActQ& a, cudaStream_t s) {
  if (p.n_slot == 0 || p.n_out == 0) return Status::ok();
  if (p.n_slot > 65535 || p.x_div < 1 || p.n_in % 32 != 0)
    return make_error(ErrorCode::kInternal, "mmvq_id: %lld slots, x_div %d, n_in %lld", static_cast<long long>(p.n_slot),
                      p.x_div, static_cast<long long>(p.n_in));
  return dispatch_decode32_type(p.type, "mmvq_id", [&](auto t) { return run<decltype(t)::value>(p, a, s); });
}

}  // namespace kiln::cuda

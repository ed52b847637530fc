// The wgmma instances of mmf_kernel (mmf.cuh), compiled for sm_90a alone (src/CMakeLists.txt: kiln_cuda_sm90a);
// mmf.cu's geometry table picks among them, mmf_bench sweeps them.
#include "backend/cuda/mmf.cuh"

namespace kiln::cuda {
namespace {
template <class F, int NT>
const void* pick(int warps, int ring) {
  if (warps == 8 && ring == 3) return reinterpret_cast<const void*>(mmf_kernel<F, 8, 1, NT, 3, true>);
  if (warps == 8 && ring == 4) return reinterpret_cast<const void*>(mmf_kernel<F, 8, 1, NT, 4, true>);
  if (warps == 16 && ring == 3) return reinterpret_cast<const void*>(mmf_kernel<F, 16, 1, NT, 3, true>);
  return nullptr;
}
template <class F>
const void* pick_nt(int nt, int warps, int ring) {
  switch (nt) {
    case 1: return pick<F, 1>(warps, ring);
    case 2: return pick<F, 2>(warps, ring);
    case 4: return pick<F, 4>(warps, ring);
    case 8: return pick<F, 8>(warps, ring);
    default: return nullptr;
  }
}
}  // namespace

const void* mmf_wg_kernel(DType t, int nt, int warps, int ring) {
  switch (t) {
    case DType::Q4_K: return pick_nt<MmfQ4K>(nt, warps, ring);
    case DType::Q6_K: return pick_nt<MmfQ6K>(nt, warps, ring);
    default: return nullptr;
  }
}

}  // namespace kiln::cuda

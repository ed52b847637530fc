// launch_mmf: the weight-streaming f16 GEMM's geometry, split and usability (kernel and numerics: mmf.cuh).
//
// Geometry per token tile (measured with dev/cuda/mmf_bench on the H200 over the llama3-8b Q4_K shapes, 8..64 tokens:
// docs/BENCHMARKS.md). The limiting resource is shared memory: a warp's ring of R units (16 rows x one super-block,
// 2304 bytes for Q4_K) plus the block's activation chunk (BN tokens x kc super-blocks x 576 bytes) must fit the
// 227 KB of one block per SM; kc (and so the K split S) follows from what is left.
//   BN  8 / 16 / 32: 16 warps, R 3 (ring 110.6 KB): more warps in flight won over deeper rings at few tokens
//   BN 64          :  8 warps, R 4 (ring  73.7 KB): the 64-token chunk needs the room (kc <= 4 at K 4096)
// Registers (-Xptxas -v, sm_90, no spills), BN 8 / 16 / 32 / 64: Q4_K 122 / 101 / 128 / 159; Q6_K (12 warps below 64
// tokens, 8 at 64, R 3: its 3584-byte units) 130 / 120 / 147 / 179. The selector (matmul_select.cu kCrossover) takes
// mmf for Q4_K from 3 to 64 tokens and for Q6_K from 3 to 32.
// The tile height (mt x 16 rows per warp) is part of the geometry; mt 1 everywhere: at BN 64, mt 2 (each activation
// fragment read from shared memory feeds two MMAs; 8 warps, R 3, kc 3, 226 registers) took gate/up from 69.6 to
// 86.8 us and 64 sequences from 4,981 to 4,059 t/s (H100). The 64-token step is latency-bound, not bound by the
// shared-memory port (ncu on gate/up, mt 1: shared pipe 32% of peak, MMA pipe 20%, DRAM 16%, 1.07 instructions per
// cycle; the warps mostly wait on fixed-latency dependencies, the dequantize -> MMA chain, at 2 warps per scheduler).
// The K split S depends on n_in and n_tok alone, so that a product gives the same bits alone and in a group
// (backend.h matmul_group): super-blocks per split kc = min(4, what shared memory allows), S = n_sb / kc rounded up
// (K 4096: S 4; K 14336: S 14). The bench's best S per shape differs (8 tokens: gate+up 1, q/o 8): a fixed rule
// costs the small products some occupancy. Rows go in several launches when the workspace cannot hold the partials.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/mmf.cuh"

namespace kiln::cuda {
namespace {

constexpr int kMmfSplitKc = 4;  // super-blocks per split when shared memory allows

struct MmfGeo {
  int warps, ring, mt;  // mt: 16-row tiles per warp (each activation fragment read from shared memory feeds mt MMAs)
};
// Q6_K's units are 3584 bytes (Q4_K's 2304): fewer warps keep the rings inside the same room (not measured yet).
template <class F>
constexpr MmfGeo mmf_geo(int nt) {
  if constexpr (F::kType == DType::Q6_K) return nt == 8 ? MmfGeo{8, 3, 1} : MmfGeo{12, 3, 1};
  return nt == 8 ? MmfGeo{8, 4, 1} : MmfGeo{16, 3, 1};
}

int device_attr(cudaDeviceAttr attr, int fallback) {
  constexpr int kMaxDev = 64;
  static int cache[kMaxDev][2] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return fallback;
  const int slot = attr == cudaDevAttrMultiProcessorCount ? 0 : 1;
  if (cache[dev][slot] == 0) {
    int n = 0;
    cache[dev][slot] = cudaDeviceGetAttribute(&n, attr, dev) == cudaSuccess && n > 0 ? n : fallback;
  }
  return cache[dev][slot];
}
int sms() { return device_attr(cudaDevAttrMultiProcessorCount, 1); }
int smem_optin() { return device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024); }

int nt_for(int64_t n_tok) { return n_tok <= 8 ? 1 : n_tok <= 16 ? 2 : n_tok <= 32 ? 4 : 8; }

template <class F, int NT>
Status launch_nt(const MmfArgs& a, int gx, int zt, int smem, cudaStream_t s) {
  constexpr MmfGeo G = mmf_geo<F>(NT);
  auto* k = mmf_kernel<F, G.warps, G.mt, NT, G.ring>;
  static thread_local int done_dev = -1;
  int dev = 0;
  KILN_CUDA_TRY(cudaGetDevice(&dev));
  if (done_dev != dev) {
    KILN_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
    done_dev = dev;
  }
  k<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(a.n_split), static_cast<unsigned>(zt)), 32 * G.warps,
      static_cast<size_t>(smem), s>>>(a);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

template <class F>
Status launch_type(const MmfArgs& a, int gx, int zt, int smem, int nt, cudaStream_t s) {
  switch (nt) {
    case 1: return launch_nt<F, 1>(a, gx, zt, smem, s);
    case 2: return launch_nt<F, 2>(a, gx, zt, smem, s);
    case 4: return launch_nt<F, 4>(a, gx, zt, smem, s);
    default: return launch_nt<F, 8>(a, gx, zt, smem, s);
  }
}

// One launch over segs (tiles numbered across them); the caller checked the workspace for S.
template <class F>
Status launch_segs(const MmfGroup& grp, const MmfSeg* segs, int n_seg, int64_t n_tiles, int S, int kc_max, int nt,
                   const MmqSplitWs& ws, cudaStream_t s) {
  const MmfGeo geo = mmf_geo<F>(nt);
  const int zt = static_cast<int>((grp.n_tok + 8 * nt - 1) / (8 * nt));
  MmfArgs a{};
  for (int i = 0; i < n_seg; ++i) a.seg[i] = segs[i];
  a.n_seg = n_seg;
  a.n_tiles = n_tiles;
  a.x = static_cast<const __half*>(grp.x);
  a.x_stride = grp.x_stride;
  a.n_in = grp.n_in;
  a.n_tok = grp.n_tok;
  a.n_split = S;
  a.kc_max = kc_max;
  a.x_pitch = mmf_x_pitch(kc_max);
  a.accumulate = grp.accumulate;
  a.part = ws.part;
  a.sem = ws.sem;
  const int smem = geo.warps * geo.ring * geo.mt * F::kUnitBytes + 8 * nt * a.x_pitch;
  const int64_t per_split = std::max<int64_t>(1, sms() / (static_cast<int64_t>(S) * zt));
  const int gx = static_cast<int>(std::min<int64_t>(per_split, (n_tiles + geo.warps - 1) / geo.warps));
  return launch_type<F>(a, gx, zt, smem, nt, s);
}

}  // namespace

bool mmf_supports(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

bool mmf_usable(const MatmulParams& p) {
  return mmf_supports(p.type) && int8_mma_ok() && p.n_in % 256 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 &&
         p.w_row_bytes % 16 == 0 && p.n_tok <= 8 * 8 * 1024;
}

size_t mmf_act_scratch_bytes(int64_t n_in, int64_t n_tok) { return static_cast<size_t>(n_in * n_tok) * 2; }

namespace {
template <class F>
Status launch_fmt(const MmfGroup& grp, const MmqSplitWs& ws, cudaStream_t s) {
  if (grp.n_tok == 0 || grp.n_seg == 0) return Status::ok();
  if (grp.n_seg > kMmfMaxSeg) return make_error(ErrorCode::kInternal, "mmf: %d segments", grp.n_seg);
  for (int i = 1; i < grp.n_seg; ++i)
    if (grp.seg[i].row_bytes != grp.seg[0].row_bytes) {  // the kernel takes one row pitch: a launch per segment
      for (int j = 0; j < grp.n_seg; ++j) {
        MmfGroup one = grp;
        one.seg[0] = grp.seg[j];
        one.n_seg = 1;
        KILN_TRY(launch_mmf(one, ws, s));
      }
      return Status::ok();
    }
  const int nt = nt_for(grp.n_tok);
  const MmfGeo geo = mmf_geo<F>(nt);
  const int zt = static_cast<int>((grp.n_tok + 8 * nt - 1) / (8 * nt));
  const int n_sb = static_cast<int>(grp.n_in / 256);
  // the longest split shared memory allows, then S
  const int x_room = smem_optin() - geo.warps * geo.ring * geo.mt * F::kUnitBytes;
  const int TM = 16 * geo.mt;  // rows per tile
  int kc_cap = n_sb;
  while (kc_cap > 1 && 8 * nt * mmf_x_pitch(kc_cap) > x_room) --kc_cap;
  if (8 * nt * mmf_x_pitch(kc_cap) > x_room)
    return make_error(ErrorCode::kUnsupported, "mmf: %d tokens do not fit shared memory", static_cast<int>(grp.n_tok));
  int64_t n_tiles = 0;
  for (int i = 0; i < grp.n_seg; ++i) n_tiles += (grp.seg[i].n_out + TM - 1) / TM;
  const int kc = std::min(kc_cap, kMmfSplitKc);
  const int S = (n_sb + kc - 1) / kc;
  const auto fits = [&](int64_t tiles) {
    return S == 1 || (static_cast<size_t>(zt) * static_cast<size_t>(tiles) * S * TM * 8 * nt <= ws.part_floats &&
                      static_cast<size_t>(zt) * static_cast<size_t>(tiles) <= static_cast<size_t>(kMmqSplitSems));
  };
  if (S > 1 && (ws.part == nullptr || ws.sem == nullptr))
    return make_error(ErrorCode::kInternal, "mmf: a split launch without a workspace");
  const int kc_max = (n_sb + S - 1) / S;
  MmfSeg segs[kMmfMaxSeg];
  if (fits(n_tiles)) {  // one launch for every segment
    int64_t tile0 = 0;
    for (int i = 0; i < grp.n_seg; ++i) {
      segs[i] = grp.seg[i];
      segs[i].tile0 = tile0;
      tile0 += (grp.seg[i].n_out + TM - 1) / TM;
    }
    return launch_segs<F>(grp, segs, grp.n_seg, n_tiles, S, kc_max, nt, ws, s);
  }
  // Too many partials for the workspace: rows in chunks, one launch each.
  int64_t chunk_tiles = 1;
  while (fits(chunk_tiles * 2)) chunk_tiles *= 2;
  for (int i = 0; i < grp.n_seg; ++i) {
    const MmfSeg& sg = grp.seg[i];
    for (int64_t r = 0; r < sg.n_out; r += TM * chunk_tiles) {
      MmfSeg part = sg;
      part.w = sg.w + static_cast<size_t>(r) * sg.row_bytes;
      part.y = sg.y + r;
      part.bias = sg.bias ? sg.bias + r : nullptr;
      part.n_out = std::min<int64_t>(TM * chunk_tiles, sg.n_out - r);
      part.tile0 = 0;
      KILN_TRY(launch_segs<F>(grp, &part, 1, (part.n_out + TM - 1) / TM, S, kc_max, nt, ws, s));
    }
  }
  return Status::ok();
}
}  // namespace

Status launch_mmf(const MmfGroup& grp, const MmqSplitWs& ws, cudaStream_t s) {
  switch (grp.type) {
    case DType::Q4_K: return launch_fmt<MmfQ4K>(grp, ws, s);
    case DType::Q6_K: return launch_fmt<MmfQ6K>(grp, ws, s);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "mmf: weight type %s", dtype_name(grp.type));
}

}  // namespace kiln::cuda

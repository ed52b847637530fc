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
#include <atomic>
#include <cstdint>

#include "backend/cuda/mmf.cuh"

namespace kiln::cuda {
namespace {

constexpr int kMmfSplitKc = 4;  // super-blocks per split when shared memory allows

// Q6_K's units are 3584 bytes (Q4_K's 2304): fewer warps keep the rings inside the same room (not measured yet).
// wg (wgmma, sm_90a builds on 9.0 devices): two warpgroups, ring 3, for 64-token tiles only. mmf_bench on the H100
// (2026-12-07, best geometry and S of each family per shape, ms, wgmma / mma.sync), 64 tokens: qkv 0.0316 / 0.0307,
// o 0.0199 / 0.0198, gate+up 0.0923 / 0.0973, down 0.0600 / 0.0661, Q6_K down 0.0823 / 0.0871 (the layer's GEMMs
// ~5% faster); 32 tokens: qkv 0.0201 / 0.0172, gate+up 0.0609 / 0.0628, down 0.0318 / 0.0358 (no clear win); 16
// tokens: wgmma 0-11% slower except Q6_K down. Overlapping the MMAs alone moved little: the step stays bound by the
// per-unit chain (ring wait, the Row loads, dequantization) at 2 warps per scheduler.
template <class F>
constexpr MmfGeo mmf_geo(int nt, bool wg) {
  if (wg && nt == 8) return MmfGeo{8, 3, 1, true};
  if constexpr (F::kType == DType::Q6_K) return nt == 8 ? MmfGeo{8, 3, 1, false} : MmfGeo{12, 3, 1, false};
  return nt == 8 ? MmfGeo{8, 4, 1, false} : MmfGeo{16, 3, 1, false};
}

// The attributes launch_mmf asks per launch, read once per device.
enum AttrSlot { kSms, kSmemOptin, kCcMajor, kCcMinor, kNumSlots };
int device_attr(AttrSlot slot) {
  constexpr int kMaxDev = 64;
  constexpr cudaDeviceAttr kAttr[kNumSlots] = {cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                               cudaDevAttrComputeCapabilityMajor, cudaDevAttrComputeCapabilityMinor};
  constexpr int kFallback[kNumSlots] = {1, 48 * 1024, 0, 0};
  static int cache[kMaxDev][kNumSlots];
  static bool known[kMaxDev][kNumSlots];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return kFallback[slot];
  if (!known[dev][slot]) {
    int n = 0;
    cache[dev][slot] = cudaDeviceGetAttribute(&n, kAttr[slot], dev) == cudaSuccess && n >= 0 ? n : kFallback[slot];
    known[dev][slot] = true;
  }
  return cache[dev][slot];
}
int sms() { return std::max(1, device_attr(kSms)); }
int smem_optin() { return device_attr(kSmemOptin); }
std::atomic<bool> g_wg_allowed{true};  // mmf_set_wgmma
// wgmma runs on compute capability 9.0 exactly (sm_90a code), when the build compiled it (the table's kernel exists).
bool wg_here() {
  constexpr MmfGeo W = mmf_geo<MmfQ4K>(8, true);
  return g_wg_allowed.load(std::memory_order_relaxed) && device_attr(kCcMajor) == 9 && device_attr(kCcMinor) == 0 &&
         mmf_wg_kernel(DType::Q4_K, 8, W.warps, W.ring) != nullptr;
}
// Bytes of the block's activation chunk: BN tokens x kc super-blocks, in the mma.sync or the wgmma layout.
int x_bytes(const MmfGeo& g, int kc, int nt) { return g.wg ? mmf_wg_x_bytes(kc, nt) : 8 * nt * mmf_x_pitch(kc); }

int nt_for(int64_t n_tok) { return n_tok <= 8 ? 1 : n_tok <= 16 ? 2 : n_tok <= 32 ? 4 : 8; }

// geo: mmf_geo<F>(NT, ...); the mma.sync kernels are instantiated here, the wgmma ones in sm90a/mmf_wgmma.cu.
template <class F, int NT>
Status launch_nt(const MmfArgs& a, int gx, int zt, int smem, const MmfGeo& geo, cudaStream_t s) {
  constexpr MmfGeo G = mmf_geo<F>(NT, false);
  const void* k = geo.wg ? mmf_wg_kernel(F::kType, NT, geo.warps, geo.ring)
                         : reinterpret_cast<const void*>(mmf_kernel<F, G.warps, G.mt, NT, G.ring>);
  if (k == nullptr) return make_error(ErrorCode::kInternal, "mmf: no wgmma kernel for %d-token tiles", 8 * NT);
  static thread_local int done_dev[2] = {-1, -1};  // per kernel: mma.sync, wgmma
  int dev = 0;
  KILN_CUDA_TRY(cudaGetDevice(&dev));
  if (done_dev[geo.wg] != dev) {
    KILN_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin()));
    done_dev[geo.wg] = dev;
  }
  MmfArgs args = a;
  void* params[] = {&args};
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(a.n_split), static_cast<unsigned>(zt));
  KILN_CUDA_TRY(cudaLaunchKernel(k, grid, dim3(32 * geo.warps), params, static_cast<size_t>(smem), s));
  return Status::ok();
}

template <class F>
Status launch_type(const MmfArgs& a, int gx, int zt, int smem, int nt, const MmfGeo& geo, cudaStream_t s) {
  switch (nt) {
    case 1: return launch_nt<F, 1>(a, gx, zt, smem, geo, s);
    case 2: return launch_nt<F, 2>(a, gx, zt, smem, geo, s);
    case 4: return launch_nt<F, 4>(a, gx, zt, smem, geo, s);
    default: return launch_nt<F, 8>(a, gx, zt, smem, geo, s);
  }
}

// One launch over segs (tiles numbered across them); the caller checked the workspace for S.
template <class F>
Status launch_segs(const MmfGroup& grp, const MmfSeg* segs, int n_seg, int64_t n_tiles, int S, int kc_max, int nt,
                   const MmfGeo& geo, const MmqSplitWs& ws, cudaStream_t s) {
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
  const int smem = geo.warps * geo.ring * geo.mt * F::kUnitBytes + x_bytes(geo, kc_max, nt);
  const int64_t per_split = std::max<int64_t>(1, sms() / (static_cast<int64_t>(S) * zt));
  const int gx = static_cast<int>(std::min<int64_t>(per_split, (n_tiles + geo.warps - 1) / geo.warps));
  return launch_type<F>(a, gx, zt, smem, nt, geo, s);
}

}  // namespace

void mmf_set_wgmma(bool allowed) { g_wg_allowed.store(allowed, std::memory_order_relaxed); }

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
  const MmfGeo geo = mmf_geo<F>(nt, wg_here());
  const int zt = static_cast<int>((grp.n_tok + 8 * nt - 1) / (8 * nt));
  const int n_sb = static_cast<int>(grp.n_in / 256);
  // the longest split shared memory allows, then S
  const int x_room = smem_optin() - geo.warps * geo.ring * geo.mt * F::kUnitBytes;
  const int TM = 16 * geo.mt;  // rows per tile
  int kc_cap = n_sb;
  while (kc_cap > 1 && x_bytes(geo, kc_cap, nt) > x_room) --kc_cap;
  if (x_bytes(geo, kc_cap, nt) > x_room)
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
    return launch_segs<F>(grp, segs, grp.n_seg, n_tiles, S, kc_max, nt, geo, ws, s);
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
      KILN_TRY(launch_segs<F>(grp, &part, 1, (part.n_out + TM - 1) / TM, S, kc_max, nt, geo, ws, s));
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

#ifndef KILN_CUDA_SM90A
const void* mmf_wg_kernel(DType, int, int, int) { return nullptr; }  // the build has no sm_90a code
#endif

}  // namespace kiln::cuda

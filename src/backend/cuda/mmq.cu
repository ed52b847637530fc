// launch_mmq: the tensor-core prefill GEMM's type dispatch and usability rule (kernels, tile geometry and numerics:
// mmq.cuh; instances: instances/mmq_<type>.cu).
//
// Measured -Xptxas -v (registers / thread, 0 bytes spilled everywhere; min blocks from mmq.cuh's
// mmq_q_min_blocks; quantized tiles S 64x64, N 64x128, M 128x64, L 128x128 — mmq.cuh MmqTile):
//   sm_90      Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K  F16 BF16
//     S         125  150  125  150  125  168  154  128  128  162  126  126
//     N         228  254  228  254  228    -    -  254  255    -
//     M         219  242  222  242  219    -    -  246  238    -
//     L         212  240  205  240  212    -  254  242  232  255
//   sm_89 / sm_86 (identical)
//     S         126  148  126  148  126  168  158  128  128  155  128  128
//     N         227  254  227  254  227    -    -  254  254    -
//     M         220  242  220  242  220    -    -  246  246    -
//     L         214  246  209  246  214    -  254  248  238  254
//   sm_80
//     S         125  146  125  146  125  164  158  128  128  155  128  128
//     N         227  254  227  254  227    -    -  254  254    -
//     M         220  244  220  244  220    -    -  248  248    -
//     L         216  238  209  238  216    -  255  236  236  254
//   static smem: float 20480 B; quantized (dynamic): S 28672, N / M 43008, L 57344 B.
// The pipelined kernels (mmq.cuh: tiles 5-12; registers sm_90 / sm_89 / sm_86 / sm_80, 0 bytes spilled, no stack;
// dynamic smem in the ledger at the top of mmq.cuh). With the split-K epilogue (mmq_finish) sm_90 Q4_K reads PS 120,
// PM 168, PL 168, P2S 128, P2M 158, PUM 255, PDS 118, PDL 240, mmq_q_kernel S 128 / N 254 / M 248 / L 238, and every
// other type's instance compiles for sm_90 without spills. The 16- / 32-token tiles (P16 / P32, sm_90): Q4_K 91 / 127,
// Q5_K 98 / 127, Q6_K 90 / 134, Q8_0 90 / 109 registers, no spills. The other columns are from before split-K:
//   mmq_p_kernel  Q4_K: PS 123/122/122/128  PM 166/166/166/168  PL 168 (all)  P2S 124/118/118/118  P2M 162 (all)
//                       PUM 254 (all)
//                 Q5_K: PS 122/124/124/128  PM 242/248/248/226  PL 240/240/240/246  P2S 128 (all)  P2M 168 (all)
//                       PUM 240/248/248/254
//   mmq_p6_kernel Q6_K: 64x64 133/133/133/131  128x128 221/220/220/221;  Q8_0: 96 (all), 168 (all);
//                 Q4_K (PDS / PDL): 118 (all), 240/240/240/184
//   mmq_fp_kernel F16 = BF16: PS 96/90/90/90  PM 132/128/128/128  PL 132/128/128/128  P2S 96/88/88/88
//                       P2M 132/128/128/128  PUM (128 x 128, 3 slots) 120 (all)
//   sm_75: empty bodies (4 registers), never launched (mmq_usable).
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/mmq.cuh"

namespace kiln::cuda {

bool mmq_supports(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::MXFP4: case DType::F16: case DType::BF16: return true;
    default: return false;
  }
}

namespace {
// Compiled like every kernel of the backend (same arch list): its PTX version is the virtual arch the code that runs
// on this device was built from (a binary built for sm_75 only and JIT-compiled on an sm_80+ GPU has empty mmq
// kernel bodies: __CUDA_ARCH__ 750).
__global__ void mmq_arch_probe() {}

}  // namespace

// launch.h: compute capability >= 8.0 and code built for >= compute_80. Cached per device id (1 = yes, -1 = no).
bool int8_mma_ok() {
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

namespace {
int g_tile_override = 0;
int sm_count() {
  constexpr int kMaxDev = 64;
  static int cache[kMaxDev] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return 1;
  if (cache[dev] == 0) {
    int n = 0;
    cache[dev] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0 ? n : 1;
  }
  return cache[dev];
}
}  // namespace

void mmq_set_tile_override(int tile) { g_tile_override = tile; }

size_t mmq_smem_optin() {
  constexpr int kMaxDev = 64;
  static int cache[kMaxDev] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) return 48 * 1024;
  if (cache[dev] == 0) {
    int n = 0;
    cache[dev] = cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess && n > 0
                     ? n
                     : 48 * 1024;
  }
  return static_cast<size_t>(cache[dev]);
}

// mmq_q_kernel's tile (mmq.cuh MmqTile), per type group and grid size; measured on the H200 (132 SMs) at
// n_tok = 512, every tile forced (mmq_bench): no tile is best everywhere, the differences are 5-30%:
//   Q4_K / Q5_K: 128 x 64 for 1-4 waves of it (q/o, down: 256 blocks), else 64 x 64 (gate/up: 16 warps / SM win);
//   Q3_K / Q6_K: 128 x 128 when its grid covers ~all SMs (q/o, gate/up, down: +12-30% over 64 x 64);
//   the 32-element types (Q4_0 .. Q8_0): 64 x 128 when it gives >= 1 block per SM (+12-40%);
//   n_tok < 128 or small grids (k/v 1024 rows: 64 x 64 has 2-4x the blocks): 64 x 64. Q2_K: 64 x 64 only (mmq.cuh).
// Also the tile where a pipelined kernel cannot run (alignment, n_in % 128, shared memory of the device).
static int mmq_pick_tile_q(const MatmulParams& p) {
  if (p.n_tok < 128) return kMmqTileS;
  const int64_t n_sm = sm_count();
  const auto grid = [&](int bm, int bn) { return (p.n_tok + bn - 1) / bn * ((p.n_out + bm - 1) / bm); };
  switch (p.type) {
    case DType::Q4_K: case DType::Q5_K: {
      const int64_t g = grid(128, 64);
      return g >= n_sm && g < 4 * n_sm ? kMmqTileM : kMmqTileS;
    }
    case DType::Q3_K: case DType::Q6_K: return 10 * grid(128, 128) >= 9 * n_sm ? kMmqTileL : kMmqTileS;
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
      return grid(64, 128) >= n_sm ? kMmqTileN : kMmqTileS;
    default: return kMmqTileS;
  }
}

// The tile per call. Q4_K, Q5_K, Q6_K, Q8_0, F16, BF16: the pipelined kernels (mmq.cuh), picked from mmq_bench on
// the H200 (2026-12-01, n_tok 512, every tile forced, two runs within 2%; TFLOP/s of q/o 4096x4096, k/v 1024x4096,
// gate/up 14336x4096, down 4096x14336, the pick first, the best mmq_q_kernel / mmq_f_kernel tile after '/'):
//   Q4_K: P2S when 128 x 64 tiles do not fill the SMs (k/v 67.8 / 61.3); PUM for one wave at 2 blocks per SM (q/o
//         132.6 / 120.3, down 144.6 / 115.4); P2M beyond (gate/up 138.5 / 107.7; PUM 136.1)
//   Q5_K: P2S, else P2M (q/o 109.2 / 111.7, gate/up 122.2 / 98.6, down 115.4 / 106.4, k/v 61.1 / 59.8)
//   Q6_K, Q8_0: mmq_p6_kernel's 128 x 128 when its grid covers ~all SMs, else its 64 x 64 (Q6_K 112.4 / 82.3,
//         53.5 / 40.4, 101.8 / 74.1, 117.2 / 86.8; Q8_0 156.9 / 97.0, 68.8 / 43.4, 150.9 / 86.1, 171.1 / 95.3)
//   F16 / BF16: P2S, PM for one wave at 2 per SM, P2M beyond (F16 q/o 165.2 / 126.2, k/v 70.3 / 57.9,
//         gate/up 174.9 / 120.3, down 178.8 / 132.3)
int mmq_pick_tile(const MatmulParams& p) {
  if (g_tile_override != 0) return g_tile_override;
  if (p.type == DType::Q4_K || p.type == DType::Q5_K || p.type == DType::Q6_K || p.type == DType::Q8_0) {
    if (p.n_tok <= 16) return kMmqTileP16;
    if (p.n_tok <= 32) return kMmqTileP32;
  }
  const int64_t n_sm = sm_count();
  const auto grid = [&](int bm, int bn) { return (p.n_tok + bn - 1) / bn * ((p.n_out + bm - 1) / bm); };
  const int64_t gm = grid(128, 64);
  switch (p.type) {
    case DType::Q4_K: return gm < n_sm ? kMmqTileP2S : gm <= 2 * n_sm ? kMmqTilePUM : kMmqTileP2M;
    case DType::Q5_K: return gm < n_sm ? kMmqTileP2S : kMmqTileP2M;
    case DType::Q6_K: case DType::Q8_0: return 10 * grid(128, 128) >= 9 * n_sm ? kMmqTilePL : kMmqTilePS;
    case DType::F16: case DType::BF16: return gm < n_sm ? kMmqTileP2S : gm <= 2 * n_sm ? kMmqTilePM : kMmqTileP2M;
    default: return mmq_pick_tile_q(p);
  }
}

// Split-K (mmq_common.cuh mmq_finish): a grid of fewer than half a wave of tiles (decode-sized token counts, the
// k/v projections) gets S blocks per tile, S = the resident slots over the tiles (one wave, no tail wave), at most
// kMmqSplitMax, each split at least kMmqSplitMinStages stages long, within the workspace. Half a wave or more is
// left alone: the partials' traffic would buy little.
int mmq_split_count(const MatmulParams& p, int64_t tiles, int per_sm, int n_stage, int bm, int bn) {
  if (!p.split.part || !p.split.sem || tiles <= 0 || tiles > kMmqSplitSems) return 1;
  const int64_t slots = static_cast<int64_t>(per_sm) * sm_count();
  if (2 * tiles > slots) return 1;
  int64_t s = std::min<int64_t>({slots / tiles, n_stage / kMmqSplitMinStages, kMmqSplitMax,
                                 static_cast<int64_t>(p.split.part_floats / (static_cast<size_t>(tiles) * bm * bn))});
  return static_cast<int>(std::max<int64_t>(s, 1));
}

int mmq_fallback_tile(const MatmulParams& p, int tile) {
  if (g_tile_override == 0) return mmq_pick_tile_q(p);
  return tile == kMmqTilePM || tile == kMmqTileP2M || tile == kMmqTilePUM ? kMmqTileM
         : tile == kMmqTilePL || tile == kMmqTilePDL                    ? kMmqTileL
                                                                        : kMmqTileS;
}

bool mmq_usable(const MatmulParams& p) {
  if (!mmq_supports(p.type) || !int8_mma_ok()) return false;  // sm_75: the f32 GEMM (gemm.cu)
  if ((p.n_tok + kMmqBN - 1) / kMmqBN > INT32_MAX || (p.n_out + kMmqBM - 1) / kMmqBM > 65535) return false;
  if (p.type == DType::F16 || p.type == DType::BF16) {
    // 16-byte cp.async of weight rows and float4 loads of x
    const auto al16 = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    return p.n_in % 8 == 0 && p.w_row_bytes % 16 == 0 && al16(p.w) && al16(p.x) && p.x_stride % 4 == 0;
  }
  return p.n_in % 32 == 0;
}

Status launch_mmq(const MatmulParams& p, const ActQ& a, cudaStream_t s, const MatmulGroup* group) {
  if (p.n_tok == 0 || p.n_out == 0) return Status::ok();
  if (!mmq_usable(p))
    return make_error(ErrorCode::kInternal, "mmq: %s %lld x %lld x %lld not usable here", dtype_name(p.type),
                      static_cast<long long>(p.n_out), static_cast<long long>(p.n_in),
                      static_cast<long long>(p.n_tok));
  switch (p.type) {
    case DType::Q4_0: return mmq_run<DType::Q4_0>(p, a, s, group);
    case DType::Q4_1: return mmq_run<DType::Q4_1>(p, a, s, group);
    case DType::Q5_0: return mmq_run<DType::Q5_0>(p, a, s, group);
    case DType::Q5_1: return mmq_run<DType::Q5_1>(p, a, s, group);
    case DType::Q8_0: return mmq_run<DType::Q8_0>(p, a, s, group);
    case DType::Q2_K: return mmq_run<DType::Q2_K>(p, a, s, group);
    case DType::Q3_K: return mmq_run<DType::Q3_K>(p, a, s, group);
    case DType::Q4_K: return mmq_run<DType::Q4_K>(p, a, s, group);
    case DType::Q5_K: return mmq_run<DType::Q5_K>(p, a, s, group);
    case DType::Q6_K: return mmq_run<DType::Q6_K>(p, a, s, group);
    case DType::MXFP4: return mmq_run<DType::MXFP4>(p, a, s, group);
    case DType::F16: return mmq_run<DType::F16>(p, a, s, group);
    case DType::BF16: return mmq_run<DType::BF16>(p, a, s, group);
    default: break;
  }
  return make_error(ErrorCode::kUnsupported, "mmq: weight type %s", dtype_name(p.type));
}

}  // namespace kiln::cuda

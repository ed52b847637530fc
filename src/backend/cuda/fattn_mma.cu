// Flash-attention prefill on tensor cores (issue 14, register-resident geometry; issue 18's windowed form): f16 K/V
// cache, hd_k == hd_v in {64, 128, 256}, mma.sync m16n8k16 (f16 x f16 -> f32), sm_80+. Selected by
// fattn_mma_selected (launch.h) for steps with max_q_len >= kFattnMinQ; decode, F32/Q8_0 caches, other head dims
// and sm_75 stay on attention.cu (sm_75 has ldmatrix but neither cp.async nor the m16n8k16 f16 shape: the kernel
// body compiles to a trap there and the selector never picks it).
//
// Geometry. A CTA = 4 warps = 64 query rows x one KV head (group). Row r of the CTA is the pair
//   (token qt * tpc + r / hpc of its sequence, query head g * n_rep + hc * hpc + r % hpc),
// hpc = min(n_rep, 64) heads of the KV group per CTA, tpc = 64 / hpc tokens: token-major, the heads of one GQA group
// interleaved, so one K/V tile in shared memory serves every query head of the group, and the 16 rows a warp owns
// are consecutive tokens (similar causal extents, so whole-tile skips and mask-free tiles are common). Rows past
// tpc * hpc (n_rep not a power of two) and tokens past the sequence's q_len are dead rows (zero Q, never written).
// Grid: x = n_seq * q_tiles (q_tiles = ceil(max_q_len / tpc), the last tiles of a sequence first: they have the
// longest causal range), y = n_head_kv * ceil(n_rep / hpc). A query tile never mixes sequences. Tokens that belong
// to no sequence (padding: kv_len 0) get their zero rows from fattn_zero_padded.
//
// Per KV tile of BC positions (tile bases aligned to BC; the CTA's range is [min row window start, max kv_len) of
// its rows, so tiles wholly outside every row's window are never loaded):
//   K, V -> shared (cp.async 16-byte chunks, double-buffered: tile j+1 streams in while tile j computes; rows read
//   through the block table, slot = table[p / bs] * bs + p % bs per position, zero-filled outside the CTA's range);
//   S = Q K^T in registers (per warp 16 x BC f32 accumulators); scale (log2 domain), per-element mask; online
//   softmax on the fragments; P = exp2(S - m) converted in registers to the f16 A operand; O += P V.
// Fragment layouts (PTX ISA, mma.m16n8k16 .f16, g = lane / 4, c = lane % 4):
//   A (16x16 row): a0 (g, 2c..2c+1) a1 (g+8, 2c..) a2 (g, 2c+8..) a3 (g+8, 2c+8..)
//   B (16x8 col):  b0 (k 2c..2c+1, n g) b1 (k 2c+8.., n g)
//   C (16x8 f32):  c0 c1 (g, 2c..2c+1) c2 c3 (g+8, 2c..2c+1)
//   Q: A operand, ldmatrix.x4 from row-major Q in shared memory (rows = query rows, cols = d).
//   K: B operand of Q K^T: B[k = d][n = pos] = K[pos][d], i.e. "col" (k contiguous per n) = K rows as stored:
//      ldmatrix.x4 (no .trans) on 8 positions x 8 dims per matrix.
//   V: B operand of P V: B[k = pos][n = d] = V[pos][d], row-major (n contiguous per k): ldmatrix.x4.trans.
//   P: the C fragments of n-tiles 2j, 2j+1 of S (positions 16j..16j+15) are exactly the A fragment of k-step j
//      (a0 = C[2j].c0c1, a1 = C[2j].c2c3, a2 = C[2j+1].c0c1, a3 = C[2j+1].c2c3): converted in place, no shared memory.
//   Row max: each lane holds rows g and g+8, the 4 lanes of a row differ in bits 0-1: __shfl_xor 1, 2. The row sum
//   stays lane-partial (the rescale factor is uniform per row) and is reduced with the same butterfly at the end.
// Masks: row r sees [lo_r, hi_r) = [max(0, kv_len - window) (window > 0), kv_len); a warp skips a tile wholly
// outside all its rows' ranges (its running max / sum / output untouched) and evaluates no mask on a tile wholly
// inside all of them. A row whose max is still -inf uses 0 as the offset (no -inf - -inf = NaN), a factor of 1 and
// p = 0; kv_len 0 gives a zero row. The range is each row's own kv_len, never derived from its place in the tile, so
// a non-causal step (an encoder: every token's kv_len = its whole sequence) is the same code. Attention sinks
// (AttnParams::sinks) join each row once, at the output (fattn_mma.cuh fa_store), for every kernel of this file and
// of sm90a/fattn_wgmma.cu.
// Numerics (the CUDA bound of test_backend_ops attn_precision: eps_q = eps_p = 2^-11): q rounded to f16 (as the CPU
// reference does), K/V the cache's f16 values, Q.K with f32 accumulation, s * scale * log2(e) in f32, exp2 in f32,
// P rounded to f16 for P.V (f32 accumulation), the row sum over the unrounded f32 p, output O / l in f32.
// Selection threshold kFattnMinQ = 16: a 16-token query tile fills a 16-row MMA block per head already (and the
// whole 64-row CTA from GQA 4 up); below it (decode, short steps) the split-KV kernel parallelizes over the KV range,
// which this kernel does not. Known limit: in a mixed step (one long prompt beside decode tokens) a decode sequence
// deep in its cache runs as one CTA per KV head over its whole range here (no KV split).
// Host check of the lane maps above (no GPU): dev/cuda/fattn_lane_maps.py.
// For 9.0 devices at head dims 64, 128 and 256 a wgmma kernel exists beside this one (sm90a/fattn_wgmma.cu: same row map,
// masks and numerics; fattn_mma.cuh fa_wg_variant picks a variant or none, fattn_wg_selected below applies it). The
// pieces both kernels share are in fattn_mma.cuh.
#include <algorithm>
#include <atomic>
#include <climits>

#include "backend/cuda/fattn_mma.cuh"

namespace kiln::cuda {
namespace {

// KV tile positions per head dim. Limiting resource: registers per thread (S accumulators = BC / 2 f32 per lane,
// beside D / 2 f32 of output). 64/128: BC 64 (S 32 regs); 256: BC 32 (S 16 regs: O alone is 128).
constexpr int fa_bc(int d) { return d >= 256 ? 32 : 64; }
// Q fragments in registers (D / 4 32-bit regs per lane: 16 / 32 for 64 / 128) or loaded from shared memory per MMA
// step (256: 64 more registers would not fit beside O's 128).
constexpr bool fa_q_in_regs(int d) { return d <= 128; }
// Skip O *= alpha when every lane's factor is exactly 1 (warp vote): only where O is large (256: 128 FMULs per lane
// per tile, as many issue slots as the tile's 128 MMAs). Why it should pay: the factor is 1 exactly when none of
// the warp's 16 rows raised its max in this tile; a row at depth n raises it in a tile of 32 with probability ~32/n
// for exchangeable scores (lower with attention sinks), so at depth 4096 ~88% of tiles skip, for one vote. Cost
// when not taken: the vote. To measure, flip this to false and compare fattn_bench's hd 256 rows.
constexpr bool fa_skip_unit_rescale(int d) { return d >= 256; }
constexpr int fa_ld(int d) { return d + 8; }  // shared row stride in halves: +16 bytes, ldmatrix conflict-free
// Shared memory: 2 stages x (K + V) [BC][D+8] f16, plus Q [64][D+8] f16 where Q stays in shared memory (256).
// Where Q moves to registers (64 / 128) its staging aliases stage 1 (2 x BC >= 64 rows), which is first written
// after a barrier that follows the Q fragment loads: 128 -> 69.6 KB, 3 CTAs (12 warps) per SM on sm_90.
// Limiting resource for 256 on sm_86/89: their 99 KB opt-in.
constexpr size_t fa_smem(int d) {
  return ((fa_q_in_regs(d) ? 0 : static_cast<size_t>(kFaRows)) + 4 * static_cast<size_t>(fa_bc(d))) * fa_ld(d) * 2;
}
static_assert(2 * fa_bc(64) >= kFaRows && 2 * fa_bc(128) >= kFaRows, "Q staging must fit in stage 1");

__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// Register / shared-memory ledger per instance (128 threads, __launch_bounds__(128, 2)). Planned per lane (32-bit
// registers), then measured with nvcc 13.0 -Xptxas -v -O3 (registers / stack frame / spill stores+loads):
//   D = 64,  BC 64: Q frags 16 + O 32 + S 32 (+ P 16 transient) = 96 + addressing / row state.
//            smem: 2 stages x (K + V) 64 x 72 x 2 = 36.9 KB (+16 B static; Q staged in stage 1).
//            measured sm_90: 152 regs, 0 B stack, 0 / 0 spills; sm_80/89: 143, 0, 0 / 0.
//            per SM (sm_90): 3 CTAs by registers (160 x 128 x 3 = 61K of 64K), 6 by smem -> 3 (12 warps).
//   D = 128, BC 64: Q frags 32 + O 64 + S 32 (+ P 16) = 144 + addressing / row state.
//            smem: 2 stages x (K + V) 64 x 136 x 2 = 69.6 KB (Q staged in stage 1).
//            measured sm_90: 203 regs, 0 B stack, 0 / 0 spills; sm_80/89: 200, 0, 0 / 0.
//            per SM: 2 CTAs (8 warps) on every arch: registers (208 x 128 x 2 = 53K) and, below sm_90, smem.
//   D = 256, BC 32: Q stays in shared memory, one A fragment (4 regs) per k-step; O 128 + S 16 (+ P 8) = 156 +
//            addressing (Q in registers would add 64: 220 before addressing -> spills). smem: Q 64 x 264 x 2 =
//            33.8 KB + K/V 2 x 2 x 32 x 264 x 2 = 67.6 KB = 101,376 B + 16 B static: just over sm_86/89's opt-in
//            (101,376 B; there hd 256 routes to attention.cu). 2 CTAs per SM on sm_90 (smem and registers).
//            measured sm_90: 242 regs, 0 B stack, 0 / 0 spills; sm_80/89: 237, 0, 0 / 0.
//   The hot loop (per KV tile): no local memory on any instance (0 B stack frame everywhere).
// Min blocks 2 (<= 255 registers: no constraint in practice). Tried for hd 128 on sm_90, where shared memory would
// allow 3 CTAs (3 x 69.6 KB): min blocks 3 caps registers at 168 and ptxas then spills 4-84 bytes, so 2 it is. hd
// 128 with BC 32 and Q in shared memory fits 3 (155 registers, no spills): an alternative to measure if 8 warps do
// not hide the MMA / ldmatrix latency.
constexpr int fa_min_blocks(int) { return 2; }

template <int D>
__global__ void __launch_bounds__(kFaThreads, fa_min_blocks(D)) fattn_kernel(AttnParams p, FaGeo geo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never selected below sm_80 (fattn_mma_selected); the asm helpers below are empty there
  return;
#endif
  constexpr int BC = fa_bc(D), LD = fa_ld(D), NS = BC / 8, NO = D / 8, KQ = D / 16;
  constexpr int CH = D / 8;  // 16-byte chunks per K/V row
  extern __shared__ __align__(16) uint8_t fa_smem_raw[];
  __half* kvs = reinterpret_cast<__half*>(fa_smem_raw);  // stage s: K at kvs + s * 2 * BC * LD, V after it
  __half* qs = kvs + (fa_q_in_regs(D) ? 2 : 4) * BC * LD;  // [64][LD]: aliases stage 1, or after the stages

  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  FaCta c;
  if (!fa_cta(p, geo, c)) return;
  fa_stage_q<D, LD>(p, geo, c, qs);
  const FaRows w = fa_rows(p, geo, c, warp, lane);
  int kv_begin, kv_end;
  fa_cta_range(w, lane, kv_begin, kv_end);  // its barrier also publishes the Q tile
  const int t_first = kv_end > 0 ? kv_begin / BC * BC : 0;
  const int n_tiles = kv_end > 0 ? ceil_div(kv_end - t_first, BC) : 0;
  const int32_t* table = c.table;
  const int g = c.g;

  // Q fragments (A operand) in registers for D <= 128.
  uint32_t qf[fa_q_in_regs(D) ? KQ : 1][4];
  const int lm = lane >> 3, lr = lane & 7;  // ldmatrix: matrix id, row within it
  const uint32_t q_base = smem_u32(qs + (warp * 16 + (lm & 1) * 8 + lr) * LD + (lm >> 1) * 8);
  if constexpr (fa_q_in_regs(D)) {
#pragma unroll
    for (int k = 0; k < KQ; ++k) ldsm_x4(q_base + k * 32, qf[k][0], qf[k][1], qf[k][2], qf[k][3]);
    __syncthreads();  // every warp holds its Q fragments: stage 1 (the Q staging) may be overwritten
  }

  const int bs_shift = (p.block_size & (p.block_size - 1)) == 0 ? __ffs(p.block_size) - 1 : -1;
  auto load_tile = [&](int j, int stage) {
    const int base = t_first + j * BC;
    __half* ks = kvs + stage * 2 * BC * LD;
    __half* vs = ks + BC * LD;
    for (int i = tid; i < BC * CH; i += kFaThreads) {  // staging loop over the thread count
      const int r = i / CH, ch = i % CH, pos = base + r;
      const bool ok = pos >= kv_begin && pos < kv_end;
      const uint8_t* kp = p.k;
      const uint8_t* vp = p.v;
      if (ok) {
        const int64_t slot = fa_slot(table, pos, p.block_size, bs_shift);
        kp += slot * p.k_slot_bytes + g * p.k_head_bytes + ch * 16;
        vp += slot * p.v_slot_bytes + g * p.v_head_bytes + ch * 16;
      }
      cp_async16(smem_u32(ks + r * LD + ch * 8), kp, ok);
      cp_async16(smem_u32(vs + r * LD + ch * 8), vp, ok);
    }
    cp_async_commit();
  };

  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  const float sl2 = p.scale * 1.4426950408889634f;

  if (n_tiles > 0) load_tile(0, 0);
  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) {
      load_tile(j + 1, (j + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int base = t_first + j * BC;
    const bool skip = w.skip(base, BC);  // warp-uniform: every live row masks the whole tile
    if (!skip) {
      const bool full = w.full(base, BC);  // no row masks any element
      const __half* ks = kvs + (j & 1) * 2 * BC * LD;
      const __half* vs = ks + BC * LD;
      // S = Q K^T.
      float s[NS][4];
#pragma unroll
      for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      const uint32_t k_base = smem_u32(ks + ((lm >> 1) * 8 + lr) * LD + (lm & 1) * 8);
#pragma unroll
      for (int k = 0; k < KQ; ++k) {
        uint32_t a[4];
        if constexpr (fa_q_in_regs(D)) {
          a[0] = qf[k][0], a[1] = qf[k][1], a[2] = qf[k][2], a[3] = qf[k][3];
        } else {
          ldsm_x4(q_base + k * 32, a[0], a[1], a[2], a[3]);
        }
#pragma unroll
        for (int n = 0; n < NS; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(k_base + (n * 8 * LD + k * 16) * 2, b0, b1, b2, b3);
          mma16816(s[n], a, b0, b1);
          mma16816(s[n + 1], a, b2, b3);
        }
      }
      float alpha[2];
      fa_softmax<NS>(s, base, full, w, sl2, m_run, l_run, alpha, lane);
      bool rescale = true;
      if constexpr (fa_skip_unit_rescale(D)) rescale = !__all_sync(0xffffffffu, alpha[0] == 1.0f && alpha[1] == 1.0f);
      if (rescale) {
#pragma unroll
        for (int n = 0; n < NO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      }
      // O += P V: P's C fragments are the A fragments (f16) of the k-steps over positions.
      const uint32_t v_base = smem_u32(vs + ((lm & 1) * 8 + lr) * LD + (lm >> 1) * 8);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        uint32_t a[4];
        fa_p_frag<NS>(s, kk, a);
#pragma unroll
        for (int n = 0; n < NO; n += 2) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4_t(v_base + (kk * 16 * LD + n * 8) * 2, b0, b1, b2, b3);
          mma16816(o[n], a, b0, b1);
          mma16816(o[n + 1], a, b2, b3);
        }
      }
    }
    __syncthreads();  // stage (j & 1) is overwritten by the load of tile j + 2
  }

  fa_store<D>(p, geo, c, w, o, m_run, l_run, warp, lane);
}

// Rows of tokens with kv_len 0 (padding, inside or outside every sequence): zeros, as attention.cu writes them.
__global__ void fattn_zero_padded(const int32_t* kv_len, float* dst, int row_floats) {
  const int t = blockIdx.x;
  if (kv_len[t] != 0) return;
  float* d = dst + static_cast<size_t>(t) * row_floats;
  for (int i = threadIdx.x; i < row_floats; i += blockDim.x) d[i] = 0.0f;
}

template <int D>
Status launch_d(const AttnParams& p, cudaStream_t s) {
  const FaGeo geo = fa_geo(p);
  const dim3 grid(static_cast<unsigned>(p.n_seq * geo.q_tiles), static_cast<unsigned>(p.n_head_kv * geo.n_hchunk));
  fattn_kernel<D><<<grid, kFaThreads, fa_smem(D), s>>>(p, geo);
  KILN_CUDA_LAUNCH_CHECK();
  return Status::ok();
}

// The wgmma kernels (sm90a/fattn_wgmma.cu) run on compute capability 9.0 exactly, for head dims 64, 128 and 256,
// when the build has them and fattn_mma_init could give them their shared memory (per device and head dim: wg_slot).
constexpr int kMaxDev = 16;
constexpr int wg_slot(int d) { return d == 64 ? 0 : d == 128 ? 1 : 2; }
bool g_wg_ready[kMaxDev][3] = {};
std::atomic<bool> g_wg_allowed{true};  // fattn_set_wgmma
std::atomic<int> g_wg_forced{-1};      // fattn_force_wg_variant: an index into kFaWgVariants, -1 the table's choice

}  // namespace

size_t fattn_mma_smem_bytes(int head_dim) { return fa_smem(head_dim) + 64; }  // + the static s_lo / s_hi (16 B)

bool fattn_mma_selected(const AttnParams& p, int cc, size_t smem_optin) {
  const int d = p.hd_k;
  if (p.kv_type != DType::F16 || p.hd_v != d || (d != 64 && d != 128 && d != 256)) return false;
  if (cc < 80 || p.max_q_len < kFattnMinQ || p.n_seq <= 0) return false;
  if (!p.seq_row || !p.seq_q_start || !p.seq_q_len) return false;
  if (reinterpret_cast<uintptr_t>(p.k) % 16 || reinterpret_cast<uintptr_t>(p.v) % 16 || p.k_slot_bytes % 16 ||
      p.v_slot_bytes % 16 || reinterpret_cast<uintptr_t>(p.dst) % 8)
    return false;
  const FaGeo geo = fa_geo(p);
  if (static_cast<int64_t>(p.n_seq) * geo.q_tiles > INT32_MAX || p.n_head_kv * geo.n_hchunk > 65535) return false;
  return fattn_mma_smem_bytes(d) <= smem_optin;
}

Status fattn_mma_init(size_t max_smem) {
  // Only what the device allows: a head dim whose kernel does not fit is never selected (fattn_mma_selected).
  if (fattn_mma_smem_bytes(64) <= max_smem)
    KILN_CUDA_TRY(cudaFuncSetAttribute(fattn_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fa_smem(64))));
  if (fattn_mma_smem_bytes(128) <= max_smem)
    KILN_CUDA_TRY(cudaFuncSetAttribute(fattn_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fa_smem(128))));
  if (fattn_mma_smem_bytes(256) <= max_smem)
    KILN_CUDA_TRY(cudaFuncSetAttribute(fattn_kernel<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fa_smem(256))));
  int dev = 0, major = 0, minor = 0;
  KILN_CUDA_TRY(cudaGetDevice(&dev));
  KILN_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KILN_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (dev < kMaxDev) {
    for (const int d : {64, 128, 256}) {
      // Every variant gets its shared memory (tests and dev/cuda/fattn_bench run each); all must fit.
      bool ok = major == 9 && minor == 0;
      for (const FaWgVariant v : kFaWgVariants) {
        if (v.ws && d > 128) continue;  // no warp-specialized kernel at head dim 256
        const void* k = fattn_wg_kernel(d, v);
        const size_t smem = fattn_wg_smem(d, v);
        ok = ok && k != nullptr && smem + 1024 <= max_smem;
        if (ok) KILN_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      }
      g_wg_ready[dev][wg_slot(d)] = ok;
    }
  }
  return Status::ok();
}

void fattn_set_wgmma(bool allowed) { g_wg_allowed.store(allowed, std::memory_order_relaxed); }
void fattn_force_wg_variant(int index) { g_wg_forced.store(index, std::memory_order_relaxed); }

bool fattn_wg_selected(const AttnParams& p) {
  if (!g_wg_allowed.load(std::memory_order_relaxed) || (p.hd_k != 64 && p.hd_k != 128 && p.hd_k != 256)) return false;
  const int forced = g_wg_forced.load(std::memory_order_relaxed);
  if (fa_wg_variant(p.hd_k).wgs == 0 && forced < 0) return false;
  // a forced variant with no kernel at this head dim (ws at 256): the mma.sync kernel
  if (forced >= 0 && forced < kFaWgVariantCount && fattn_wg_kernel(p.hd_k, kFaWgVariants[forced]) == nullptr) return false;
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kMaxDev && g_wg_ready[dev][wg_slot(p.hd_k)];
}

Status launch_fattn_mma(const AttnParams& p, cudaStream_t s) {
  if (p.n_tok == 0) return Status::ok();
  fattn_zero_padded<<<static_cast<unsigned>(p.n_tok), 128, 0, s>>>(p.kv_len, p.dst, p.n_head * p.hd_v);
  KILN_CUDA_LAUNCH_CHECK();
  if (p.n_seq == 0) return Status::ok();
  if (fattn_wg_selected(p)) {
    const int forced = g_wg_forced.load(std::memory_order_relaxed);
    return launch_fattn_wg(p, forced >= 0 && forced < kFaWgVariantCount ? kFaWgVariants[forced] : fa_wg_variant(p.hd_k), s);
  }
  switch (p.hd_k) {
    case 64: return launch_d<64>(p, s);
    case 128: return launch_d<128>(p, s);
    case 256: return launch_d<256>(p, s);
    default: return make_error(ErrorCode::kUnsupported, "fattn_mma: head dim %d", p.hd_k);
  }
}

Status launch_fattn_wg(const AttnParams& p, FaWgVariant v, cudaStream_t s) {
  const void* k = fattn_wg_kernel(p.hd_k, v);
  if (k == nullptr) return make_error(ErrorCode::kInternal, "fattn: no wgmma kernel for head dim %d", p.hd_k);
  AttnParams args = p;
  FaGeo geo = fa_geo(p, kFaRows * v.wgs);
  if (static_cast<int64_t>(p.n_seq) * geo.q_tiles > INT32_MAX || p.n_head_kv * geo.n_hchunk > 65535)
    return make_error(ErrorCode::kInternal, "fattn: grid too large");
  void* params[] = {&args, &geo};
  const dim3 grid(static_cast<unsigned>(p.n_seq * geo.q_tiles), static_cast<unsigned>(p.n_head_kv * geo.n_hchunk));
  const unsigned threads = static_cast<unsigned>(kFaThreads * (v.wgs + (v.ws ? 1 : 0)));  // ws: + the copying warpgroup
  KILN_CUDA_TRY(cudaLaunchKernel(k, grid, dim3(threads), params, fattn_wg_smem(p.hd_k, v), s));
  return Status::ok();
}

#ifndef KILN_CUDA_SM90A
const void* fattn_wg_kernel(int, FaWgVariant) { return nullptr; }  // the build has no sm_90a code
size_t fattn_wg_smem(int, FaWgVariant) { return 0; }
#endif

}  // namespace kiln::cuda

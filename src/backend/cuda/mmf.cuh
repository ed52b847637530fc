// mmf: the weight-streaming tensor-core GEMM for a few tokens (the selector's middle range, ~9..64 tokens). Each
// weight is read from memory once and dequantized once, in registers, straight into the f16 A fragments of
// mma.sync m16n8k16 (the weight rows as M); the scales go into the weights, so no per-output f32 work remains (what
// bounds mmq's int8 path at these sizes by instruction issue). Activations are f16 (launch_mmf's caller converts);
// accumulation is f32 in the tensor cores.
//
// Work split. A warp owns 16 weight rows (a tile) and every token of the block (BN = 8 NT); a block's warps take
// tiles round-robin across the whole output (persistent over tiles), so one block's activation chunk in shared
// memory serves many tiles. K is split S ways (gridDim.y): split s takes super-blocks [s n/S, (s+1) n/S); with S > 1
// each tile's S partials go to a workspace and the warp that arrives last sums them in split order (deterministic:
// the same bits whoever is last) and resets the tile's counter for the next launch. gridDim.z: token tiles of BN.
//
// Lanes and K. The GEMM does not care which K index a fragment column holds as long as A and B agree. Lane (g, t)
// (g = lane / 4, t = lane % 4) takes, per 256-element super-block, the 64 elements of its format's lane range
// (MmfQ4K: qs bytes 32t..32t+31 = elements 64t..64t+63, sub-blocks 2t and 2t+1), and fragment f (0..15) holds its
// elements 4f..4f+3: A columns (2t, 2t+1) <- elements 4f, 4f+1 and (2t+8, 2t+9) <- 4f+2, 4f+3. The activation tile
// keeps the same order, so one 16-byte shared load gives a lane its B fragments of f and f+1 (elements 4f..4f+7
// of its range, token g).
//
// Shared memory (dynamic): per warp a ring of R weight units (one super-block of 16 rows, the GGUF bytes as they
// are: kUnitBytes), filled by cp.async R - 1 units ahead; then the block's activations [BN tokens][kc super-blocks
// x 4 lane ranges of 64 halves + 16 bytes of pad]: rows mmf_x_pitch bytes apart (= 64 mod 128) so the 16-byte B
// loads of a quarter warp (2 tokens x 4 ranges) hit distinct banks; the weight rows' 16-byte loads (2 rows x 4
// lanes, 144-byte rows) are conflict-free as they are.
//
// Numerics (the op tests' model): per (row, sub-block) s = f16(d * sc) and n = f16(-(dmin * m)) (f32 products,
// rounded once); each weight w = f16(q * s + n) (one rounding: q is exact in f16, __hfma2); activations rounded to
// f16; products and sums in f32 (the MMA), the S partials summed in f32 in split order.
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/mmq_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace kiln::cuda {

// A 16-byte shared-memory load from a 32-bit shared-space address: the kernel keeps its operand addresses as such
// (base + a per-lane constant + an immediate), so no generic-to-shared conversion or 64-bit arithmetic is redone per
// load (which had cost more instructions per unit than its MMAs).
__device__ __forceinline__ uint4 mmf_lds128(uint32_t a) {
  uint4 v = make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
#endif
  return v;
}
__device__ __forceinline__ uint32_t mmf_saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mmf_cp16(uint32_t dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}

// Q4_K as it is in the file: 144 bytes per row and super-block (d, dmin, 12 bytes of scales, 128 bytes of nibbles).
// A format's interface to the kernel: kRowBytes of shared memory per row and super-block (the window copied: whole
// 16-byte chunks), window(sb) (the window's byte offset in the row) and block_off(sb) (the block's offset inside it),
// x_off(m) (where the super-block's natural activation chunk m, elements 8m..8m+7, goes among the four lane ranges:
// a byte offset in the super-block's 576 bytes of the activation chunk), Row / load / frag (a lane's share of one
// row and super-block, and fragment f's two f16x2 from it).
struct MmfQ4K {
  static constexpr DType kType = DType::Q4_K;
  static constexpr int kRowBytes = 144;                 // per row and super-block
  static constexpr int kUnitBytes = 16 * kRowBytes;     // a 16-row tile's super-block
  static __device__ __forceinline__ uint32_t window(int sb) { return static_cast<uint32_t>(sb) * 144; }
  static __device__ __forceinline__ uint32_t block_off(int) { return 0; }
  // lane range t = elements 64t..64t+63 in order
  static __device__ __forceinline__ int x_off(int m) { return (m / 8) * 144 + 16 * (m % 8); }
  // The lane range t and fragment f that hold the super-block's elements 4q..4q+3 (the wgmma activation layout)
  static __device__ __forceinline__ void quad_ft(int q, int* f, int* t) { *t = q >> 4, *f = q & 15; }
  // What a lane keeps of one super-block for one of its rows: its 32 qs bytes, the two sub-blocks' (s, n).
  struct Row {
    uint32_t q[8];
    __half2 s[2], n[2];
  };
  // row: the shared address of the row's super-block in the unit
  static __device__ __forceinline__ void load(uint32_t row, uint32_t, int t, Row* r) {
    const uint4 h = mmf_lds128(row);
    const uint4 a = mmf_lds128(row + 16 + 32 * t), b = mmf_lds128(row + 32 + 32 * t);
    r->q[0] = a.x, r->q[1] = a.y, r->q[2] = a.z, r->q[3] = a.w, r->q[4] = b.x, r->q[5] = b.y, r->q[6] = b.z,
    r->q[7] = b.w;
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(h.x)));
    const float dmin = __half2float(__ushort_as_half(static_cast<uint16_t>(h.x >> 16)));
    // sub-blocks 2t, 2t + 1 (kq_scale_min without its branch: lanes t < 2 take bytes 2t.. of words y / z, lanes
    // t >= 2 the 6-bit halves of w and the top bits of y / z at byte 2t - 4)
    const int sh = 16 * (t & 1);
    const uint32_t by = h.y >> sh, bz = h.z >> sh, bw = h.w >> sh;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t b0 = (by >> (8 * j)) & 0xFF, b1 = (bz >> (8 * j)) & 0xFF, b2 = (bw >> (8 * j)) & 0xFF;
      const uint32_t sc = t < 2 ? b0 & 63 : (b2 & 0xF) | ((b0 >> 6) << 4);
      const uint32_t mn = t < 2 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
      r->s[j] = __float2half2_rn(d * static_cast<float>(sc));
      r->n[j] = __float2half2_rn(-(dmin * static_cast<float>(mn)));
    }
  }
  // Fragment f's two f16x2 of this row: elements (4f, 4f+1) and (4f+2, 4f+3) of the lane's range.
  static __device__ __forceinline__ void frag(const Row& r, int f, uint32_t* lo, uint32_t* hi) {
    const uint32_t w = r.q[f & 7];
    const uint32_t nib = f < 8 ? w & 0x0F0F0F0Fu : (w >> 4) & 0x0F0F0F0Fu;
    const __half2 s = r.s[f >> 3], n = r.n[f >> 3];
    const __half2 k1024 = __half2half2(__ushort_as_half(0x6400));
    // byte_perm puts q into the mantissa of 1024 (0x64 high bytes): 1024 + q, exact; minus 1024: q, exact
    const uint32_t p0 = __byte_perm(nib, 0x64u, 0x4140u), p1 = __byte_perm(nib, 0x64u, 0x4342u);
    const __half2 q0 = __hsub2(*reinterpret_cast<const __half2*>(&p0), k1024);
    const __half2 q1 = __hsub2(*reinterpret_cast<const __half2*>(&p1), k1024);
    const __half2 w0 = __hfma2(q0, s, n), w1 = __hfma2(q1, s, n);
    *lo = *reinterpret_cast<const uint32_t*>(&w0);
    *hi = *reinterpret_cast<const uint32_t*>(&w1);
  }
};

// A 16-byte load at a 2-byte aligned shared address: the five aligned words that cover it, funnel-shifted.
__device__ __forceinline__ void mmf_lds16_u2(uint32_t a, uint32_t (&v)[4]) {
  const uint32_t a4 = a & ~3u, sh = (a & 3u) * 8;
  uint32_t w[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[i]) : "r"(a4 + 4 * i));
#else
    w[i] = 0;
#endif
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

// Q6_K as it is in the file: 210 bytes per row and super-block (ql[128] low nibbles, qh[64] high 2 bits, int8
// scales[16], f16 d), only 2-byte aligned past the first block: the unit copies each row's 14 aligned 16-byte chunks
// that cover the block (224 bytes; the block starts block_off bytes in). Lane t takes half h = t / 2 and l in
// [16 (t % 2), +16): elements 128 h + 32 k + l for k < 4 (ql bytes 64 h + l (+ 32 for odd k), nibble k / 2; qh byte
// 32 h + l, bits 2k; scale 8 h + 2k + t % 2). Fragment f = 4k + j holds l = 16 (t % 2) + 4j .. + 3 of group k.
// Numerics: s = f16(d * sc) (f32 product), w = f16((q - 32) * s) (one rounding).
struct MmfQ6K {
  static constexpr DType kType = DType::Q6_K;
  static constexpr int kRowBytes = 224;
  static constexpr int kUnitBytes = 16 * kRowBytes;
  static __device__ __forceinline__ uint32_t window(int sb) { return (static_cast<uint32_t>(sb) * 210) & ~15u; }
  static __device__ __forceinline__ uint32_t block_off(int sb) { return (static_cast<uint32_t>(sb) * 210) & 15u; }
  static __device__ __forceinline__ int x_off(int m) {
    const int h = m / 16, k = (m % 16) / 4, t = 2 * h + (m % 4) / 2;
    return t * 144 + 2 * (16 * k + 8 * (m % 2));
  }
  // elements 4q..4q+3: h = q / 32, k = (q % 32) / 8, l = 4 (q % 8): t = 2h + l / 16, f = 4k + (l % 16) / 4
  static __device__ __forceinline__ void quad_ft(int q, int* f, int* t) {
    *t = 2 * (q >> 5) + ((q & 7) >> 2), *f = 4 * ((q & 31) >> 3) + (q & 3);
  }
  struct Row {
    uint32_t a[4], b[4], c[4];  // ql at 64 h + l0, at 64 h + 32 + l0; qh at 32 h + l0 (l0 = 16 (t % 2))
    __half2 s[4];
  };
  static __device__ __forceinline__ void load(uint32_t row, uint32_t o, int t, Row* r) {
    const uint32_t base = row + o, h = static_cast<uint32_t>(t) >> 1, l0 = 16 * (static_cast<uint32_t>(t) & 1);
    mmf_lds16_u2(base + 64 * h + l0, r->a);
    mmf_lds16_u2(base + 64 * h + 32 + l0, r->b);
    mmf_lds16_u2(base + 128 + 32 * h + l0, r->c);
    uint32_t sc[4];
    mmf_lds16_u2(base + 192, sc);  // scales[16]
    uint32_t dw = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(dw) : "r"(base + 208));
#endif
    const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(dw)));
    // scale bytes 8 h + 2k + t % 2: words 2h (k < 2) and 2h + 1, byte 2 (k % 2) + t % 2
    const uint32_t w01 = h ? sc[2] : sc[0], w23 = h ? sc[3] : sc[1], sh = 8 * (static_cast<uint32_t>(t) & 1);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int v = static_cast<int8_t>(((k < 2 ? w01 : w23) >> (16 * (k % 2) + sh)) & 0xFF);
      r->s[k] = __float2half2_rn(d * static_cast<float>(v));
    }
  }
  static __device__ __forceinline__ void frag(const Row& r, int f, uint32_t* lo, uint32_t* hi) {
    const int k = f / 4, j = f % 4;
    const uint32_t src = (k % 2) ? r.b[j] : r.a[j];
    const uint32_t nib = (k / 2) ? (src >> 4) & 0x0F0F0F0Fu : src & 0x0F0F0F0Fu;
    const uint32_t q = nib | (((r.c[j] >> (2 * k)) & 0x03030303u) << 4);  // 0..63 per byte
    const __half2 k1056 = __half2half2(__ushort_as_half(0x6420));          // 1056 = 1024 + 32
    const uint32_t p0 = __byte_perm(q, 0x64u, 0x4140u), p1 = __byte_perm(q, 0x64u, 0x4342u);
    const __half2 q0 = __hsub2(*reinterpret_cast<const __half2*>(&p0), k1056);  // q - 32, exact
    const __half2 q1 = __hsub2(*reinterpret_cast<const __half2*>(&p1), k1056);
    const __half2 w0 = __hmul2(q0, r.s[k]), w1 = __hmul2(q1, r.s[k]);
    *lo = *reinterpret_cast<const uint32_t*>(&w0);
    *hi = *reinterpret_cast<const uint32_t*>(&w1);
  }
};

constexpr int kMmfMaxSeg = 3;  // launch.h MmfGroup
struct MmfArgs {
  MmfSeg seg[kMmfMaxSeg];
  int n_seg;
  int64_t n_tiles;  // over all segments
  const __half* x;  // [n_tok][x_stride] f16
  size_t x_stride;
  int64_t n_in, n_tok;
  int n_split;  // S (gridDim.y)
  int kc_max;   // super-blocks of the longest split (the activation chunk's width)
  int x_pitch;  // bytes per token row of the activation chunk (mmf_x_pitch)
  bool accumulate;
  float* part;    // S > 1: [token tiles][n_tiles][S][16 x BN]
  unsigned* sem;  // S > 1: [token tiles][n_tiles], zero between launches
};

// Bytes per token row of the activation chunk: kc super-blocks of 4 x (128 + 16) bytes, padded to 64 mod 128.
constexpr int mmf_x_pitch(int kc) { return kc * 576 + (kc % 2 == 0 ? 64 : 0); }
template <class F, int WARPS, int MT, int R>
constexpr int mmf_ring_bytes() { return WARPS * R * MT * F::kUnitBytes; }

// A launch geometry: warps per block, ring depth, 16-row tiles per warp (each activation fragment read from shared
// memory feeds mt MMAs), and wg: the product runs on wgmma (sm_90a, below) instead of mma.sync. mmf.cu's
// mmf_geo is the one table of them.
struct MmfGeo {
  int warps, ring, mt;
  bool wg;
};

// The wgmma kernel of a type, tile (NT) and geometry (sm90a/mmf_wgmma.cu), or null when the build has none.
const void* mmf_wg_kernel(DType t, int nt, int warps, int ring);

// ---- wgmma (sm_90a) -------------------------------------------------------------------------------------------------
// With wg, the 4 warps of a warpgroup take 4 consecutive tiles (64 rows) and multiply them together: one
// wgmma.m64nNk16 (N = BN tokens) per fragment, A = the four warps' dequantized fragments from registers (wgmma's
// register A fragment is mma.sync m16n8k16's, per warp), B = the activations read by the tensor cores from shared
// memory. wgmma is asynchronous: the next fragment is dequantized while this one multiplies (5-10% on the long
// products at 64 tokens on the H100: mmf.cu's ledger). A is double-buffered; a fragment's registers are rewritten
// only after wgmma.wait_group 1 saw its wgmma done.
// Activation layout (wgmma's K-major canonical layout without swizzle): per k-step ks (16 per super-block, 16 K
// columns each) NT blocks of 256 bytes (token group n8 = 8 tokens), each two 128-byte core matrices (K columns
// 0..7, 8..15: LBO 128, SBO 256), 8 token rows of 16 bytes. Column 2t + j (j < 2) of a core matrix kh holds
// element 4f + 2kh + j of lane range t, as the A fragments do (quad_ft), so a core matrix row gathers four 4-byte
// pairs, written by st.shared when the chunk is loaded (not cp.async: 16-byte copies would keep the file's order).
constexpr int mmf_wg_x_bytes(int kc, int nt) { return kc * 8 * nt * 512; }
__device__ __forceinline__ uint64_t mmf_wg_desc(uint32_t saddr) { return wg_desc(saddr, 128, 256); }

template <class F, int WARPS, int MT, int NT, int R, bool WG = false>
__global__ void __launch_bounds__(32 * WARPS, 1) mmf_kernel(const MmfArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (WG && !kWgHere) {  // compiled for another target than sm_90a: never launched there
    __trap();
    return;
  }
  constexpr int BN = 8 * NT, TM = 16 * MT, kUnit = MT * F::kUnitBytes;
  static_assert(R >= 3, "the ring keeps R - 1 units in flight and one being read");
  static_assert(!WG || (MT == 1 && WARPS % 4 == 0), "wgmma: whole warpgroups of one 16-row tile each");
  extern __shared__ __align__(16) uint8_t mmf_smem[];
  // warp through a shuffle: ptxas then knows it uniform across the warp, and so the wgmma loop's trip count
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = __shfl_sync(~0u, static_cast<int>(threadIdx.x) / 32, 0);
  const int g = lane >> 2, t = lane & 3;
  uint8_t* ring = mmf_smem + warp * R * kUnit;
  uint8_t* xs = mmf_smem + WARPS * R * kUnit;
  const int n_sb = static_cast<int>(a.n_in / 256), S = a.n_split, split = static_cast<int>(blockIdx.y);
  const int sb0 = split * n_sb / S, kc = (split + 1) * n_sb / S - sb0;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * BN;

  // The activation chunk: tokens t0.., elements [256 sb0, 256 (sb0 + kc)), 16-byte copies (8 halves); token rows
  // past n_tok read token 0's (valid memory; their outputs are never stored).
  if constexpr (WG) {  // wgmma's layout (above): each 16-byte read scatters as four 4-byte pairs
    const int per_tok = kc * 32;
    for (int i = static_cast<int>(threadIdx.x); i < BN * per_tok; i += 32 * WARPS) {
      const int n = i / per_tok, c = i % per_tok;
      const int64_t tok = t0 + n < a.n_tok ? t0 + n : 0;
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(a.x + tok * static_cast<int64_t>(a.x_stride) +
                                                            static_cast<int64_t>(sb0) * 256 + 8 * c));
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint8_t* row = xs + (n / 8) * 256 + (n % 8) * 16;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the chunk's quads 2m, 2m + 1 (m = c % 32)
        int f = 0, tt = 0;
        F::quad_ft(2 * (c % 32) + h, &f, &tt);
        uint8_t* dst = row + ((c / 32) * 16 + f) * (NT * 256) + 4 * tt;
        *reinterpret_cast<uint32_t*>(dst) = w[2 * h];
        *reinterpret_cast<uint32_t*>(dst + 128) = w[2 * h + 1];
      }
    }
    wg_proxy_fence();
  } else {
    const int per_tok = kc * 32;
    for (int i = static_cast<int>(threadIdx.x); i < BN * per_tok; i += 32 * WARPS) {
      const int n = i / per_tok, c = i % per_tok;
      const int64_t tok = t0 + n < a.n_tok ? t0 + n : 0;
      mmq_cp16(xs + n * a.x_pitch + (c / 32) * 576 + F::x_off(c % 32),
               a.x + tok * static_cast<int64_t>(a.x_stride) + static_cast<int64_t>(sb0) * 256 + 8 * c, true);
    }
    mmq_cp_commit();
  }

  // This warp's units: tiles wid, wid + stride, ... each kc super-blocks long; int cursors (a 64-bit division by
  // the runtime kc per unit cost more than the unit's dequantization). With wg a warpgroup takes groups of 4 tiles
  // (warp w of the group: tile 4 group + w), every warp of it as many units; a tile past the last is zero-filled
  // and never stored.
  const int n_tiles = static_cast<int>(a.n_tiles);
  constexpr int kTw = WG ? 4 : 1;  // tiles per work item
  const int n_items = (n_tiles + kTw - 1) / kTw;
  const int item0 = static_cast<int>(blockIdx.x) * (WARPS / kTw) + warp / kTw;
  const int istride = static_cast<int>(gridDim.x) * (WARPS / kTw);
  const int wid = kTw * item0 + warp % kTw, wstride = kTw * istride;
  const int n_my = item0 < n_items ? (n_items - 1 - item0) / istride + 1 : 0;
  const auto seg_of = [&](int tile) {
    int s = 0;
#pragma unroll
    for (int i = 1; i < kMmfMaxSeg; ++i)
      if (i < a.n_seg && tile >= a.seg[i].tile0) s = i;
    return s;
  };
  // A lane's copies of a unit: chunks c = lane + 32 i (16 bytes each, contiguous in the ring: rows of kRowBytes),
  // chunk c of row c / kPerRow at byte 16 (c % kPerRow) of the row's super-block. Their source offsets within a tile
  // are the same for every unit (every segment has one row pitch: launch_mmf), so they are computed once.
  constexpr int kPerRow = F::kRowBytes / 16, kChunks = TM * kPerRow, kCopies = (kChunks + 31) / 32;
  const size_t pitch = a.seg[0].row_bytes;
  uint32_t src_off[kCopies], part16[kCopies];
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int c = lane + 32 * i;
    part16[i] = 16 * (c % kPerRow);
    src_off[i] = static_cast<uint32_t>((c / kPerRow) * pitch) + part16[i];
  }
  const uint32_t dst0 = mmf_saddr(ring) + 16 * lane;
  int i_tile = 0, i_sb = 0, i_slot = 0;  // the next unit to issue
  const auto issue = [&]() {
    if (i_tile < n_my) {
      const int tile = wid + i_tile * wstride;
      const MmfSeg& sg = a.seg[seg_of(tile)];
      const int64_t r0 = static_cast<int64_t>(tile - static_cast<int>(sg.tile0)) * TM;
      const uint32_t win = F::window(sb0 + i_sb);
      const uint8_t* src = sg.w + static_cast<size_t>(r0) * pitch + win;
      const uint32_t dst = dst0 + i_slot * kUnit;
      const bool full = r0 + TM <= sg.n_out;  // else rows past the segment's end are zero-filled (never stored)
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int c = lane + 32 * i;
        if (kChunks % 32 == 0 || c < kChunks) {
          // a window's chunk past the row's end (Q6_K's last block) is zero-filled, never read
          const bool ok = (full || r0 + c / kPerRow < sg.n_out) && win + part16[i] < pitch;
          mmf_cp16(dst + 512 * i, ok ? src + src_off[i] : sg.w, ok);
        }
      }
      if (++i_sb == kc) i_sb = 0, ++i_tile;
      if (++i_slot == R) i_slot = 0;
    }
    mmq_cp_commit();
  };

#pragma unroll
  for (int u = 0; u < R - 1; ++u) issue();
  mmq_cp_wait_group<R - 2>();  // the activations and unit 0
  __syncthreads();

  uint32_t wa[2][4];  // wg: the A fragments, double-buffered
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
  uint32_t xb[NT];  // per token tile: this lane's B row (token 8 nt + g, lane range t) in the activation chunk
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xb[nt] = mmf_saddr(xs) + (8 * nt + g) * a.x_pitch + t * 144;
  const uint32_t ring_s = mmf_saddr(ring) + g * F::kRowBytes;  // this lane's row g of slot 0
  int c_tile = 0, c_slot = 0;  // the unit computed (its super-block: c_sb below)
  for (int it = 0; it < n_my; ++it) {
    // one tile: kc units; the wgmmas of a tile stay in flight across its units, the epilogue waits for them
    for (int c_sb = 0; c_sb < kc; ++c_sb) {
      if (it > 0 || c_sb > 0) {
        mmq_cp_wait_group<R - 2>();
        __syncwarp();  // every lane's copies of this unit landed; every lane is done with the last unit's slot
      }
      issue();
      const uint32_t unit = ring_s + c_slot * kUnit, o = F::block_off(sb0 + c_sb);
      if (++c_slot == R) c_slot = 0;
      typename F::Row ra[MT], rb[MT];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        F::load(unit + 16 * mt * F::kRowBytes, o, t, &ra[mt]);
        F::load(unit + (16 * mt + 8) * F::kRowBytes, o, t, &rb[mt]);
      }
      if constexpr (WG) {
        const uint64_t desc = mmf_wg_desc(mmf_saddr(xs) + c_sb * 16 * (NT * 256));
#pragma unroll
        for (int f = 0; f < 16; ++f) {
          uint32_t(&A)[4] = wa[f & 1];  // wgmma f - 2, its last reader, is done (wait_group 1 after f - 1)
          F::frag(ra[0], f, &A[0], &A[2]);
          F::frag(rb[0], f, &A[1], &A[3]);
          wg_fence();
          wg_mma<NT>(acc[0], A, desc + static_cast<uint64_t>((f * NT * 256) >> 4), f > 0 || c_sb > 0);
          wg_commit();
          wg_wait<1>();
        }
      }
      const uint32_t xo = c_sb * 576;
#pragma unroll
      for (int fp = 0; fp < (WG ? 0 : 8); ++fp) {
        uint4 bx[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) bx[nt] = mmf_lds128(xb[nt] + xo + 16 * fp);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t A[4];
            F::frag(ra[mt], 2 * fp + h, &A[0], &A[2]);
            F::frag(rb[mt], 2 * fp + h, &A[1], &A[3]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint32_t B[2] = {h ? bx[nt].z : bx[nt].x, h ? bx[nt].w : bx[nt].y};
              mma_f_k16<false>(acc[mt][nt], A, B);
            }
          }
      }
    }

    // The tile's K range is done: store (S = 1) or hand in the partial. The sums leave the accumulators first
    // (with wg: after wait_group 0, in code every lane runs, so no wgmma register is touched on a divergent path,
    // which would make ptxas serialize the wgmmas).
    if constexpr (WG) wg_wait<0>();
    float res[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          res[mt][nt][i] = WG ? wg_reg_copy(acc[mt][nt][i]) : acc[mt][nt][i];
          if constexpr (!WG) acc[mt][nt][i] = 0.0f;
        }
    const int tile = wid + c_tile++ * wstride;
    if (WG && tile >= n_tiles) continue;  // a warpgroup's padding tile (zero rows)
    const MmfSeg& sg = a.seg[seg_of(tile)];
    const int64_t r0 = static_cast<int64_t>(tile - static_cast<int>(sg.tile0)) * TM;
    bool last = S == 1;
    if (S > 1) {
      constexpr int kPart = TM * BN;  // floats per tile and split: MT x NT float4 per lane
      const size_t slot = static_cast<size_t>(blockIdx.z) * static_cast<size_t>(a.n_tiles) + static_cast<size_t>(tile);
      float4* mine = reinterpret_cast<float4*>(a.part + (slot * S + split) * kPart) + lane;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          __stcg(mine + (mt * NT + nt) * 32, make_float4(res[mt][nt][0], res[mt][nt][1], res[mt][nt][2], res[mt][nt][3]));
      __threadfence();
      __syncwarp();
      unsigned old = 0;
      if (lane == 0) old = atomicAdd(&a.sem[slot], 1u);
      old = __shfl_sync(0xffffffffu, old, 0);
      last = old == static_cast<unsigned>(S - 1);
      if (last) {
        __threadfence();
        const float4* all = reinterpret_cast<const float4*>(a.part + slot * S * kPart) + lane;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) res[mt][nt][0] = res[mt][nt][1] = res[mt][nt][2] = res[mt][nt][3] = 0.0f;
        for (int s = 0; s < S; ++s) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const float4 v = __ldcg(all + s * (kPart / 4) + (mt * NT + nt) * 32);
              res[mt][nt][0] += v.x, res[mt][nt][1] += v.y, res[mt][nt][2] += v.z, res[mt][nt][3] += v.w;
            }
        }
        if (lane == 0) a.sem[slot] = 0;
      }
    }
    if (last) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t row = r0 + 16 * mt + g + 8 * (i >> 1), tok = t0 + nt * 8 + 2 * t + (i & 1);
            if (row < sg.n_out && tok < a.n_tok) {
              float* y = sg.y + tok * static_cast<int64_t>(sg.y_stride) + row;
              *y = (a.accumulate ? *y : 0.0f) + res[mt][nt][i] + (sg.bias ? sg.bias[row] : 0.0f);
            }
          }
    }
  }
  mmq_cp_wait_group<0>();
#endif
}

}  // namespace kiln::cuda

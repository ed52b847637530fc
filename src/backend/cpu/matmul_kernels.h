// Internals of the CPU matmul shared by matmul.cpp (dispatch, threading), matmul_ref.cpp (the scalar spec),
// matmul_act.cpp (activation layout of the fast path) and the SIMD kernel files (matmul_avx2.cpp,
// matmul_avx512.cpp). Not a public API: backend code calls matmul.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "quant/dtype.h"

namespace kiln::cpu::detail {

// ---- reference path: activations in standard GGUF blocks (quant/reference.h quantize_row) ---------------------

// The activation type of a weight type: Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1, Q8_K for
// Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0 and the i-quant grid types, and the weight type itself for F32/F16/BF16.
DType act_type(DType wtype);
// Dot product of one weight row (n elements of wtype) with one activation row (n elements of act_type(wtype)),
// llama.cpp's scalar formula; see matmul_ref.cpp for the numerics of each type. nullptr for unsupported types.
using VecDotFn = float (*)(const void* w, const void* a, int64_t n);
VecDotFn ref_vec_dot(DType wtype);

// ---- fast path: activations in a SIMD-friendly structure-of-arrays layout ------------------------------------
//
// One activation row occupies ActLayout::row_bytes (a multiple of 64) at a 64-byte aligned address; inside it:
//   kFloat (F32/F16/BF16 weights): float x[n_pad] at 0: the activation rounded to the weight's type (f16 / bf16
//       round-to-nearest-even, exactly as util/fp16.h) and widened back to f32; zero past n_in.
//   kQ8Block32 (Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4 weights): int8 qs[n_pad] at 0 (the Q8_0 quants, or q + 128 as uint8 when
//       `bias128`), zero past n_in; float dexp[n_pad / 32][8] at d_off: each block's f16 scale (as f32) repeated
//       in 8 lanes (one per 4-element group of a vpdpbusd), zero past n_in.
//   kQ8K (Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0, IQ2_XXS..IQ1_M weights): int8 qs[n_pad] at 0; float d[n_in / 256] at d_off; int16
//       bsums[n_in / 16] at bsum_off.
// n_pad = n_in rounded up to 64. The quants and scales are byte-for-byte those of quantize_row(Q8_0 / Q8_K)
// (tests check this through act_row_to_blocks).
enum class ActKind { kFloat, kQ8Block32, kQ8K };

struct ActLayout {
  DType wtype = DType::F32;
  ActKind kind = ActKind::kFloat;
  int64_t n_in = 0, n_pad = 0;
  bool bias128 = false;
  size_t d_off = 0, bsum_off = 0, row_bytes = 0;
};

// The layout for weights of type wtype (F32, F16, BF16, Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4, Q2_K..Q6_K, IQ4_XS, TQ1_0,
// TQ2_0); bias128 only matters for kQ8Block32.
ActLayout act_layout(DType wtype, int64_t n_in, bool bias128);
// Quantizes/rounds x[0..n_in) into one row of the layout (scalar; through quant/reference.h, so exact by
// construction).
void quantize_act_row_scalar(const ActLayout& l, const float* x, uint8_t* row);
// The same bytes, with AVX-512 (matmul_act_avx512.cpp; only call where the CPU has it).
void quantize_act_row_avx512(const ActLayout& l, const float* x, uint8_t* row);
// Rebuilds the standard blocks (block_q8_0 / block_q8_K rows, or f16/bf16/f32 elements) from a layout row, for tests.
void act_row_to_blocks(const ActLayout& l, const uint8_t* row, void* blocks);

// What a SIMD gemm needs: weights, quantized activations and the output.
struct GemmJob {
  DType wtype;
  const uint8_t* w;      // row o at w + o * w_row_bytes
  size_t w_row_bytes;
  int64_t n_in;
  const uint8_t* act;    // row t at act + t * layout.row_bytes
  ActLayout layout;
  int64_t n_tok;
  float* y;              // Y[t][o] at y[t * y_stride + o]
  size_t y_stride;
};

// A kernel's operands over Q8_K activations: the R weight rows from o, and the C activation rows from t with their
// scale d and block sums (at ActLayout's offsets).
template <int R, int C>
struct Q8KTile {
  const uint8_t* w[R];
  const uint8_t* xq[C];
  const float* xd[C];
  const int16_t* xs[C];
  Q8KTile(const GemmJob& j, int64_t o, int64_t t) {
    for (int r = 0; r < R; ++r) w[r] = j.w + (o + r) * j.w_row_bytes;
    for (int c = 0; c < C; ++c) {
      xq[c] = j.act + (t + c) * j.layout.row_bytes;
      xd[c] = reinterpret_cast<const float*>(xq[c] + j.layout.d_off);
      xs[c] = reinterpret_cast<const int16_t*>(xq[c] + j.layout.bsum_off);
    }
  }
};

struct FastKernels {
  const char* name;
  bool bias128;                                    // the kQ8Block32 layout these kernels expect
  bool (*has)(DType wtype);                        // weight types with a SIMD gemm
  void (*quantize)(const ActLayout& l, const float* x, uint8_t* row);  // same bytes as quantize_act_row_scalar
  void (*gemm)(const GemmJob& j, int64_t o0, int64_t o1);  // Y[0..n_tok)[o0..o1)
};

const FastKernels* fast_kernels_avx2();    // nullptr when not compiled in
// The i-quant grid types' 256-bit kernels (matmul_iq_kern.h) of the AVX2 set (matmul_iq_avx2.cpp) and the AVX-512
// set (matmul_iq_avx512.cpp: mask-register signs); j.wtype one of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M (only call where the CPU has the set's instructions). Both give the same results bit for bit.
void gemm_iq_grid_avx2(const GemmJob& j, int64_t o0, int64_t o1);
void gemm_iq_grid_avx512(const GemmJob& j, int64_t o0, int64_t o1);
const FastKernels* fast_kernels_avx512();
// The kernels matmul uses at `level` (nullptr for scalar).
const FastKernels* fast_kernels_at(SimdLevel level);

// matmul as it runs at SIMD level min(level, what this CPU has) (tests and benchmarks compare the levels).
Status matmul_at_level(const MatmulArgs& a, ThreadPool& pool, SimdLevel level);
Status matmul_group_at_level(const MatmulArgs* a, int n, ThreadPool& pool, SimdLevel level);

// Tile driver shared by the SIMD files. Kern::run<R, C>(job, o, t) computes the R x C outputs for weight rows
// o..o+R and activation rows t..t+C over the whole n_in. Loop order (reasons in matmul.cpp's header comment):
//   for each block of weight rows (~kWeightBlockBytes, stays in L2)
//     for each tile of C activation rows (stays in L1 while the block's weight rows stream past it)
//       for each tile of R weight rows: Kern::run<R, C>
inline constexpr size_t kWeightBlockBytes = 256 * 1024;

// Software prefetch distance for the weight stream: the kernels touch the weight bytes kPrefetchBytes ahead of the
// block they decode (into the next rows; past the matrix end it is a harmless hint). The hardware prefetcher alone
// falls behind once a row's decode takes long against its DRAM time (several tokens, or n_in 8192 rows): then
// the DRAM time and the integer math add up instead of overlapping. Measured (tools/bench_matmul --gemv-tok,
// 1 thread, Zen 5 EPYC, weights from DRAM), us per product, distance 0 -> 8192 bytes:
//   Q4_K 2048x8192: 1 token 367 -> 270, 4 tokens 1095 -> 479, 16 tokens 2462 -> 1818
//   Q6_K 2048x8192: 1 token 448 -> 305, 4 tokens 1516 -> 496; 8192x2048 4 tokens 533 -> 471
// (4096: 10-25% less gain at 4 tokens; 16384 and 32768: the same as 8192; into L2 only, locality 1: no better).
// A build with -DKILN_CPU_PREFETCH_BYTES=0 has none (the A/B baseline).
#ifndef KILN_CPU_PREFETCH_BYTES
#define KILN_CPU_PREFETCH_BYTES 8192
#endif
inline constexpr int kPrefetchBytes = KILN_CPU_PREFETCH_BYTES;

// Prefetches the `lines` cache lines from p + kPrefetchBytes into L1.
inline void prefetch_weights(const uint8_t* p, int lines) {
  if constexpr (kPrefetchBytes > 0)
    for (int i = 0; i < lines; ++i) __builtin_prefetch(p + kPrefetchBytes + 64 * i, 0, 3);
}

template <int R, int C, class Kern>
inline void run_tile(const GemmJob& j, int64_t o, int64_t t, int r, int c) {
  if constexpr (R > 1) {
    if (r < R) return run_tile<R - 1, C, Kern>(j, o, t, r, c);
  }
  if constexpr (C > 1) {
    if (c < C) return run_tile<R, C - 1, Kern>(j, o, t, r, c);
  }
  Kern::template run<R, C>(j, o, t);
}

template <int RMAX, int CMAX, class Kern>
inline void drive_tiles(const GemmJob& j, int64_t o0, int64_t o1) {
  int64_t ob = static_cast<int64_t>(kWeightBlockBytes / (j.w_row_bytes ? j.w_row_bytes : 1));
  ob = ob < RMAX ? RMAX : ob - ob % RMAX;
  for (int64_t b0 = o0; b0 < o1; b0 += ob) {
    const int64_t b1 = b0 + ob < o1 ? b0 + ob : o1;
    for (int64_t t = 0; t < j.n_tok; t += CMAX) {
      const int c = static_cast<int>(j.n_tok - t < CMAX ? j.n_tok - t : CMAX);
      for (int64_t o = b0; o < b1; o += RMAX) {
        const int r = static_cast<int>(b1 - o < RMAX ? b1 - o : RMAX);
        run_tile<RMAX, CMAX, Kern>(j, o, t, r, c);
      }
    }
  }
}

}  // namespace kiln::cpu::detail

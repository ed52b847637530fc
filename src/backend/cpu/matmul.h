// CPU matrix multiplication against weights in their GGUF block layout:  Y[t][o] = sum_i W[o][i] * X[t][i].
//
//   W: n_out rows of n_in elements of type `wtype`, row r at w + r * w_row_bytes (GGUF layout, ne[0] = n_in)
//   X: n_tok rows of n_in f32, row t at x + t * x_stride (floats)
//   Y: n_tok rows of n_out f32, row t at y + t * y_stride (floats)
//
// Numerics (as llama.cpp's CPU backend, so logits agree with it): the activations X are first converted, row by
// row, to the weight type's "activation type": Q8_0 blocks for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, Q8_1 for Q4_1/Q5_1,
// Q8_K for Q2_K..Q6_K, IQ4_XS, TQ1_0, TQ2_0 and the i-quant grid types (IQ2_XXS..IQ1_M), F16 for F16 weights, BF16 for BF16 weights, F32 for F32. The dot products then
// run in integers per block (exact) and are scaled/accumulated in f32. matmul_ref is the scalar executable spec of exactly this;
// matmul (threaded, SIMD picked at run time) must agree with it up to f32 summation order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "quant/dtype.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace kiln::cpu {

struct MatmulArgs {
  DType wtype = DType::F32;
  const void* w = nullptr;
  size_t w_row_bytes = 0;
  int64_t n_out = 0;
  int64_t n_in = 0;
  const float* x = nullptr;
  size_t x_stride = 0;  // in floats
  int64_t n_tok = 0;
  float* y = nullptr;
  size_t y_stride = 0;  // in floats
};

// Weight types matmul accepts: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
// IQ4_XS, MXFP4, TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.
bool matmul_supports(DType wtype);
// Checks shapes/strides/type; the error names the field at fault.
Status matmul_check(const MatmulArgs& a);

// Threaded over `pool` (thread 0 is the caller), SIMD variant chosen from the CPU's features at first use.
Status matmul(const MatmulArgs& a, ThreadPool& pool);
// Products a[0..n) in one parallel region (one fork-join; an input shared by several products, same x rows in the
// same activation layout, is quantized once): the q/k/v projections of one normed input, gate/up. The same results,
// bit for bit, as matmul on each. Outputs must not overlap each other or any input.
Status matmul_group(const MatmulArgs* a, int n, ThreadPool& pool);
// Single-threaded scalar reference (same activation quantization, plain loops).
Status matmul_ref(const MatmulArgs& a);

// Which SIMD level matmul dispatches to on this machine: "avx512", "avx2" or "scalar". KILN_CPU_SIMD=scalar|avx2
// in the environment caps it (for tests and A/B measurements).
const char* simd_level();

}  // namespace kiln::cpu

// Scalar reference (de)quantization: the executable spec of every block format. Fast paths (backend/cpu) and
// GPU kernels are tested against these.
#pragma once

#include <cstdint>

#include "quant/blocks.h"
#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

// True when dequantize_row handles `t` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K,
// IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, and the i-quant grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M).
bool can_dequantize(DType t);
// True when quantize_row handles `t`: every type dequantize_row handles except the i-quant grid types (their
// quantizers need an importance matrix and a grid search; kiln loads such files, llama-quantize writes them). The
// method of each is documented at its quantizer.
bool can_quantize(DType t);
// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: decoded, never written by kiln.
bool is_iquant_grid(DType t);

// dst[0..n) = value of the n elements at src. n must be a multiple of the block size.
Status dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes src[0..n) into blocks of type t at dst (row bytes = dtype_row_bytes(t, n)).
Status quantize_row(DType t, const float* src, void* dst, int64_t n);

// ---- typed entry points (no checks: n must be a multiple of the type's block size, pointers valid) ----------
// Activation quantizers, bit-exact with llama.cpp's scalar reference quantizers (quantize_row_q8_{0,1,K}_ref)
// for every input whose llama.cpp encoding is finite (see quantize_q8.cpp for the overflow corner cases).
void quantize_row_q8_0(const float* x, block_q8_0* y, int64_t n);
void quantize_row_q8_1(const float* x, block_q8_1* y, int64_t n);
void quantize_row_q8_K(const float* x, block_q8_K* y, int64_t n);

// Dequantizers: the same values as ggml's dequantize_row_* (same float operations in the same order).
void dequantize_row_f16(const uint16_t* x, float* y, int64_t n);
void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n);
void dequantize_row_q4_0(const block_q4_0* x, float* y, int64_t n);
void dequantize_row_q4_1(const block_q4_1* x, float* y, int64_t n);
void dequantize_row_q5_0(const block_q5_0* x, float* y, int64_t n);
void dequantize_row_q5_1(const block_q5_1* x, float* y, int64_t n);
void dequantize_row_q8_0(const block_q8_0* x, float* y, int64_t n);
void dequantize_row_q8_1(const block_q8_1* x, float* y, int64_t n);
void dequantize_row_q2_K(const block_q2_K* x, float* y, int64_t n);
void dequantize_row_q3_K(const block_q3_K* x, float* y, int64_t n);
void dequantize_row_q4_K(const block_q4_K* x, float* y, int64_t n);
void dequantize_row_q5_K(const block_q5_K* x, float* y, int64_t n);
void dequantize_row_q6_K(const block_q6_K* x, float* y, int64_t n);
void dequantize_row_q8_K(const block_q8_K* x, float* y, int64_t n);
void dequantize_row_iq4_nl(const block_iq4_nl* x, float* y, int64_t n);
void dequantize_row_iq4_xs(const block_iq4_xs* x, float* y, int64_t n);
void dequantize_row_mxfp4(const block_mxfp4* x, float* y, int64_t n);
void dequantize_row_tq1_0(const block_tq1_0* x, float* y, int64_t n);
void dequantize_row_tq2_0(const block_tq2_0* x, float* y, int64_t n);
void dequantize_row_iq2_xxs(const block_iq2_xxs* x, float* y, int64_t n);  // dequant_iquants.cpp
void dequantize_row_iq2_xs(const block_iq2_xs* x, float* y, int64_t n);
void dequantize_row_iq2_s(const block_iq2_s* x, float* y, int64_t n);
void dequantize_row_iq3_xxs(const block_iq3_xxs* x, float* y, int64_t n);
void dequantize_row_iq3_s(const block_iq3_s* x, float* y, int64_t n);
void dequantize_row_iq1_s(const block_iq1_s* x, float* y, int64_t n);
void dequantize_row_iq1_m(const block_iq1_m* x, float* y, int64_t n);

// Weight quantizers (methods documented at each definition; k-quants and IQ4_NL/IQ4_XS need not match llama.cpp's
// bytes).
void quantize_row_f16(const float* x, uint16_t* y, int64_t n);
void quantize_row_bf16(const float* x, uint16_t* y, int64_t n);
void quantize_row_q4_0(const float* x, block_q4_0* y, int64_t n);
void quantize_row_q4_1(const float* x, block_q4_1* y, int64_t n);
void quantize_row_q5_0(const float* x, block_q5_0* y, int64_t n);
void quantize_row_q5_1(const float* x, block_q5_1* y, int64_t n);
void quantize_row_q2_K(const float* x, block_q2_K* y, int64_t n);
void quantize_row_q3_K(const float* x, block_q3_K* y, int64_t n);
void quantize_row_q4_K(const float* x, block_q4_K* y, int64_t n);
void quantize_row_q5_K(const float* x, block_q5_K* y, int64_t n);
void quantize_row_q6_K(const float* x, block_q6_K* y, int64_t n);
void quantize_row_iq4_nl(const float* x, block_iq4_nl* y, int64_t n);
void quantize_row_iq4_xs(const float* x, block_iq4_xs* y, int64_t n);
void quantize_row_mxfp4(const float* x, block_mxfp4* y, int64_t n);  // llama.cpp's bytes (quantize_nonlinear.cpp)
void quantize_row_tq1_0(const float* x, block_tq1_0* y, int64_t n);  // llama.cpp's bytes (quantize_ternary.cpp)
void quantize_row_tq2_0(const float* x, block_tq2_0* y, int64_t n);

}  // namespace kiln

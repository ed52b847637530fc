// Scalar reference (de)quantization: the executable spec of every block format. Fast paths (backend/cpu) and
// GPU kernels are tested against these.
#pragma once

#include <cstdint>

#include "quant/dtype.h"
#include "util/status.h"

namespace kiln {

// True when dequantize_row handles `t` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K).
bool can_dequantize(DType t);
// True when quantize_row handles `t` (F32, F16, BF16, Q8_0, Q8_1, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q8_K
// at least; see reference.cpp for the method of each).
bool can_quantize(DType t);

// dst[0..n) = value of the n elements at src. n must be a multiple of the block size.
Status dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes src[0..n) into blocks of type t at dst (row bytes = dtype_row_bytes(t, n)).
Status quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace kiln

// Dispatch of the scalar reference (de)quantizers by DType, with the argument checks the typed entry points skip.
// The per-format code lives in dequant_legacy.cpp, dequant_kquants.cpp, dequant_nonlinear.cpp, dequant_ternary.cpp, dequant_iquants.cpp,
// quantize_q8.cpp, quantize_legacy.cpp, quantize_kquants.cpp, quantize_nonlinear.cpp and quantize_ternary.cpp; plain
// float formats are here.
#include "quant/reference.h"

#include <cstring>

#include "util/fp16.h"

namespace kiln {

// F16 / BF16 <-> F32: exact widening; narrowing rounds to nearest even (util/fp16.h, bit-exact with ggml).
void dequantize_row_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_f32(x[i]);
}
void dequantize_row_bf16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}
void quantize_row_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_fp16(x[i]);
}
void quantize_row_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

bool can_dequantize(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16:
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0: case DType::Q8_1:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::Q8_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: case DType::TQ1_0: case DType::TQ2_0:
      return true;
    default:
      return is_iquant_grid(t);
  }
}

bool is_iquant_grid(DType t) {
  switch (t) {
    case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S:
    case DType::IQ1_S: case DType::IQ1_M:
      return true;
    default:
      return false;
  }
}

bool can_quantize(DType t) { return can_dequantize(t) && !is_iquant_grid(t); }

namespace {

Status check_args(const char* what, DType t, const void* a, const void* b, int64_t n) {
  if (!dtype_is_valid(static_cast<uint32_t>(t)))
    return make_error(ErrorCode::kInvalidArgument, "%s: unknown type id %u", what, static_cast<unsigned>(t));
  const int64_t bs = dtype_block_size(t);
  if (n < 0 || n % bs != 0)
    return make_error(ErrorCode::kInvalidArgument, "%s: row of %lld elements is not a multiple of %s's block size %lld",
                      what, static_cast<long long>(n), dtype_name(t), static_cast<long long>(bs));
  if (n > 0 && (a == nullptr || b == nullptr))
    return make_error(ErrorCode::kInvalidArgument, "%s: null buffer for a row of %lld %s elements", what,
                      static_cast<long long>(n), dtype_name(t));
  return Status::ok();
}

}  // namespace

Status dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  KILN_TRY(check_args("dequantize_row", t, src, dst, n));
  switch (t) {
    case DType::F32: if (n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::F16: dequantize_row_f16(static_cast<const uint16_t*>(src), dst, n); break;
    case DType::BF16: dequantize_row_bf16(static_cast<const uint16_t*>(src), dst, n); break;
    case DType::Q4_0: dequantize_row_q4_0(static_cast<const block_q4_0*>(src), dst, n); break;
    case DType::Q4_1: dequantize_row_q4_1(static_cast<const block_q4_1*>(src), dst, n); break;
    case DType::Q5_0: dequantize_row_q5_0(static_cast<const block_q5_0*>(src), dst, n); break;
    case DType::Q5_1: dequantize_row_q5_1(static_cast<const block_q5_1*>(src), dst, n); break;
    case DType::Q8_0: dequantize_row_q8_0(static_cast<const block_q8_0*>(src), dst, n); break;
    case DType::Q8_1: dequantize_row_q8_1(static_cast<const block_q8_1*>(src), dst, n); break;
    case DType::Q2_K: dequantize_row_q2_K(static_cast<const block_q2_K*>(src), dst, n); break;
    case DType::Q3_K: dequantize_row_q3_K(static_cast<const block_q3_K*>(src), dst, n); break;
    case DType::Q4_K: dequantize_row_q4_K(static_cast<const block_q4_K*>(src), dst, n); break;
    case DType::Q5_K: dequantize_row_q5_K(static_cast<const block_q5_K*>(src), dst, n); break;
    case DType::Q6_K: dequantize_row_q6_K(static_cast<const block_q6_K*>(src), dst, n); break;
    case DType::Q8_K: dequantize_row_q8_K(static_cast<const block_q8_K*>(src), dst, n); break;
    case DType::IQ4_NL: dequantize_row_iq4_nl(static_cast<const block_iq4_nl*>(src), dst, n); break;
    case DType::IQ4_XS: dequantize_row_iq4_xs(static_cast<const block_iq4_xs*>(src), dst, n); break;
    case DType::MXFP4: dequantize_row_mxfp4(static_cast<const block_mxfp4*>(src), dst, n); break;
    case DType::TQ1_0: dequantize_row_tq1_0(static_cast<const block_tq1_0*>(src), dst, n); break;
    case DType::TQ2_0: dequantize_row_tq2_0(static_cast<const block_tq2_0*>(src), dst, n); break;
    case DType::IQ2_XXS: dequantize_row_iq2_xxs(static_cast<const block_iq2_xxs*>(src), dst, n); break;
    case DType::IQ2_XS: dequantize_row_iq2_xs(static_cast<const block_iq2_xs*>(src), dst, n); break;
    case DType::IQ2_S: dequantize_row_iq2_s(static_cast<const block_iq2_s*>(src), dst, n); break;
    case DType::IQ3_XXS: dequantize_row_iq3_xxs(static_cast<const block_iq3_xxs*>(src), dst, n); break;
    case DType::IQ3_S: dequantize_row_iq3_s(static_cast<const block_iq3_s*>(src), dst, n); break;
    case DType::IQ1_S: dequantize_row_iq1_s(static_cast<const block_iq1_s*>(src), dst, n); break;
    case DType::IQ1_M: dequantize_row_iq1_m(static_cast<const block_iq1_m*>(src), dst, n); break;
    default:
      return make_error(ErrorCode::kUnsupported, "dequantize_row: no reference dequantization for type %s",
                        dtype_name(t));
  }
  return Status::ok();
}

Status quantize_row(DType t, const float* src, void* dst, int64_t n) {
  KILN_TRY(check_args("quantize_row", t, src, dst, n));
  switch (t) {
    case DType::F32: if (n > 0) std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
    case DType::F16: quantize_row_f16(src, static_cast<uint16_t*>(dst), n); break;
    case DType::BF16: quantize_row_bf16(src, static_cast<uint16_t*>(dst), n); break;
    case DType::Q4_0: quantize_row_q4_0(src, static_cast<block_q4_0*>(dst), n); break;
    case DType::Q4_1: quantize_row_q4_1(src, static_cast<block_q4_1*>(dst), n); break;
    case DType::Q5_0: quantize_row_q5_0(src, static_cast<block_q5_0*>(dst), n); break;
    case DType::Q5_1: quantize_row_q5_1(src, static_cast<block_q5_1*>(dst), n); break;
    case DType::Q8_0: quantize_row_q8_0(src, static_cast<block_q8_0*>(dst), n); break;
    case DType::Q8_1: quantize_row_q8_1(src, static_cast<block_q8_1*>(dst), n); break;
    case DType::Q2_K: quantize_row_q2_K(src, static_cast<block_q2_K*>(dst), n); break;
    case DType::Q3_K: quantize_row_q3_K(src, static_cast<block_q3_K*>(dst), n); break;
    case DType::Q4_K: quantize_row_q4_K(src, static_cast<block_q4_K*>(dst), n); break;
    case DType::Q5_K: quantize_row_q5_K(src, static_cast<block_q5_K*>(dst), n); break;
    case DType::Q6_K: quantize_row_q6_K(src, static_cast<block_q6_K*>(dst), n); break;
    case DType::Q8_K: quantize_row_q8_K(src, static_cast<block_q8_K*>(dst), n); break;
    case DType::IQ4_NL: quantize_row_iq4_nl(src, static_cast<block_iq4_nl*>(dst), n); break;
    case DType::IQ4_XS: quantize_row_iq4_xs(src, static_cast<block_iq4_xs*>(dst), n); break;
    case DType::MXFP4: quantize_row_mxfp4(src, static_cast<block_mxfp4*>(dst), n); break;
    case DType::TQ1_0: quantize_row_tq1_0(src, static_cast<block_tq1_0*>(dst), n); break;
    case DType::TQ2_0: quantize_row_tq2_0(src, static_cast<block_tq2_0*>(dst), n); break;
    default:
      if (is_iquant_grid(t))
        return make_error(ErrorCode::kUnsupported,
                          "quantize_row: kiln does not quantize to %s (an i-quant grid type: it needs an importance "
                          "matrix; make such files with llama-quantize)", dtype_name(t));
      return make_error(ErrorCode::kUnsupported, "quantize_row: no reference quantization for type %s",
                        dtype_name(t));
  }
  return Status::ok();
}

}  // namespace kiln

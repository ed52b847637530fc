// Tensor element types, numbered as GGUF/ggml numbers them (ggml_type). The numbering is a file format: never
// renumber. Every id a GGUF file may carry has a traits row (so `kiln info` and the reader can size any tensor);
// `has_reference` says whether kiln can dequantize it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "util/status.h"

namespace kiln {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4, 5: removed Q4_2, Q4_3
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  // 31-33: removed Q4_0_4_4, Q4_0_4_8, Q4_0_8_8
  TQ1_0 = 34,
  TQ2_0 = 35,
  // 36-38: removed IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8
  MXFP4 = 39,
};

inline constexpr uint32_t kDTypeIdLimit = 40;  // ids >= this are unknown

struct DTypeTraits {
  const char* name;    // ggml's name: "f32", "q4_K", ...
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t type_size;   // bytes per block
  bool is_quantized;
  bool has_reference;  // kiln has a scalar reference dequantization for it
};

// nullptr for ids that are not (or no longer) types.
const DTypeTraits* dtype_traits(uint32_t id);
const DTypeTraits& dtype_traits(DType t);  // t must be valid
bool dtype_is_valid(uint32_t id);
inline const char* dtype_name(DType t) { return dtype_traits(t).name; }
inline int64_t dtype_block_size(DType t) { return dtype_traits(t).block_size; }
inline int64_t dtype_type_size(DType t) { return dtype_traits(t).type_size; }
// Case-insensitive lookup by ggml name ("q4_k", "Q4_K", "bf16").
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of one row of n elements; error if n is not a multiple of the block size or overflows.
Result<uint64_t> dtype_row_bytes(DType t, int64_t n);

}  // namespace kiln

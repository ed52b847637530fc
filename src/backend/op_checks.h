// Operand checks shared by every backend's op entries (shapes and dtypes only: values are the planner's, see
// backend.h). Each error names the op and the operand.
#pragma once

#include <cstdint>

#include "backend/tensor.h"
#include "util/status.h"

namespace kiln::op_checks {

// `t` (named `name` in op `op`) is set, of type `want`, with rows of ne[0] contiguous elements and one row stride
// that is a whole number of elements.
inline Status check(const char* op, const char* name, const Tensor& t, DType want) {
  if (!t.valid()) return make_error(ErrorCode::kInvalidArgument, "%s: %s is not set", op, name);
  if (t.dtype != want)
    return make_error(ErrorCode::kUnsupported, "%s: %s must be %s, got %s", op, name, dtype_name(want),
                      dtype_name(t.dtype));
  if (!t.rows_uniform())
    return make_error(ErrorCode::kUnsupported, "%s: %s %s must have contiguous rows with one row stride", op, name,
                      t.shape_string().c_str());
  if (t.nb[1] % static_cast<size_t>(dtype_type_size(want)) != 0)
    return make_error(ErrorCode::kUnsupported, "%s: %s row stride %zu is not a multiple of its element size", op,
                      name, t.nb[1]);
  return Status::ok();
}

// a and b hold the same rows of the same width.
inline Status same_shape(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.ne[0] != b.ne[0] || a.n_rows() != b.n_rows())
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s and %s %s differ in shape", op, an,
                      a.shape_string().c_str(), bn, b.shape_string().c_str());
  return Status::ok();
}

// An I32 index vector of n entries.
inline Status check_ids(const char* op, const char* name, const Tensor& ids, int64_t n) {
  KILN_TRY(check(op, name, ids, DType::I32));
  if (ids.ne[0] != n || ids.n_rows() != 1)
    return make_error(ErrorCode::kInvalidArgument, "%s: %s %s must be [%lld]", op, name, ids.shape_string().c_str(),
                      static_cast<long long>(n));
  return Status::ok();
}

inline bool is_float_type(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
// KV cache storage types every backend's kv_store/attention may accept.
inline bool is_cache_type(DType t) { return t == DType::F16 || t == DType::F32 || t == DType::Q8_0; }

}  // namespace kiln::op_checks

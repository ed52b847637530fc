// Tensors are views: a dtype, a shape, byte strides and an address in some backend's memory (docs/ARCHITECTURE.md, "Backends").
//
//   ne[0] is the innermost (contiguous) dimension, as in ggml/GGUF: a weight [n_out, n_in] in GGUF terms has
//   ne = {n_in, n_out, 1, 1}; an activation matrix of n_tok rows of width d has ne = {d, n_tok, 1, 1}.
//   nb[i] is the byte stride of dimension i; for block-quantized types nb[0] is the block's byte size and rows are
//   whole blocks (ne[0] % block_size == 0), so nb[1] = row bytes.
//
// `data` is an address in the memory of `backend` (host memory for the CPU backend, device memory for CUDA). Code
// above the backend never dereferences it: it moves bytes with Backend::write/read and hands views to ops. A
// Buffer owns memory obtained from Backend::alloc; tensors made from it are views and do not own anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "quant/dtype.h"

namespace kiln {

class Backend;

// Memory owned by a backend (host allocation, device allocation, ...). Released by the destructor.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }
  Backend* backend() const { return backend_; }

 protected:
  Buffer(Backend* backend, void* data, size_t size) : data_(data), size_(size), backend_(backend) {}
  void* data_;
  size_t size_;
  Backend* backend_;
};

struct Tensor {
  DType dtype = DType::F32;
  int64_t ne[4] = {0, 1, 1, 1};
  size_t nb[4] = {0, 0, 0, 0};
  void* data = nullptr;
  Backend* backend = nullptr;

  // Contiguous tensor of shape {ne0, ne1, ne2, ne3} at `data` (ne0 a multiple of the type's block size).
  static Tensor make(DType t, void* data, Backend* be, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                     int64_t ne3 = 1) {
    Tensor x;
    x.dtype = t;
    x.data = data;
    x.backend = be;
    x.ne[0] = ne0, x.ne[1] = ne1, x.ne[2] = ne2, x.ne[3] = ne3;
    x.nb[0] = static_cast<size_t>(dtype_type_size(t));
    x.nb[1] = static_cast<size_t>(ne0 / dtype_block_size(t)) * x.nb[0];
    x.nb[2] = x.nb[1] * static_cast<size_t>(ne1);
    x.nb[3] = x.nb[2] * static_cast<size_t>(ne2);
    return x;
  }

  bool valid() const { return data != nullptr; }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // Rows of ne[0] elements (all outer dimensions flattened).
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return static_cast<size_t>(ne[0] / dtype_block_size(dtype)) * nb[0]; }
  size_t n_bytes() const { return row_bytes() * static_cast<size_t>(n_rows()); }
  // Rows are packed one after another (nb[1] = row bytes, nb[2] = ne[1] * nb[1], ...).
  bool is_contiguous() const {
    return nb[0] == static_cast<size_t>(dtype_type_size(dtype)) && nb[1] == row_bytes() &&
           nb[2] == nb[1] * static_cast<size_t>(ne[1]) && nb[3] == nb[2] * static_cast<size_t>(ne[2]);
  }
  // ne[0] contiguous and the outer dimensions collapse to one row stride (rows may be padded).
  bool rows_uniform() const {
    return nb[0] == static_cast<size_t>(dtype_type_size(dtype)) && nb[1] >= row_bytes() &&
           (ne[2] == 1 || nb[2] == nb[1] * static_cast<size_t>(ne[1])) &&
           (ne[3] == 1 || nb[3] == nb[2] * static_cast<size_t>(ne[2]));
  }

  // Rows [begin, begin + n) of a 2-D view (ne[2] = ne[3] = 1).
  Tensor rows(int64_t begin, int64_t n) const {
    Tensor r = *this;
    r.data = static_cast<char*>(data) + static_cast<size_t>(begin) * nb[1];
    r.ne[1] = n;
    r.nb[2] = r.nb[1] * static_cast<size_t>(n);
    r.nb[3] = r.nb[2];
    return r;
  }
  // The same bytes seen as {ne0, ne1, ne2, ne3} (must hold the same element count; contiguous input).
  Tensor reshape(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1) const {
    return make(dtype, data, backend, ne0, ne1, ne2, ne3);
  }

  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < 4; ++i) {
      if (i) s += ", ";
      s += std::to_string(ne[i]);
    }
    return s + "]";
  }
};

}  // namespace kiln

// Shared helpers of the backend op tests (tests/unit/test_backend_ops*.cpp):
//   - the backends under test: every device id the registry lists (list_devices(): "cpu", and "cuda:N" in a CUDA
//     build on a GPU machine), the CPU scalar reference ("cpu-ref" = create_backend("cpu", {1, true})), and for a
//     factory of this build that lists no device (a CUDA build without a GPU) "<kind>:0" anyway, so its cases are
//     reported as skipped (with the reason) instead of not at all;
//   - device tensors that are only ever touched through Backend::alloc / write / read (never dereferenced on the
//     host), poisoned with 0xFF bytes (a NaN in f32, f16 and bf16, a NaN scale in every block type) before an op
//     runs, so an op that leaves part of its output unwritten fails the comparison;
//   - random inputs (never zeros) and the comparison helpers.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/registry.h"
#include "quant/reference.h"
#include "util/fp16.h"
#include "common/mmf_model.h"

namespace kiln::test {

inline constexpr const char* kCpuRefId = "cpu-ref";

// The backend ids under test, in registry order, "cpu-ref" right after "cpu".
inline std::vector<std::string> backend_ids() {
  std::vector<std::string> ids;
  auto devs = list_devices();
  if (devs) {
    for (const DeviceInfo& d : *devs) ids.push_back(d.id);
  }
  // A factory without a listed device (no GPU, or a listing error) still gets "<kind>:0": skipped in SetUp.
  for (const BackendFactory* f : backend_factories()) {
    const std::string kind = f->kind;
    bool listed = false;
    for (const std::string& id : ids) listed = listed || id.rfind(kind, 0) == 0;
    if (!listed) ids.push_back(kind == "cpu" ? kind : kind + ":0");
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == "cpu") {
      ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, kCpuRefId);
      break;
    }
  return ids;
}

// "cpu", "cpu_ref", "cuda_0".
inline std::string backend_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// A new backend instance for id (each call: its own memory / threads). The fast CPU backend runs 4 threads: more
// than one (the threaded paths and uneven row splits run) and the same on every machine.
inline Result<std::unique_ptr<Backend>> create_test_backend(const std::string& id) {
  if (id == kCpuRefId) return create_backend("cpu", BackendOptions{1, true});
  if (id == "cpu") return create_backend("cpu", BackendOptions{4, false});
  return create_backend(id, BackendOptions{});
}

// One instance per id for the whole binary (a backend is created once, as the engine does).
inline Backend* shared_backend(const std::string& id, Status* why) {
  static std::map<std::string, std::unique_ptr<Backend>> cache;
  static std::map<std::string, Status> failed;
  if (auto it = cache.find(id); it != cache.end()) return it->second.get();
  if (auto it = failed.find(id); it != failed.end()) {
    *why = it->second;
    return nullptr;
  }
  auto r = create_test_backend(id);
  if (!r) {
    failed[id] = r.status();
    *why = r.status();
    return nullptr;
  }
  return (cache[id] = std::move(r).value()).get();
}

// Throws (GoogleTest reports the exception as a failure of the test) when an op that must succeed fails.
// The first GPU's backend, or null where this build or machine has none (the CUDA-only tests skip then).
inline std::unique_ptr<Backend> make_cuda0() {
  auto d = list_devices();
  if (!d) return nullptr;
  for (const DeviceInfo& x : *d)
    if (x.id == "cuda:0") {
      auto b = create_backend("cuda:0", BackendOptions{});
      EXPECT_TRUE(b.is_ok()) << b.status().to_string();
      return b ? std::move(b).value() : nullptr;
    }
  return nullptr;
}

// In a CUDA-only test: `gpu` is cuda:0's backend, or the test skips visibly.
#define KILN_NEED_GPU()                                                       \
  auto kiln_gpu_ = ::kiln::test::make_cuda0();                                \
  if (!kiln_gpu_) GTEST_SKIP() << "skipped: no CUDA device (cuda:0) here";   \
  ::kiln::Backend& gpu = *kiln_gpu_;

// Random weight bytes of type t, `rows` rows of n_in, with sane scales (the f16 scale fields set to small positive
// values, MXFP4's E8M0 exponents to 2^-10..2^-4; float types uniform in [-1, 1)).
inline std::vector<uint8_t> random_weights(DType t, int64_t n_in, int64_t rows, std::mt19937& rng) {
  const size_t rb = dtype_row_bytes(t, n_in).value();
  std::vector<uint8_t> w(rb * rows);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
    for (int64_t i = 0; i < n_in * rows; ++i) {
      const float v = u(rng);
      if (t == DType::F32) std::memcpy(&w[4 * i], &v, 4);
      else {
        const uint16_t h = t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
        std::memcpy(&w[2 * i], &h, 2);
      }
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const int64_t bs = dtype_type_size(t), nb = static_cast<int64_t>(w.size()) / bs;
  std::uniform_real_distribution<float> sd(0.001f, 0.02f);
  auto put = [&](int64_t blk, int off) {
    const uint16_t h = f32_to_fp16(sd(rng));
    std::memcpy(&w[blk * bs + off], &h, 2);
  };
  for (int64_t b = 0; b < nb; ++b) {
    switch (t) {
      case DType::Q4_1: case DType::Q5_1: put(b, 0); put(b, 2); break;
      case DType::Q4_K: case DType::Q5_K: put(b, 0); put(b, 2); break;
      case DType::Q2_K: put(b, 80); put(b, 82); break;
      case DType::Q3_K: put(b, 108); break;
      case DType::Q6_K: put(b, 208); break;
      case DType::MXFP4: w[b * bs] = static_cast<uint8_t>(117 + rng() % 7); break;
      case DType::TQ1_0: put(b, 52); break;
      case DType::TQ2_0: put(b, 64); break;
      case DType::IQ1_M: {  // d: the top nibbles of the four scale words (bytes 48..55), bits 4k..4k+3 in word k
        const uint16_t h = f32_to_fp16(sd(rng));
        for (int k = 0; k < 4; ++k) {
          uint16_t v;
          std::memcpy(&v, &w[b * bs + 48 + 2 * k], 2);
          v = static_cast<uint16_t>((v & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
          std::memcpy(&w[b * bs + 48 + 2 * k], &v, 2);
        }
        break;
      }
      default: put(b, 0); break;  // Q4_0 Q5_0 Q8_0 IQ4_NL IQ4_XS, the other i-quant grid types
    }
  }
  return w;
}

inline void must(const Status& st, const std::string& what) {
  if (!st.is_ok()) throw std::runtime_error(what + ": " + st.to_string());
}

// A tensor in backend memory with the allocation it views. Rows (all outer dims flattened) are row_stride bytes
// apart: row_bytes() for a contiguous tensor, more for a strided view (the gap bytes stay poison).
struct DevTensor {
  std::unique_ptr<Buffer> buf;
  Tensor t;
  size_t bytes = 0;  // the allocation
  Tensor whole() const { return Tensor::make(DType::I8, buf->data(), buf->backend(), static_cast<int64_t>(bytes)); }
};

inline void poison(Backend& be, const DevTensor& d) {
  const std::vector<uint8_t> ff(d.bytes, 0xFF);
  must(be.write(d.whole(), 0, ff.data(), ff.size()), "write poison");
}

// Allocates (poisoned) a [ne0, ne1, ne2] tensor of type t; row_pad adds bytes after every row (rows_uniform view).
inline DevTensor dev_alloc(Backend& be, DType t, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, size_t row_pad = 0) {
  DevTensor d;
  Tensor x = Tensor::make(t, nullptr, &be, ne0, ne1, ne2);
  const size_t stride = x.row_bytes() + row_pad;
  d.bytes = stride * static_cast<size_t>(ne1 * ne2);
  auto buf = be.alloc(d.bytes == 0 ? 1 : d.bytes);
  must(buf.status(), "alloc");
  d.buf = std::move(buf).value();
  x.data = d.buf->data();
  x.nb[1] = stride;
  x.nb[2] = stride * static_cast<size_t>(ne1);
  x.nb[3] = x.nb[2] * static_cast<size_t>(ne2);
  d.t = x;
  if (d.bytes) poison(be, d);
  return d;
}

// Packed host rows -> the tensor's rows (strided or not).
inline void dev_write(Backend& be, const DevTensor& d, const void* host) {
  const size_t rb = d.t.row_bytes();
  const int64_t n = d.t.n_rows();
  if (d.t.nb[1] == rb) {
    must(be.write(d.t, 0, host, rb * static_cast<size_t>(n)), "write");
    return;
  }
  for (int64_t r = 0; r < n; ++r)
    must(be.write(d.t, static_cast<size_t>(r) * d.t.nb[1], static_cast<const uint8_t*>(host) + r * rb, rb), "write");
}

// The tensor's rows, packed.
inline std::vector<uint8_t> dev_read_bytes(Backend& be, const DevTensor& d) {
  const size_t rb = d.t.row_bytes();
  const int64_t n = d.t.n_rows();
  std::vector<uint8_t> out(rb * static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r)
    must(be.read(d.t, static_cast<size_t>(r) * d.t.nb[1], out.data() + r * rb, rb), "read");
  return out;
}
inline std::vector<uint8_t> dev_read_whole(Backend& be, const DevTensor& d) {
  std::vector<uint8_t> out(d.bytes);
  must(be.read(d.whole(), 0, out.data(), out.size()), "read");
  return out;
}
template <class T>
std::vector<T> dev_read(Backend& be, const DevTensor& d) {
  const std::vector<uint8_t> b = dev_read_bytes(be, d);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

template <class T>
DevTensor dev_upload(Backend& be, DType t, const std::vector<T>& host, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                     size_t row_pad = 0) {
  DevTensor d = dev_alloc(be, t, ne0, ne1, ne2, row_pad);
  if (d.t.row_bytes() * static_cast<size_t>(d.t.n_rows()) != host.size() * sizeof(T))
    throw std::runtime_error("dev_upload: host size does not match " + d.t.shape_string());
  dev_write(be, d, host.data());
  return d;
}
inline DevTensor dev_f32(Backend& be, const std::vector<float>& v, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                         size_t row_pad = 0) {
  return dev_upload(be, DType::F32, v, ne0, ne1, ne2, row_pad);
}
inline DevTensor dev_i32(Backend& be, const std::vector<int32_t>& v) {
  return dev_upload(be, DType::I32, v, static_cast<int64_t>(v.size()));
}

// Gaussian values (never exactly zero: a zero would hide an op that writes nothing into a zeroed buffer).
inline std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) {
    do x = dist(rng);
    while (x == 0.0f);
  }
  return v;
}

// n rows of d values quantized to t with the block format's spec quantizer (quant/reference.h).
inline std::vector<uint8_t> quantize_rows(DType t, const std::vector<float>& x, int64_t d) {
  const size_t rb = static_cast<size_t>(dtype_row_bytes(t, d).value());
  const int64_t n = static_cast<int64_t>(x.size()) / d;
  std::vector<uint8_t> q(rb * static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) must(quantize_row(t, x.data() + r * d, q.data() + r * rb, d), "quantize_row");
  return q;
}
// Rows for a weight type: quantize_rows where kiln quantizes `t`; for the i-quant grid types, which it only
// decodes, random bytes (every index, sign and scale bit pattern) with an f16 d of about sigma(x) / 64 and a random
// sign per block (IQ1_M: d in its scale words' top nibbles), seeded by the first value of x.
inline std::vector<uint8_t> weight_rows(DType t, const std::vector<float>& x, int64_t d) {
  if (can_quantize(t)) return quantize_rows(t, x, d);
  const size_t rb = static_cast<size_t>(dtype_row_bytes(t, d).value());
  const int64_t n = static_cast<int64_t>(x.size()) / d, ts = dtype_type_size(t);
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const float sigma = static_cast<float>(std::sqrt(ss / static_cast<double>(x.size())));
  uint32_t seed;
  std::memcpy(&seed, x.data(), 4);
  std::mt19937 rng(seed);
  std::vector<uint8_t> q(rb * static_cast<size_t>(n));
  for (auto& b : q) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < q.size() / static_cast<size_t>(ts); ++b) {
    uint8_t* blk = q.data() + b * static_cast<size_t>(ts);
    const uint16_t h = f32_to_fp16((rng() & 1 ? 1.f : -1.f) * sigma / 64.f * (1.f + static_cast<float>(rng() % 8) / 8));
    if (t == DType::IQ1_M) {
      for (int k = 0; k < 4; ++k) {  // scale word k (bytes 48 + 2k) top nibble = bits 4k..4k+3 of d
        uint16_t w;
        std::memcpy(&w, blk + 48 + 2 * k, 2);
        w = static_cast<uint16_t>((w & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
        std::memcpy(blk + 48 + 2 * k, &w, 2);
      }
    } else {
      std::memcpy(blk, &h, 2);
    }
  }
  return q;
}
// ... and back (the spec dequantizer).
inline std::vector<float> dequantize_rows(DType t, const std::vector<uint8_t>& q, int64_t d) {
  const size_t rb = static_cast<size_t>(dtype_row_bytes(t, d).value());
  const int64_t n = static_cast<int64_t>(q.size() / rb);
  std::vector<float> x(static_cast<size_t>(d * n));
  for (int64_t r = 0; r < n; ++r) must(dequantize_row(t, q.data() + r * rb, x.data() + r * d, d), "dequantize_row");
  return x;
}

// sum((a - ref)^2) / sum(ref^2).
inline double nmse_d(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = static_cast<double>(a[i]) - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

inline constexpr double kU = 1.0 / 16777216.0;  // 2^-24: f32 unit roundoff

// The fixture: GetParam() is a backend id. SetUp skips (visibly, with the reason) a device this machine does not
// list (a CUDA build without a GPU, or a failing GPU listing) or whose backend this build cannot create yet
// (kUnsupported), and fails when the CPU backend or a listed device's backend cannot be created otherwise.
class BackendOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& id = GetParam();
    if (id.rfind("cpu", 0) != 0) {
      auto devs = list_devices();
      if (!devs) GTEST_SKIP() << "skipped: " << id << ": the device listing failed: " << devs.status().to_string();
      bool present = false;
      for (const DeviceInfo& d : *devs) present = present || d.id == id;
      if (!present) GTEST_SKIP() << "skipped: " << id << ": no such device on this machine (this build has the backend)";
    }
    Status why;
    be_ = shared_backend(id, &why);
    if (be_) return;
    if (id.rfind("cpu", 0) == 0 || why.code() != ErrorCode::kUnsupported)
      FAIL() << id << ": cannot create the backend: " << why.to_string();
    GTEST_SKIP() << "skipped: " << id << ": this build cannot create the backend yet: " << why.to_string();
  }
  Backend& be() { return *be_; }
  bool is_cpu() const { return GetParam() == "cpu" || GetParam() == kCpuRefId; }

  Backend* be_ = nullptr;
};

}  // namespace kiln::test

#define KILN_INSTANTIATE_BACKENDS(suite) \
  INSTANTIATE_TEST_SUITE_P(Backends, suite, ::testing::ValuesIn(::kiln::test::backend_ids()), \
                           ::kiln::test::backend_test_name)

// ASSERT that a Status is ok, printing it otherwise.
#define KILN_ASSERT_OK(expr)                                                        \
  do {                                                                              \
    const ::kiln::Status _st = (expr);                                              \
    ASSERT_TRUE(_st.is_ok()) << #expr << " -> " << _st.to_string();                 \
  } while (0)
